"""A deterministic upstream: recorded exchanges served back to whoever asks again.

`CassetteUpstream` is an ASGI app. Each request is answered with the recorded
interaction whose method, path and canonical JSON body match it; identical requests
(retries) get their recorded answers in recorded order, the last one repeated after that
(a test replaying one turn of such a pair names it with `X-Tooltap-Interaction: N`).
The answer is the recorded status, headers and exact bytes, chunk by chunk at the
recorded gaps divided by `speed` (1: as recorded, N: N times faster, 0: no waiting).

A request nothing matches is never answered with something plausible: it gets a 404
whose JSON error names the closest recorded request and how the bodies differ, and it is
kept in `.misses` so a test can fail loudly even when the client swallowed the error.

What "the same body" means can be loosened with ignore rules (see `IgnoreRules`):
volatile parts such as the clock Cline writes into every `<environment_details>`.
"""

from __future__ import annotations

import asyncio
import json
import logging
import re
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any, Iterable, Iterator
from urllib.parse import parse_qsl, urlencode

import orjson

from ..asgi import read_body
from ..secrets import SECRET_HEADERS
from .compare import ABSENT, describe, value_diff

# Headers that described the recorded connection or encoding, not the content.
_NOT_REPLAYED = frozenset({
    "connection", "keep-alive", "proxy-connection", "proxy-authenticate", "te", "trailer", "trailers",
    "transfer-encoding", "upgrade", "content-length", "content-encoding",
}) | SECRET_HEADERS
# Query parameters that carry keys (Gemini's `?key=`): stored as fingerprints, sent in clear.
_KEY_PARAMS = frozenset({"key", "api_key", "api-key", "apikey", "access_token", "token"})
MISS_STATUS = 404
WANTED_HEADER = b"x-tooltap-interaction"  # a test naming which of identical recorded requests it replays
IGNORED = "<ignored>"
# What differs in Cline's requests from one run of the same task to the next: the clock
# and the context-window gauge in every <environment_details>.
CLINE_VOLATILE = (r"re:# Current Time\n.*", r"re:# Context Window Usage\n.*")


# -- what is recorded ----------------------------------------------------------------------

@dataclass
class Interaction:
    """One recorded exchange: the request as sent, the answer as it arrived."""

    method: str
    path: str  # query included
    request: Any  # the body: parsed JSON, or text
    status: int
    headers: list[tuple[str, str]]  # response headers to send back
    chunks: list[tuple[float, bytes]]  # [(ms since the request, bytes)], decoded
    request_headers: list[tuple[str, str]] = field(default_factory=list)  # credentials dropped
    turn_id: int | None = None
    api: str | None = None
    cut_short: bool = False  # the upstream dropped the connection after these bytes

    @property
    def body(self) -> bytes:
        return b"".join(c for _, c in self.chunks)

    @property
    def label(self) -> str:
        turn = f" (turn #{self.turn_id})" if self.turn_id is not None else ""  # the stored turn's id
        return f"{self.method} {self.path}{turn}"

    @classmethod
    def from_turn(cls, turn) -> "Interaction":
        """From a `recording.RecordedTurn`. A compressed recording is decoded chunk by chunk
        (so the timing survives) and served without its Content-Encoding."""
        chunks = decoded_chunks(turn.chunks(), turn.content_encoding)
        headers = replayable_headers(turn.response_headers)
        if turn.content_type and not any(k.lower() == "content-type" for k, _ in headers):
            headers.append(("content-type", turn.content_type))
        return cls(method=turn.method, path=turn.path, request=turn.request,
                   status=turn.http_status or 502, headers=headers, chunks=chunks,
                   request_headers=sendable_headers(turn.request_headers), turn_id=turn.id, api=turn.api,
                   cut_short=turn.status == "upstream_aborted")


def replayable_headers(headers: Iterable) -> list[tuple[str, str]]:
    return [(str(k), str(v)) for k, v in headers if str(k).lower() not in _NOT_REPLAYED]


def sendable_headers(headers: Iterable) -> list[tuple[str, str]]:
    """Request headers worth sending again: no credentials, nothing about the connection."""
    skip = _NOT_REPLAYED | {"host", "accept-encoding", "x-tooltap-session"}
    return [(str(k), str(v)) for k, v in headers if str(k).lower() not in skip]


def decoded_chunks(chunks: list[tuple[float, bytes]], encoding: str | None) -> list[tuple[float, bytes]]:
    if not encoding or encoding == "identity":
        return list(chunks)
    from ..capture import Decompressor, decompress

    try:
        d = Decompressor(encoding)
        return [(ms, out) for ms, data in chunks if (out := d(data))]
    except Exception:  # a stream cut mid-frame: decode what there is, as one piece
        whole = b"".join(c for _, c in chunks)
        try:
            return [(chunks[0][0], decompress(whole, encoding))]
        except Exception:
            return [(chunks[0][0], whole)] if chunks else []


# -- what "the same request" means -------------------------------------------------------------

_SEGMENT = re.compile(r"""\.(\*|[A-Za-z_][\w-]*)|\[(\*|\d+)\]|\[("(?:[^"\\]|\\.)*"|'[^']*')\]""")


class IgnoreRules:
    """Parts of a request body left out when matching. Three forms:

    - a JSON path from the body's root: `$.metadata`, `$.messages[*].content`,
      `$.messages[0]`, `$["odd key"]`; `*` matches every key or element. A matching object
      key is removed, a matching array element becomes "<ignored>" (indexes stay put);
    - a bare key name, removed at any depth: `user`, `timestamp`;
    - `re:` and a regular expression, blanked inside every string: `re:# Current Time\\n.*`
      (the clock line of Cline's environment_details).
    """

    def __init__(self, specs: Iterable[str] = ()) -> None:
        self.specs = tuple(specs)
        self.paths: list[list[str | int]] = []
        self.keys: set[str] = set()
        self.patterns: list[re.Pattern] = []
        for spec in self.specs:
            if spec.startswith("re:"):
                try:
                    self.patterns.append(re.compile(spec[3:]))
                except re.error as exc:
                    raise ValueError(f"ignore {spec!r}: not a regular expression ({exc})") from exc
            elif spec.startswith("$"):
                self.paths.append(parse_path(spec))
            elif spec:
                self.keys.add(spec)

    def __bool__(self) -> bool:
        return bool(self.specs)

    def apply(self, value: Any) -> Any:
        """A copy of `value` with the ignored parts gone (`value` itself when nothing is
        ignored: the bodies of a long session are megabytes to copy for nothing)."""
        if not self.specs:
            return value
        value = self._walk(value)
        for path in self.paths:
            value = _drop(value, path)
        return value

    def _walk(self, value: Any) -> Any:
        if isinstance(value, dict):
            return {k: self._walk(v) for k, v in value.items() if k not in self.keys}
        if isinstance(value, list):
            return [self._walk(v) for v in value]
        if isinstance(value, str):
            for p in self.patterns:
                value = p.sub(IGNORED, value)
        return value


def parse_path(spec: str) -> list[str | int]:
    """`$.a[*].b["c d"]` -> ["a", "*", "b", "c d"]; integers for indexes."""
    out: list[str | int] = []
    pos = 1
    while pos < len(spec):
        m = _SEGMENT.match(spec, pos)
        if not m:
            raise ValueError(f"ignore {spec!r}: cannot read the path at {spec[pos:]!r} "
                             "(use $.key, $[0], $[*], $.*, $[\"key\"])")
        name, index, quoted = m.groups()
        if name is not None:
            out.append(name)
        elif index is not None:
            out.append("*" if index == "*" else int(index))
        else:
            out.append(json.loads(quoted) if quoted.startswith('"') else quoted[1:-1])
        pos = m.end()
    return out


def _drop(value: Any, path: list[str | int]) -> Any:
    if not path:
        return value
    head, rest = path[0], path[1:]
    if isinstance(value, dict):
        out = dict(value)
        for k in list(out) if head == "*" else [head]:
            if k in out:
                if rest:
                    out[k] = _drop(out[k], rest)
                else:
                    del out[k]
        return out
    if isinstance(value, list):
        out = list(value)
        for i in range(len(out)) if head == "*" else [head] if isinstance(head, int) else []:
            if i < len(out):
                out[i] = _drop(out[i], rest) if rest else IGNORED
        return out
    return value


def parse_body(body: bytes) -> Any:
    """A request body as JSON when it is JSON, else as text."""
    if not body:
        return ""
    try:
        return json.loads(body)
    except ValueError:
        return body.decode("utf-8", "replace")


def as_received(recorded: Any) -> Any:
    """A recorded body as `parse_body` reads the same bytes sent again: no body is "", and
    a body stored as text (not JSON to the store: NaN, say) is parsed as it will be."""
    if recorded is None:
        return ""
    if isinstance(recorded, str):
        return parse_body(recorded.encode("utf-8", "surrogateescape"))
    return recorded


def canonical(value: Any) -> str:
    """One text per JSON value: keys sorted, 1.0 written as 1 (booleans stay booleans).
    Only ever compared with another canonical(): orjson writes it, 5-10x the stdlib."""
    value = _numbers(value)
    try:
        return orjson.dumps(value, option=orjson.OPT_SORT_KEYS).decode()
    except TypeError:  # integers beyond 64 bits: the stdlib writes them exactly
        return json.dumps(value, sort_keys=True, ensure_ascii=False, separators=(",", ":"))


def _numbers(value: Any) -> Any:
    if isinstance(value, float) and value.is_integer():
        return int(value)
    if isinstance(value, dict):
        return {k: _numbers(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_numbers(v) for v in value]
    return value


def canonical_path(path: str) -> str:
    """The path with key parameters dropped (recorded as fingerprints, sent in clear)
    and the rest of the query sorted."""
    base, _, query = path.partition("?")
    params = sorted((k, v) for k, v in parse_qsl(query, keep_blank_values=True) if k.lower() not in _KEY_PARAMS)
    return base + ("?" + urlencode(params) if params else "")


# -- misses ----------------------------------------------------------------------------------

@dataclass
class Miss:
    """A request no recorded interaction matched, and the nearest one that did not."""

    method: str
    path: str
    request: Any
    closest: int | None  # index into the upstream's interactions
    closest_label: str | None
    diff: list[tuple[str, Any, Any]]  # (JSON path, recorded, received) after the ignore rules

    def explain(self, limit: int = 8) -> str:
        lines = [f"tooltap cassette: no recorded request matches {self.method} {self.path}"]
        if self.closest is None:
            lines.append("  the cassette holds no requests")
            return "\n".join(lines)
        lines.append(f"  closest recorded request: interactions[{self.closest}], {self.closest_label}")
        if not self.diff:
            lines.append("  its body is the same: the method or path differs")
        for path, recorded, received in self.diff[:limit]:
            lines.append(f"  {path}: {describe(recorded, received, side='received')}")
        if len(self.diff) > limit:
            lines.append(f"  ... and {len(self.diff) - limit} more differences")
        return "\n".join(lines)

    def to_json(self) -> dict:
        return {"type": "tooltap_cassette_miss", "message": self.explain(),
                "closest": None if self.closest is None else {"index": self.closest, "request": self.closest_label},
                "diff": [{"path": p, "recorded": _plain(a), "received": _plain(b)} for p, a, b in self.diff[:50]]}


def _plain(value: Any) -> Any:
    return None if value is ABSENT else value


# -- the app ---------------------------------------------------------------------------------

class RecordedDrop(Exception):
    """Raised inside the app so the server cuts the connection, as the recording's did."""


class _QuietRecordedDrops(logging.Filter):
    """A recorded drop is replayed on purpose; uvicorn would log it as a traceback."""

    def filter(self, record: logging.LogRecord) -> bool:
        return not (record.exc_info and isinstance(record.exc_info[1], RecordedDrop))


logging.getLogger("uvicorn.error").addFilter(_QuietRecordedDrops())


class CassetteUpstream:
    """Serve `interactions` to whoever asks: see the module docstring."""

    def __init__(self, interactions: Iterable[Interaction], *, speed: float = 0.0, ignore: Iterable[str] = ()) -> None:
        if speed < 0:
            raise ValueError("speed must be 0 (no waiting) or more")
        self.interactions = list(interactions)
        self.speed = speed
        self.ignore = ignore if isinstance(ignore, IgnoreRules) else IgnoreRules(ignore)
        self.misses: list[Miss] = []
        self.served: list[int] = []  # the interaction answered, per matched request, in order
        self._bodies = [self.ignore.apply(as_received(i.request)) for i in self.interactions]
        self._by_key: dict[tuple, list[int]] = {}
        for n, (i, body) in enumerate(zip(self.interactions, self._bodies)):
            self._by_key.setdefault(self._key(i.method, i.path, body), []).append(n)
        self._answered: dict[tuple, int] = {}

    def _key(self, method: str, path: str, stripped: Any) -> tuple:
        return method.upper(), canonical_path(path), canonical(stripped)

    def match(self, method: str, path: str, request: Any, wanted: int | None = None) -> int | Miss:
        """The interaction that answers this request (an index), or the miss. `wanted`
        picks one of several identical recorded requests (a test replaying one turn of
        a retried pair); it never makes a request match that would not."""
        stripped = self.ignore.apply(request)
        key = self._key(method, path, stripped)
        found = self._by_key.get(key)
        if found:
            n = self._answered.get(key, 0)
            self._answered[key] = n + 1
            index = wanted if wanted in found else found[min(n, len(found) - 1)]
            self.served.append(index)
            return index
        miss = self._closest(method, path, request, stripped)
        self.misses.append(miss)
        return miss

    def _closest(self, method: str, path: str, request: Any, stripped: Any) -> Miss:
        best, best_score, best_diff = None, None, []
        place = (method.upper(), canonical_path(path))
        for n, (i, body) in enumerate(zip(self.interactions, self._bodies)):
            diff = value_diff("$", body, stripped)
            score = ((i.method.upper(), canonical_path(i.path)) != place, len(diff))
            if best_score is None or score < best_score:
                best, best_score, best_diff = n, score, diff
        label = self.interactions[best].label if best is not None else None
        return Miss(method, path, request, best, label, best_diff)

    async def __call__(self, scope, receive, send) -> None:
        if scope["type"] == "lifespan":
            while True:
                kind = (await receive())["type"]  # lifespan.startup / lifespan.shutdown
                await send({"type": kind + ".complete"})
                if kind == "lifespan.shutdown":
                    return
        if scope["type"] != "http":
            return
        body, _ = await read_body(receive)
        path = scope.get("raw_path", scope["path"].encode()).decode("latin-1")
        path = path.partition("?")[0]
        if scope.get("query_string"):
            path += "?" + scope["query_string"].decode("latin-1")
        wanted = next((v for k, v in scope["headers"] if k.lower() == WANTED_HEADER), b"")
        found = self.match(scope["method"], path, parse_body(body),
                           int(wanted) if wanted.isdigit() else None)
        if isinstance(found, Miss):
            payload = json.dumps({"error": found.to_json()}, ensure_ascii=False).encode()
            await send({"type": "http.response.start", "status": MISS_STATUS,
                        "headers": [(b"content-type", b"application/json"), (b"x-tooltap-cassette", b"miss")]})
            await send({"type": "http.response.body", "body": payload})
            return
        await self._answer(self.interactions[found], send)

    async def _answer(self, i: Interaction, send) -> None:
        headers = [(k.encode("latin-1"), v.encode("latin-1")) for k, v in i.headers]
        await send({"type": "http.response.start", "status": i.status, "headers": headers})
        last = 0.0
        for ms, data in i.chunks:
            if self.speed and ms > last:
                await asyncio.sleep((ms - last) / 1000 / self.speed)
            last = max(last, ms)
            await send({"type": "http.response.body", "body": data, "more_body": True})
        if i.cut_short:  # end the way the recorded upstream did: the connection drops mid-body
            raise RecordedDrop(i.label)
        await send({"type": "http.response.body", "body": b"", "more_body": False})

    @contextmanager
    def serving(self, host: str = "127.0.0.1") -> Iterator[str]:
        """Serve on a real uvicorn on a free port of `host`, in a thread; yields the base URL."""
        with serving(self, host) as url:
            yield url


@contextmanager
def serving(app, host: str = "127.0.0.1") -> Iterator[str]:
    """Any ASGI app on a real uvicorn on a free port of `host`, in a daemon thread.
    Plain uvicorn, not `demo.Served`: that one now brings tooltap's own server and app
    along, which a test process serving a cassette has no use for."""
    import threading
    import time

    import uvicorn

    from ..demo import free_port

    server = uvicorn.Server(uvicorn.Config(app, host=host, port=free_port(host), log_level="warning",
                                           access_log=False, server_header=False, date_header=False,
                                           timeout_graceful_shutdown=1))
    thread = threading.Thread(target=server.run, daemon=True, name="tooltap-cassette")
    thread.start()
    deadline = time.monotonic() + 15
    while not server.started:
        if time.monotonic() > deadline or not thread.is_alive():
            raise RuntimeError(f"could not serve the cassette on {host}:{server.config.port}")
        time.sleep(0.01)
    try:
        yield f"http://{host}:{server.config.port}"
    finally:
        server.should_exit = True
        thread.join(10)
