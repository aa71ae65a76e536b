"""Bidirectional controls in captured text (proxy/bidi.py): shown, never obeyed.

Every value a template prints shows each as a mark, `⟨U+202E⟩` (`shown`, the templates'
finalize hook), but for values that must stay as they are because they go back to
tooltap: a form's values (`exact`).
"""

from __future__ import annotations

from markupsafe import Markup

from proxy.bidi import CONTROLS


class Exact(str):
    """A value printed as it is (escaped, not marked): what a form sends back."""


def exact(value):
    return Exact(value) if isinstance(value, str) else value


def shown(value):
    if isinstance(value, Exact) or not isinstance(value, str) or not CONTROLS.search(value):
        return value
    marked = CONTROLS.sub(lambda m: f"⟨U+{ord(m[0]):04X}⟩", value)
    return Markup(marked) if isinstance(value, Markup) else marked  # the mark holds nothing to escape

