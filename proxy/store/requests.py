"""Parse a request body that extends a recent one: only what is new.

An agent resends its whole history on every turn, so nearly all of a request's bytes
are the previous request's: a 50-turn Cline task sends 9 MB of JSON to add 300 KB of
messages. `Requests.parse` compares the body's bytes with the requests of the same
conversation (resent.conversation_key) it parsed recently; when one of them, from its
first byte to the end of its last message, starts this one too, that request's message
objects (the very same objects) and their hashes are taken as they are, and only the
rest of the body is decoded and parsed, by the same scanner json.loads uses: the shared
part is compared once, neither decoded nor copied (at 200 turns it is a megabyte, and
each pass over it cost the writer a visible share of a turn). The value is exactly what
`content.parse_strict` returns (a body this path does not understand goes to it whole),
and the decoders, handed the same message objects, can reuse their work too.

A body whose journal frame says "its first N bytes are turn X's" (resent.py) comes as a
`Spliced`, with X's id and N: when X's prefix is remembered and within those N bytes, it
is the base without a comparison (the proxy compared), and only the bytes after it are
joined and decoded.

Memory: the prefixes kept are bounded by `budget` bytes (plus the parsed
messages, shared with the turns in the writer's caches).
"""

from __future__ import annotations

import json
import re
from collections import OrderedDict
from dataclasses import dataclass, field
from typing import Any

import orjson

from . import content
from .resent import Spliced, conversation_key

BUDGET = 24 << 20  # bytes of request bodies remembered
PROBE = 256  # bytes at the end of a remembered prefix compared first
BIG = 1024  # a value after the messages this long is remembered as text and object (tools)

_WS = re.compile(r"[ \t\n\r]*")
_SCAN = json.JSONDecoder(parse_float=content._finite, parse_constant=content._no_constant).scan_once


class _Fallback(Exception):
    pass


@dataclass(eq=False)
class Prefix:
    """A request parsed recently: its body up to the end of its last message, and what
    that part parsed to."""

    raw: memoryview | Spliced  # its body up to the end of its last message (no copy)
    head: str  # its text before the messages array
    messages: list  # the parsed messages
    hashes: list[str | None] = field(default_factory=list)  # per message (None: not hashed alone)
    lead: int = 0  # leading messages hashed together as the system prompt (OpenAI chat)
    system_hash: str | None = None
    root: str = ""  # where its message chain starts (sessions.chain_root)
    chain: list[str] = field(default_factory=list)  # the chain hashes of messages[lead:]
    memo: dict = field(default_factory=dict)  # the decoders' views of its messages (agents/base.py)
    values: dict[str, tuple[str, Any]] = field(default_factory=dict)  # large values after the messages
    hashes_of: dict[str, str] = field(default_factory=dict)  # content hashes of those values
    known_in: int = -1  # the writer's generation of stored hashes its own were known in (ingest.py)
    uid: str = ""  # the turn's
    key: int = 0  # its conversation's (resent.conversation_key): where Requests looks for it

    @property
    def weight(self) -> int:
        """Bytes it keeps alive: its whole body (a spliced one's whole chain)."""
        return self.raw.held if isinstance(self.raw, Spliced) else len(self.raw.obj)


@dataclass
class Parsed:
    value: Any
    problem: str | None = None
    reused: int = 0  # leading messages taken from `base`
    base: Prefix | None = None
    prefix: Prefix | None = None  # this request, for the ones after it (fill in hashes)


class Requests:
    """The recently parsed requests of one writer."""

    def __init__(self, budget: int = BUDGET):
        self.budget = budget
        self._kept: OrderedDict[int, Prefix] = OrderedDict()
        self._by_uid: dict[str, Prefix] = {}
        self._of: dict[int, list[Prefix]] = {}  # by conversation, oldest first
        self._bytes = 0

    def parse(self, body: bytes | Spliced, messages_key: str | None, uid: str = "",
              extends: tuple[str, int] | None = None) -> Parsed:
        """`extends`: (uid, N) when the body's first N bytes are that turn's (the journal's word)."""
        if messages_key is None or not body.startswith(b"{"):
            return Parsed(*content.parse_strict(bytes(body)))
        try:
            parsed = self._parse(body, messages_key, extends)
        except (_Fallback, ValueError, StopIteration, RecursionError, IndexError, UnicodeDecodeError):
            return Parsed(*content.parse_strict(bytes(body)))
        if parsed.prefix is not None:
            parsed.prefix.uid = uid
        return parsed

    def _parse(self, body: bytes | Spliced, key: str, extends: tuple[str, int] | None) -> Parsed:
        # The shared bytes are compared, not decoded: the text parsed is the earlier
        # request's head, its '[' and then only what follows its last message.
        base = self._extended(body, extends)
        if base is not None:
            conversation = base.key
        else:
            body = bytes(body)  # (bytes: no copy; kept views must not change)
            conversation = conversation_key(body)
            base = self._base(body, conversation)
        if base is None:
            text = body.decode("utf-8")
        elif isinstance(body, Spliced):
            text = base.head + "[" + body.slice(len(base.raw)).decode("utf-8")
        else:
            text = base.head + "[" + body[len(base.raw):].decode("utf-8")
        obj: dict[str, Any] = {}
        parsed = Parsed(obj, base=base)
        i = _WS.match(text, 1).end()
        if text[i] == "}":
            raise _Fallback
        while True:
            if text[i] != '"':
                raise _Fallback
            name, i = _SCAN(text, i)
            if name in obj:  # a repeated key: json.loads keeps the last; let it
                raise _Fallback
            i = _WS.match(text, i).end()
            if text[i] != ":":
                raise _Fallback
            i = _WS.match(text, i + 1).end()
            if name == key and text[i] == "[":
                obj[name], i = self._messages(body, text, i, parsed)
            else:
                start = i
                obj[name], i = self._same(text, i, name, parsed) or _SCAN(text, i)
                if i - start >= BIG and parsed.prefix is not None and isinstance(obj[name], (dict, list, str)):
                    parsed.prefix.values[name] = (text[start:i], obj[name])  # the tools, most often
            i = _WS.match(text, i).end()
            c = text[i]
            i += 1
            if c == "}":
                break
            if c != ",":
                raise _Fallback
            i = _WS.match(text, i).end()
        if _WS.match(text, i).end() != len(text) or (base is not None and not parsed.reused):
            raise _Fallback
        self._check(obj, key, parsed)
        if parsed.prefix is not None:
            parsed.prefix.key = conversation
        return parsed

    def _messages(self, body: bytes, text: str, i: int, parsed: Parsed) -> tuple[list, int]:
        base = parsed.base
        if base is not None:
            if i != len(base.head) or parsed.reused:
                raise _Fallback
            messages, end = list(base.messages), i + 1
            parsed.reused = len(messages)
            j = _WS.match(text, end).end()
            more = text[j] == ","
            if not more and text[j] != "]":
                raise _Fallback
            if more:
                j = _WS.match(text, j + 1).end()
        else:
            messages, end = [], 0
            j = _WS.match(text, i + 1).end()
            more = text[j] != "]"
        if more:  # a value must follow '[' or ','
            while True:
                value, j = _SCAN(text, j)
                messages.append(value)
                end = j
                j = _WS.match(text, j).end()
                c = text[j]
                j += 1
                if c == "]":
                    break
                if c != ",":
                    raise _Fallback
                j = _WS.match(text, j).end()
        else:
            j += 1
        if messages and isinstance(messages[-1], (dict, list, str)):  # ends on } ] or ": cannot run on
            cut = _byte_offset(body, text, end, base)
            raw = body.head(cut) if isinstance(body, Spliced) else memoryview(body)[:cut]
            parsed.prefix = Prefix(raw, text[:i], messages)
        return messages, j

    @staticmethod
    def _same(text: str, i: int, name: str, parsed: Parsed) -> tuple[Any, int] | None:
        # (An object, array or string ends where its text ends: the same text is the same value.)
        """A large value after the messages, as the request this one extends had it: the
        same object (the same text, up to its closing bracket)."""
        kept = parsed.base.values.get(name) if parsed.base is not None else None
        if kept is None or not text.startswith(kept[0], i):
            return None
        return kept[1], i + len(kept[0])

    def _extended(self, body: bytes | Spliced, extends: tuple[str, int] | None) -> Prefix | None:
        """The remembered request the journal says this one extends, if all of what was
        parsed of it is within the bytes they share."""
        if not extends:
            return None
        p = self._by_uid.get(extends[0])
        if p is None or len(p.raw) > extends[1] or len(p.raw) >= len(body):
            return None
        return p

    def _base(self, body: bytes, conversation: int) -> Prefix | None:
        """The newest remembered request of the conversation whose body this one starts
        with. (Not every remembered one: with many short conversations, the writer spent
        more on this search than on the rest of the turn.)"""
        for p in reversed(self._of.get(conversation, ())):
            raw, n = p.raw, len(p.raw)
            if len(body) <= n:
                continue
            if isinstance(raw, Spliced):
                if body.startswith(raw.slice(max(0, n - PROBE)), max(0, n - PROBE)) and raw.begins(body):
                    return p
            elif body.startswith(raw[-PROBE:], max(0, n - PROBE)) and body.startswith(raw):
                return p
        return None

    def _check(self, obj: dict, key: str, parsed: Parsed) -> None:
        """What parse_strict checks after json.loads, on the parts parsed here (the reused
        messages passed it in their own request): nesting, lone surrogates, NaN."""
        new = {k: (v[parsed.reused:] if k == key else v) for k, v in obj.items()}
        try:
            orjson.dumps(new)  # nested as in the request; fails for what `unstorable` looks for
        except TypeError:
            problem = content.unstorable(obj)
            if problem:
                parsed.value, parsed.problem, parsed.prefix = None, problem, None

    def keep(self, parsed: Parsed) -> None:
        """Remember a request once its hashes are filled in; it replaces the request it extended."""
        p = parsed.prefix
        if p is None:
            return
        if parsed.base is not None and self._kept.pop(id(parsed.base), None) is not None:
            self._forget(parsed.base)
        self._kept[id(p)] = p
        if p.uid:
            self._by_uid[p.uid] = p
        self._of.setdefault(p.key, []).append(p)
        self._bytes += p.weight
        while self._bytes > self.budget and self._kept:
            _, old = self._kept.popitem(last=False)
            self._forget(old)

    def _forget(self, p: Prefix) -> None:
        self._bytes -= p.weight
        if self._by_uid.get(p.uid) is p:
            del self._by_uid[p.uid]
        same = self._of.get(p.key, [])
        if p in same:
            same.remove(p)
            if not same:
                del self._of[p.key]

    def clear(self) -> None:
        self._kept.clear()
        self._by_uid.clear()
        self._of.clear()
        self._bytes = 0


def _byte_offset(body: bytes, text: str, end: int, base: Prefix | None) -> int:
    """Where `text[:end]` ends in `body` (the text may elide the base's messages)."""
    if base is None:
        return end if len(text) == len(body) else len(text[:end].encode("utf-8"))
    cut = len(base.head) + 1  # in the text, where body[len(base.raw):] begins
    return len(base.raw) + len(text[cut:end].encode("utf-8"))
