"""The hot path: forward one request upstream and stream the answer back untouched.

A raw ASGI app, so nothing sits between the client's socket and the upstream's but this
file: read the request, send it upstream with its headers as they came (less hop-by-hop
ones and Host), pass every response chunk to the client the moment it arrives, then hand
the capture to the store's queue. No database call, no re-serialization, no buffering
of the response. A request body is read whole before the request goes upstream, unless
it is large: then it follows the request's head part by part as it arrives, and an
agent that gives up halfway leaves the upstream a body short of its length, never one
it could take as whole.
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
import uuid
from typing import Callable
from urllib.parse import unquote, urlsplit

from . import apis
from . import upstream as upstream_client
from .capture import Capture, TurnRecord
from .config import Settings, Upstream
from .live import LiveHub
from .secrets import redact_query, redact_url

log = logging.getLogger("tooltap")

HOP_BY_HOP = frozenset(
    {b"connection", b"keep-alive", b"proxy-connection", b"proxy-authenticate", b"proxy-authorization",
     b"te", b"trailer", b"trailers", b"transfer-encoding", b"upgrade",
     b"expect"}  # 100-continue is between the agent and us
)
SESSION_HEADER = b"x-tooltap-session"
TURN_HEADER = b"x-tooltap-turn"  # serve --turn-header: the uid that finds the turn in the API

Headers = list[tuple[bytes, bytes]]


class StreamCut(Exception):
    """Raised after the response has started, so the server drops the client connection
    and the client sees an abrupt end. The turn is recorded; it is not a crash to log."""


class UpstreamAborted(StreamCut):
    """The upstream dropped its stream: the client gets the same abrupt end."""


class ShutDown(StreamCut):
    """tooltap is stopping and the stream did not end within the shutdown grace."""


SHUT_DOWN = "tooltap shut down"
SHUT_DOWN_EARLY = "tooltap shut down before the request arrived"
STREAM_BODY_BYTES = 256 << 10  # a request body this large goes upstream as it arrives


def _strip(headers: Headers, also: frozenset[bytes] = frozenset()) -> Headers:
    """Headers as bytes, exactly as they came, less hop-by-hop ones (and those that
    `Connection` names)."""
    named = {n.strip().lower() for k, v in headers if k.lower() == b"connection" for n in v.split(b",")}
    drop = HOP_BY_HOP | named | also
    return [(k, v) for k, v in headers if k.lower() not in drop]


def sendable(status: int, headers: Headers, upstream: Upstream, base: str) -> Headers:
    """The upstream's headers as the client gets them (the turn stores them as sent)."""
    if status in (204, 304):
        # A 304's Content-Length is its representation's, with no body: the server would
        # wait for that many bytes and fail the answer.
        return [(k, v) for k, v in headers if k.lower() != b"content-length"]
    if 300 <= status < 400:
        return [(k, _through(v, upstream, base) if k.lower() == b"location" else v) for k, v in headers]
    return headers


def _through(location: bytes, upstream: Upstream, base: str) -> bytes:
    """A redirect to elsewhere in the upstream, as the address of that place through
    tooltap (nginx's `proxy_redirect default`). Followed as sent it would leave tooltap
    (the turn unrecorded), or, from an upstream under a prefix, reach another upstream
    with this one's key. A redirect anywhere else stays as it is."""
    loc = location.decode("latin-1")
    if _under(loc, upstream.url):
        rest = loc[len(upstream.url):]
    elif loc.startswith("/") and not loc.startswith("//") and _under(loc, base):  # a path, not //host
        rest = loc[len(base):]
    else:
        return location
    there = upstream.prefix + rest  # `rest` is "", or starts with / or ? (_under)
    return (there if there.startswith("/") else "/" + there).encode("latin-1")


def _under(loc: str, root: str) -> bool:
    return loc.startswith(root) and loc[len(root):][:1] in ("", "/", "?")


def _text(headers: Headers) -> list[tuple[str, str]]:
    return [(k.decode("latin-1"), _decode(v)) for k, v in headers]


def _decode(value: bytes) -> str:
    # As recorded: UTF-8 where it is (the wire gets the bytes as they came either way);
    # other bytes (vanishingly rare) are read as latin-1.
    try:
        return value.decode("utf-8")
    except UnicodeDecodeError:
        return value.decode("latin-1")


def make_client(settings: Settings) -> upstream_client.Client:
    """The pooled upstream client (proxy/upstream.py)."""
    return upstream_client.Client(connect_timeout=settings.connect_timeout, read_timeout=settings.read_timeout)


_UPSTREAM_ERRORS = (upstream_client.UpstreamError, OSError)  # (TimeoutError is an OSError)


class Forwarder:
    def __init__(self, settings: Settings, client: upstream_client.Client, sink: Callable[[TurnRecord], None],
                 live: LiveHub | None = None):
        self.settings = settings
        self.client = client
        self.sink = sink  # must not block: the store's queue.put_nowait
        self.live = live
        self.in_flight = 0  # requests between arrival and their turn being queued for the store
        self._origins: dict[str, tuple[upstream_client.Origin, str]] = {}

    def _origin(self, url: str) -> tuple[upstream_client.Origin, str]:
        """The upstream's origin and base path, parsed once."""
        found = self._origins.get(url)
        if found is None:
            found = self._origins[url] = (upstream_client.Origin.of(url), urlsplit(url).path)
        return found

    async def __call__(self, scope, receive, send) -> None:
        self.in_flight += 1
        try:
            await self._forward(scope, receive, send)
        finally:
            self.in_flight -= 1

    async def _forward(self, scope, receive, send) -> None:
        # The path as the agent encoded it (scope["path"] is percent-decoded): routed on and
        # cut in that one form, so `/%63laude/...` or `/claude%2F...` are never cut wrong.
        raw_path = (scope.get("raw_path") or scope["path"].encode()).decode("latin-1")
        route = self.settings.resolve(raw_path)
        if route is None:
            served = ", ".join(f"{up.prefix}/..." for up in self.settings.upstreams)
            await _send_json(send, 404, {"error": {"type": "tooltap_no_upstream", "message": (
                f"no upstream serves {raw_path}; this tooltap serves {served}: "
                "end the client's base URL with one of those prefixes")}})
            return
        upstream, upstream_path = route
        started_at = time.time()
        body = _RequestBody(receive, scope)
        streamed = await body.read() and raw_path.startswith("/") and body.worth_streaming()
        if not streamed:
            await body.read_all()

        session_hint = next((_decode(v) for k, v in scope["headers"] if k.lower() == SESSION_HEADER), None)
        wire_headers = _strip(scope["headers"], frozenset({b"host", SESSION_HEADER}))
        headers = _text(wire_headers)
        query = scope.get("query_string", b"").decode("latin-1")
        method = scope["method"]
        api = apis.detect(method, unquote(upstream_path) if "%" in upstream_path else upstream_path)
        capture = Capture(
            TurnRecord(
                started_at=started_at,
                method=method,
                path=raw_path + ("?" + redact_query(query) if query else ""),
                upstream=redact_url(upstream.url),
                route=upstream.prefix,
                request_headers=headers,  # fingerprinted by capture.finish(), before anything is stored
                request_body=body.data,  # (streamed: its first part, until the rest has come)
                session_hint=session_hint,
                api=api.name if api else "other",
            ),
            api,
            self.live,
        )
        if self.settings.turn_header:
            capture.record.uid = uuid.uuid4().hex
        if body.incomplete == SHUT_DOWN:  # still arriving when the grace ran out
            await _answer_error(send, capture, 503, "tooltap_shut_down", SHUT_DOWN_EARLY)
            self.sink(capture.finish("proxy_error", SHUT_DOWN))
            return
        if body.incomplete:  # a half-sent request must not reach the upstream as if whole
            if body.timed_out:
                capture.record.http_status = 408  # what the client was answered
            self.sink(capture.finish("client_aborted", body.incomplete))
            return
        if not raw_path.startswith("/"):  # `OPTIONS *`: a question to this server, not a route
            error = f"the request target {raw_path!r} names no upstream path"
            await _answer_error(send, capture, 400, "tooltap_bad_target", error)
            self.sink(capture.finish("proxy_error", error))
            return

        origin, base = self._origin(upstream.url)
        target = base + upstream_path + ("?" + query if query else "")
        watch = _HangUpWatch(receive, scope, start=not streamed)  # (streamed: once the body is whole)
        response: upstream_client.Response | None = None
        status, error = None, None
        started = False  # the client has the response's status line
        try:
            try:
                if streamed:
                    response = await self.client.request(method, origin, target, wire_headers, body.parts[0],
                                                         rest=body.rest(then=watch.start), length=body.announced)
                else:
                    response = await self.client.request(method, origin, target, wire_headers, body.data)
            except _BodyCut as cut:  # the upstream's connection is closed short of the whole body
                if cut.reason == SHUT_DOWN:
                    status, error = "proxy_error", SHUT_DOWN
                    await _answer_error(send, capture, 503, "tooltap_shut_down", SHUT_DOWN_EARLY)
                else:
                    status, error = "client_aborted", cut.reason
                return
            except upstream_client.ReadTimeout as exc:  # reached, but it has not answered
                status, error = "proxy_error", _describe(exc)
                await _answer_error(send, capture, 504, "tooltap_upstream_timeout",
                                    f"{exc} without answering (tooltap serve --read-timeout sets how long to wait)")
                return
            except _UPSTREAM_ERRORS as exc:
                status, error = "proxy_error", _describe(exc)
                await _answer_error(send, capture, 502, "tooltap_proxy_error",
                                    f"tooltap could not reach the upstream: {error}")
                return
            resp_headers = _strip(response.raw_headers)
            capture.response_started(response.status, _text(resp_headers), response.header("content-type") or "")
            await send({"type": "http.response.start", "status": response.status,
                        "headers": sendable(response.status, resp_headers, upstream, base) + _turn_header(capture)})
            started = True
            status, error = await _pump(response, capture, send)
        except asyncio.CancelledError:
            asyncio.current_task().uncancel()
            if watch.hung_up:
                status, error = "client_aborted", "the client closed the connection"
            else:  # the server is stopping and the grace is over: answer what can be answered
                status, error = "proxy_error", SHUT_DOWN
                if not started:
                    await _answer_error(send, capture, 503, "tooltap_shut_down",
                                        "tooltap shut down before the upstream answered")
        except Exception as exc:  # a bug must not lose the turn; the server drops the connection
            status, error = "proxy_error", f"tooltap: {type(exc).__name__}: {exc}"
            raise
        finally:
            watch.stop()
            if status == "client_aborted" and started and capture.answer_closed():
                # The official SDKs stop reading at the closing event and close the
                # connection, before the upstream's end of body may have come: not a client
                # that gave up. (The upstream's connection is closed all the same.)
                status, error = None, None
            if streamed:
                capture.record.request_body = body.data
            if response is not None:
                if status is None:
                    response.release()  # read to the end: the connection goes back to the pool
                else:
                    response.close()  # cut short: close it, so the upstream stops generating
            self.sink(capture.finish(status, error))
            if status == "proxy_error" and error != SHUT_DOWN:
                # The agent only sees a 502: whoever runs tooltap must see why, in one line
                # (the path and URL are the redacted ones that are stored).
                log.warning("%s %s -> %s: %s", method, capture.record.path, capture.record.upstream, error)
        if status == "upstream_aborted":
            raise UpstreamAborted(error)
        if error == SHUT_DOWN and started:
            raise ShutDown(error)


def _describe(exc: BaseException) -> str:
    if isinstance(exc, upstream_client.ReadTimeout):
        return f"ReadTimeout: {exc} (tooltap serve --read-timeout)"
    text = " ".join(str(exc).split())  # one line, whatever the cause wrote
    return f"{type(exc).__name__}: {text}" if text else type(exc).__name__


class _HangUpWatch:
    """Cancels the request's task the moment the client hangs up, whatever it is waiting
    for (the upstream's headers or its next chunk), so the upstream connection is closed
    at once and no one pays for a generation nobody reads. tooltap's server calls back
    when the connection is lost (the HANG_UP extension); under another server a task
    waits for the disconnect (a task per request, and the frames of its cancellation
    for the garbage collector)."""

    def __init__(self, receive, scope, start: bool = True) -> None:
        self.hung_up = False
        self._receive = receive
        self._task = asyncio.current_task()
        self._callbacks: list | None = scope.get("extensions", {}).get(HANG_UP)
        self._watcher: asyncio.Task | None = None
        if start:
            self.start()

    def start(self) -> None:
        if self._callbacks is not None:
            self._callbacks.append(self._hang_up)
        else:
            self._watcher = asyncio.create_task(self._watch(self._receive))

    def _hang_up(self) -> None:
        self.hung_up = True
        self._task.cancel()

    async def _watch(self, receive) -> None:
        await _wait_disconnect(receive)
        self._hang_up()

    def stop(self) -> None:
        if self._callbacks is not None:
            self._callbacks.clear()
        if self._watcher is not None:
            self._watcher.cancel()


async def _pump(response: upstream_client.Response, capture: Capture, send) -> tuple[str | None, str | None]:
    """Copy the body to the client as it arrives, one write per upstream read (the last
    one carries the end of the response too: one write less, one wake-up less).
    Returns (status, error) for anything but a normal end."""
    more = True
    while more:
        try:
            chunk = await response.read()
        except _UPSTREAM_ERRORS as exc:
            return "upstream_aborted", _describe(exc)
        more = bool(chunk) and not response.ended
        try:
            await send({"type": "http.response.body", "body": chunk, "more_body": more})
        except OSError as exc:  # uvicorn's ClientDisconnected is an OSError
            return "client_aborted", f"the client closed the connection ({type(exc).__name__})"
        if chunk:
            capture.feed(chunk)
    return None, None


async def _wait_disconnect(receive) -> None:
    while (await receive())["type"] != "http.disconnect":
        pass


class _BodyCut(Exception):
    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


class _RequestBody:
    """The agent's request body as it arrives. It is read whole before the request goes
    upstream, unless it is large (an agent's history, a megabyte near turn 200): its
    parts then follow the request's head upstream as they come, instead of crossing the
    two hops one after the other."""

    def __init__(self, receive, scope) -> None:
        self._receive = receive
        self._scope = scope
        self.parts: list[bytes] = []
        self.done = False
        self.incomplete: str | None = None  # why it did not all arrive
        self.timed_out = False  # too slow: tooltap answered 408 (connections.py)

    @property
    def data(self) -> bytes:
        return self.parts[0] if len(self.parts) == 1 else b"".join(self.parts)

    async def read(self) -> bool:
        """Read the next part; False once the body is whole or cut short."""
        if self.done:
            return False
        try:
            message = await self._receive()
        except asyncio.CancelledError:  # the shutdown grace ran out while it arrived
            asyncio.current_task().uncancel()
            self.done, self.incomplete = True, SHUT_DOWN
            return False
        if message["type"] == "http.disconnect":
            too_slow = self._scope.get("extensions", {}).get(TIMED_OUT)
            self.done, self.incomplete = True, too_slow or "the client hung up while sending its request"
            self.timed_out = bool(too_slow)
            return False
        self.parts.append(message.get("body", b""))
        self.done = not message.get("more_body")
        return True

    async def read_all(self) -> None:
        while await self.read():
            pass

    @property
    def announced(self) -> int:
        """The length the agent's Content-Length announces (0: none)."""
        value = next((v for k, v in self._scope["headers"] if k.lower() == b"content-length"), b"")
        return int(value) if value.isdigit() else 0

    def worth_streaming(self) -> bool:
        """More is to come and its length is announced and large."""
        return not self.done and self.announced >= STREAM_BODY_BYTES

    async def rest(self, then: Callable[[], None]):
        """The parts after the first, as they arrive; `then()` once the body is whole.
        Raises _BodyCut if it never is."""
        while await self.read():
            yield self.parts[-1]
        if self.incomplete:
            raise _BodyCut(self.incomplete)
        then()


# Scope extensions of tooltap's server (connections.py): where it says it closed a
# too-slow request, and the callbacks it calls when the client hangs up mid-request.
TIMED_OUT = "tooltap.timed_out"
HANG_UP = "tooltap.hang_up"


async def _answer_error(send, capture: Capture, status: int, kind: str, message: str) -> None:
    """Answer the client with tooltap's own JSON error, and record that as the response."""
    body = json.dumps({"error": {"type": kind, "message": message}}).encode()
    capture.response_started(status, [["content-type", "application/json"]], "application/json")
    await _send_raw(send, status, [(b"content-type", b"application/json")] + _turn_header(capture), body)
    capture.feed(body)


def _turn_header(capture: Capture) -> list[tuple[bytes, bytes]]:
    """Set only when the forwarder named the turn itself (serve --turn-header)."""
    return [(TURN_HEADER, capture.record.uid.encode())] if capture.record.uid else []


async def _send_raw(send, status: int, headers: list[tuple[bytes, bytes]], body: bytes) -> None:
    headers = headers + [(b"content-length", str(len(body)).encode())]
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": body})


async def _send_json(send, status: int, obj) -> None:
    await _send_raw(send, status, [(b"content-type", b"application/json")], json.dumps(obj).encode())
