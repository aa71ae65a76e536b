"""Content addressing: canonical JSON, hashes, compression."""

from __future__ import annotations

import hashlib
import json
from typing import Any

import orjson  # every message of every request is serialized here: 5-10x the stdlib's speed
# zlib's format, written 2.5-6x faster (SIMD): every blob and raw response is compressed here.
from zlib_ng import zlib_ng


def canonical(obj: Any) -> bytes:
    """One byte string per JSON value, whatever its key order or spacing."""
    try:
        return orjson.dumps(obj, option=orjson.OPT_SORT_KEYS)
    except TypeError:  # integers beyond 64 bits: the stdlib writes them exactly
        return _utf8(json.dumps(obj, sort_keys=True, separators=(",", ":"), ensure_ascii=False))


def compact(obj: Any) -> bytes:
    """How a value is stored: compact, key order kept as sent."""
    try:
        return orjson.dumps(obj)
    except TypeError:
        return _utf8(json.dumps(obj, separators=(",", ":"), ensure_ascii=False))


def _utf8(text: str) -> bytes:
    try:
        return text.encode()
    except UnicodeEncodeError:  # a lone surrogate (a `\ud800` escape in what a model sent)
        return text_safe(text).encode()


def text_safe(text: str) -> str:
    """`text` with every lone surrogate, which no UTF-8 text (nor database) can hold, as
    U+FFFD; the exact bytes, where they matter, are kept elsewhere (the raw response)."""
    try:
        text.encode()
        return text
    except UnicodeEncodeError:
        return text.encode("utf-16", "surrogatepass").decode("utf-16", "replace")


# -- untrusted request bodies -----------------------------------------------------------

MAX_DEPTH = 254  # what orjson writes; a deeper value would also break reading it back


class _NotStrict(ValueError):
    pass


def _finite(text: str) -> float:
    value = float(text)
    if value in (float("inf"), float("-inf")):
        raise _NotStrict(f"holds the number {text[:20]}, too large for a double")
    return value


def _no_constant(name: str) -> Any:
    raise _NotStrict(f"holds {name}, which is not JSON")


def parse_strict(data: bytes) -> tuple[Any, str | None]:
    """The JSON value in `data`, or (None, why it cannot be stored as JSON): not UTF-8,
    not JSON, NaN or Infinity, a number beyond a double, nested deeper than MAX_DEPTH,
    a lone surrogate. Such a body is stored as its bytes instead."""
    if not data:
        return None, None
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError:
        return None, "not UTF-8 text"
    try:
        value = json.loads(text, parse_constant=_no_constant, parse_float=_finite)
    except _NotStrict as exc:
        return None, str(exc)
    except RecursionError:
        return None, f"nested deeper than {MAX_DEPTH} levels"
    except ValueError:
        return None, "not valid JSON"
    try:
        orjson.dumps(value)  # fast; fails for what `unstorable` looks for (and big integers)
    except TypeError:
        problem = unstorable(value)
        if problem:
            return None, problem
    return value, None


def unstorable(value: Any) -> str | None:
    """Why a parsed value cannot be stored and served as JSON, or None: nested deeper
    than MAX_DEPTH, NaN or Infinity, a lone surrogate. (Integers beyond 64 bits are fine.)"""
    if nesting(value) > MAX_DEPTH:
        return f"nested deeper than {MAX_DEPTH} levels"
    try:
        json.dumps(value, allow_nan=False, ensure_ascii=False).encode()
    except UnicodeEncodeError:
        return "holds a lone surrogate, which UTF-8 text cannot"
    except ValueError:
        return "holds NaN or Infinity, which are not JSON"
    return None


def nesting(value: Any) -> int:
    """How deep lists and objects nest in `value` (walked without recursion)."""
    deepest, stack = 0, [(value, 1)]
    while stack:
        node, depth = stack.pop()
        children = node.values() if isinstance(node, dict) else node if isinstance(node, list) else None
        if children is None:
            continue
        deepest = max(deepest, depth)
        stack.extend((c, depth + 1) for c in children if isinstance(c, (dict, list)))
    return deepest


def digest(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()[:32]  # 128 bits: collisions are not a concern


def content_hash(obj: Any) -> str:
    return digest(canonical(obj))


def chain(message_hashes: list[str], root: str = "", known: list[str] = ()) -> list[str]:
    """h_i = H(h_{i-1} + m_i), h_0 = root: hash i names the whole prefix up to message i
    (in the conversation space `root` names). `known`: the first hashes, already worked
    out for an earlier request with the same first messages."""
    out = list(known)
    prev = out[-1] if out else root
    for m in message_hashes[len(out):]:
        prev = digest((prev + m).encode())
        out.append(prev)
    return out


def pack(obj: Any) -> bytes:
    return zlib_ng.compress(compact(obj), 6)


def unpack(data: bytes | None) -> Any:
    # The stdlib reads integers beyond 64 bits exactly; orjson would turn them into floats.
    return None if data is None else json.loads(zlib_ng.decompress(data))


def inflate(data: bytes | None) -> bytes:
    return zlib_ng.decompress(data) if data else b""


def compress_chunks(chunks, level: int = 6) -> bytes:
    z = zlib_ng.compressobj(level)
    return b"".join([*(z.compress(c) for c in chunks), z.flush()])
