"""Reading a stream's repeated events by their shape.

Most events of a stream are the event before them with another piece of text in the
same place (a chat chunk's `content`, an Anthropic `text_delta`, a tool call's next
arguments). Once one such event has been parsed and merged, the ones after it that are
its bytes with another string there are read as that string alone: the rest is not
parsed again. This is the writer's cost per event of nearly every stream.

Sound by construction: a JSON string literal put in place of another is the same
document with another string there. So an event is taken only when each part taken for
a string is exactly one string literal, and a shape only when a probe (the learned
bytes around other literals) parses as the event it was learned from, with the
probe's strings in place.
"""

from __future__ import annotations

import re
from typing import Any, Callable

import orjson


class Shape:
    """An event's bytes around its one piece of text, and around a padding field that
    may change on every event (OpenAI's `obfuscation`)."""

    __slots__ = ("prefix", "middle", "suffix", "pieces", "keeps_empty")

    def __init__(self, prefix: bytes, middle: bytes | None, suffix: bytes, pieces: list[str], keeps_empty: bool):
        self.prefix, self.middle, self.suffix = prefix, middle, suffix
        self.pieces = pieces  # where the text goes, as the assembler would put it
        self.keeps_empty = keeps_empty  # whether "" is a piece (of text) or not (of a call's arguments)

    @classmethod
    def learn(cls, payload: bytes, holder: Callable[[dict], dict], key: str, pieces: list[str],
              keeps_empty: bool, padding: str | None = None) -> Shape | None:
        """The shape of `payload`, an event just merged whose text is `holder(event)[key]`;
        None if its bytes do not show one."""
        parsed = orjson.loads(payload)  # afresh: the assembler may have changed its copy
        pad = None
        if padding is not None and type(parsed.get(padding)) is str:
            pad = _last_literal(payload, padding)
            if pad is None:
                return None
        text = _last_literal(payload, key, end=pad[0] if pad else len(payload))
        if text is None:
            return None
        if pad is None:
            shape = cls(payload[:text[0]], None, payload[text[1]:], pieces, keeps_empty)
        else:
            shape = cls(payload[:text[0]], payload[text[1]:pad[0]], payload[pad[1]:], pieces, keeps_empty)
        holder(parsed)[key] = "\x01"
        probe = shape.prefix + b'"\\u0001"'
        if pad is not None:
            parsed[padding] = "\x02"
            probe += shape.middle + b'"\\u0002"'
        try:
            same = orjson.loads(probe + shape.suffix) == parsed
        except ValueError:
            same = False
        return shape if same else None

    def take(self, payload: bytes) -> bool:
        """Put the text of an event of this shape where it goes; False if it is not one."""
        text = self.piece(payload)
        if text is None:
            return False
        if text or self.keeps_empty:
            self.pieces.append(text)
        return True

    def piece(self, payload: bytes) -> str | None:
        """The text of an event of this shape; None if it is not one."""
        prefix, suffix = self.prefix, self.suffix
        end = len(payload) - len(suffix)
        if end <= len(prefix) or not payload.startswith(prefix) or not payload.endswith(suffix):
            return None
        if self.middle is None:
            literal = payload[len(prefix):end]
        else:
            at = payload.find(self.middle, len(prefix), end)
            if at < 0 or _string(payload[at + len(self.middle):end]) is None:
                return None
            literal = payload[len(prefix):at]
        return _string(literal)


def _string(literal: bytes) -> str | None:
    """The string `literal` is, if it is exactly one JSON string."""
    try:
        value: Any = orjson.loads(literal)
    except ValueError:
        return None
    return value if type(value) is str else None


def _last_literal(payload: bytes, key: str, end: int | None = None) -> tuple[int, int] | None:
    """Where the last `"key": "..."` before `end` has its string literal (quotes included)."""
    found = None
    for m in re.finditer(rb'"' + re.escape(key.encode()) + rb'"\s*:\s*"', payload[:end]):
        start = close = m.end() - 1
        while True:  # the literal ends at the first quote not escaped by a backslash
            close = payload.find(b'"', close + 1)
            if close < 0:
                return found
            escapes = 0
            while payload[close - 1 - escapes] == 0x5C:
                escapes += 1
            if escapes % 2 == 0:
                break
        found = (start, close + 1)
    return found
