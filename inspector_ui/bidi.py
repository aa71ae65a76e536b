"""Bidirectional controls in captured text (proxy/bidi.py): shown, never obeyed.

Every value a template prints shows each as a mark, `⟨U+202E⟩` (`shown`, the templates'
finalize hook; `marked` for the plain-text views), but for values that must stay as they
are because they go back to tooltap: a form's values (`exact`, which writes them as
character references: the form sends the character, and nothing is left to mark, even
when a macro's output passes the hook again).
"""

from __future__ import annotations

from markupsafe import Markup, escape

from proxy.bidi import CONTROLS


def marked(text: str) -> str:
    return CONTROLS.sub(lambda m: f"⟨U+{ord(m[0]):04X}⟩", text)


def shown(value):
    if not isinstance(value, str) or not CONTROLS.search(value):
        return value
    return Markup(marked(value)) if isinstance(value, Markup) else marked(value)  # the mark holds nothing to escape


def exact(value):
    if not isinstance(value, str):
        return value
    return Markup(CONTROLS.sub(lambda m: f"&#x{ord(m[0]):X};", str(escape(value))))
