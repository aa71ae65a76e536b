"""Bidirectional controls in captured text: shown, never obeyed.

The embedding, override and isolate controls (U+202A-U+202E, U+2066-U+2069) reorder what
follows them on screen: in captured text they can make a tool call's arguments read as
something else (the "Trojan Source" trick). Every value a template prints shows each as
a mark, `⟨U+202E⟩` (`shown`, the templates' finalize hook), but for values that must stay
as they are because they go back to tooltap: a form's values (`exact`).
"""

from __future__ import annotations

import re

from markupsafe import Markup

CONTROLS = re.compile("[\u202a-\u202e\u2066-\u2069]")


class Exact(str):
    """A value printed as it is (escaped, not marked): what a form sends back."""


def exact(value):
    return Exact(value) if isinstance(value, str) else value


def shown(value):
    if isinstance(value, Exact) or not isinstance(value, str) or not CONTROLS.search(value):
        return value
    marked = CONTROLS.sub(lambda m: f"⟨U+{ord(m[0]):04X}⟩", value)
    return Markup(marked) if isinstance(value, Markup) else marked  # the mark holds nothing to escape


def escaped_in_json(text: str) -> str:
    """JSON text with each control written as its `\\u` escape: the same JSON, nothing to mark."""
    return CONTROLS.sub(lambda m: f"\\u{ord(m[0]):04x}", text)
