"""Bidirectional controls: the embedding, override and isolate characters (U+202A-U+202E,
U+2066-U+2069) reorder what follows them on screen, so that captured text (a model's tool
arguments, a file's content) can read as something else where it is shown: the "Trojan
Source" trick. What tooltap writes for people to read (replay reports, cassettes meant for
review) gives each as its `\\uXXXX` escape: in JSON the same text, elsewhere a visible one.
The inspector shows them as marks (inspector_ui/bidi.py).
"""

from __future__ import annotations

import re

CONTROLS = re.compile("[\u202a-\u202e\u2066-\u2069]")


def escaped(text: str) -> str:
    return CONTROLS.sub(lambda m: f"\\u{ord(m[0]):04x}", text)


def printable(text: str) -> str:
    """`escaped`, and a lone surrogate (a `\\ud800` a model wrote) as its escape too: no
    UTF-8 output can hold one, and printing it raised."""
    return escaped(text).encode("utf-8", "backslashreplace").decode("utf-8")
