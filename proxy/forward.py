"""The hot path: forward one request upstream and stream the answer back untouched.

A raw ASGI app, so nothing sits between the client's socket and the upstream's but this
file: read the request, send it upstream with its headers as they came (less hop-by-hop
ones and Host), pass every response chunk to the client the moment it arrives, then hand
the capture to the store's queue. No database call, no re-serialization, no buffering
of the response. (The request body is read whole before it goes upstream: agents'
requests are at most a few megabytes, and the capture needs them anyway.)
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
import uuid
from typing import Callable

import aiohttp
from aiohttp.http_exceptions import HttpProcessingError
from yarl import URL

from . import apis
from .capture import Capture, TurnRecord
from .config import Settings
from .live import LiveHub
from .secrets import redact_headers, redact_query, redact_url

log = logging.getLogger("tooltap")

HOP_BY_HOP = frozenset(
    {b"connection", b"keep-alive", b"proxy-connection", b"proxy-authenticate", b"proxy-authorization",
     b"te", b"trailer", b"trailers", b"transfer-encoding", b"upgrade",
     b"expect"}  # 100-continue is between the agent and us; we send the whole body at once
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


def _strip(headers: Headers, also: frozenset[bytes] = frozenset()) -> Headers:
    """Headers as bytes, exactly as they came, less hop-by-hop ones (and those that
    `Connection` names)."""
    named = {n.strip().lower() for k, v in headers if k.lower() == b"connection" for n in v.split(b",")}
    drop = HOP_BY_HOP | named | also
    return [(k, v) for k, v in headers if k.lower() not in drop]


def _text(headers: Headers) -> list[tuple[str, str]]:
    return [(k.decode("latin-1"), _decode(v)) for k, v in headers]


def _decode(value: bytes) -> str:
    # aiohttp writes header values as UTF-8, so UTF-8 text goes upstream byte for byte;
    # other bytes (vanishingly rare) are read as latin-1.
    try:
        return value.decode("utf-8")
    except UnicodeDecodeError:
        return value.decode("latin-1")


def make_client(settings: Settings) -> aiohttp.ClientSession:
    """The pooled upstream client. aiohttp rather than httpx on this one leg: its C parser
    hands over everything a socket read brought (one write to the agent per read, not
    per chunk of the chunked encoding) and answers in a third of httpx's time (bench/)."""
    return aiohttp.ClientSession(
        connector=aiohttp.TCPConnector(limit=0, ttl_dns_cache=300),
        timeout=aiohttp.ClientTimeout(total=None, connect=settings.connect_timeout,
                                      sock_read=settings.read_timeout),
        auto_decompress=False,  # compressed bodies go to the agent as sent
        cookie_jar=aiohttp.DummyCookieJar(),  # cookies are the agent's business, not ours
        trust_env=False,
        trace_configs=[_CONNECTIONS],
    )


class _Attempt:
    """What one upstream request learned about the connection it was sent on."""

    __slots__ = ("reused",)

    def __init__(self) -> None:
        self.reused = False


async def _on_reuse(_session, ctx, _params) -> None:
    ctx.trace_request_ctx.reused = True


async def _on_create(_session, ctx, _params) -> None:
    ctx.trace_request_ctx.reused = False


_CONNECTIONS = aiohttp.TraceConfig()
_CONNECTIONS.on_connection_reuseconn.append(_on_reuse)
_CONNECTIONS.on_connection_create_end.append(_on_create)
_CONNECTIONS.freeze()

# A pooled connection the upstream closed as it idled (its keep-alive timeout) fails the
# request sent on it before any answer: nothing reached the model, so the request goes
# once more on a new connection, POST included (Go's net/http and browsers do the same).
# A new connection that fails is not retried: the upstream may have started generating.
_STALE = (aiohttp.ServerDisconnectedError, aiohttp.ClientOSError)


async def _request(client: aiohttp.ClientSession, method: str, url: URL, headers, body: bytes):
    attempt = _Attempt()
    try:
        return await client.request(method, url, headers=headers, data=body or None, allow_redirects=False,
                                    skip_auto_headers=_NO_AUTO_HEADERS, trace_request_ctx=attempt)
    except _STALE as exc:
        if not attempt.reused or isinstance(exc, aiohttp.ClientConnectorError):
            raise
        log.info("%s %s: the pooled upstream connection was closed (%s); sent again on a new one",
                 method, url.path, _describe(exc))
        return await client.request(method, url, headers=headers, data=body or None, allow_redirects=False,
                                    skip_auto_headers=_NO_AUTO_HEADERS, trace_request_ctx=_Attempt())


# aiohttp adds these when absent; the upstream must get only what the agent sent.
_NO_AUTO_HEADERS = ("Accept", "Accept-Encoding", "User-Agent", "Content-Type")
# HttpProcessingError: a response that breaks HTTP (bad chunked framing) under aiohttp's
# pure-Python parser, which raises it as it is, not as a ClientError.
_UPSTREAM_ERRORS = (aiohttp.ClientError, asyncio.TimeoutError, OSError, HttpProcessingError)


class Forwarder:
    def __init__(self, settings: Settings, client: aiohttp.ClientSession, sink: Callable[[TurnRecord], None],
                 live: LiveHub | None = None):
        self.settings = settings
        self.client = client
        self.sink = sink  # must not block: the store's queue.put_nowait
        self.live = live
        self.in_flight = 0  # requests between arrival and their turn being queued for the store
        self.dead_upstreams = _DeadUpstreamWatch()

    def close(self) -> None:
        self.dead_upstreams.stop()

    async def __call__(self, scope, receive, send) -> None:
        self.in_flight += 1
        try:
            await self._forward(scope, receive, send)
        finally:
            self.in_flight -= 1

    async def _forward(self, scope, receive, send) -> None:
        path = scope["path"]
        route = self.settings.resolve(path)
        if route is None:
            await _send_json(send, 404, {"error": {"type": "tooltap_no_upstream",
                                                   "message": f"no upstream serves {path}"}})
            return
        upstream, upstream_path = route
        started_at = time.time()
        body, incomplete = await _read_body(receive, scope)

        session_hint = next((v.decode("latin-1") for k, v in scope["headers"] if k.lower() == SESSION_HEADER), None)
        headers = _text(_strip(scope["headers"], frozenset({b"host", SESSION_HEADER})))
        query = scope.get("query_string", b"").decode("latin-1")
        method = scope["method"]
        # The path as the agent encoded it (scope["path"] is percent-decoded).
        raw_path = (scope.get("raw_path") or path.encode()).decode("latin-1")
        api = apis.detect(method, upstream_path)
        capture = Capture(
            TurnRecord(
                started_at=started_at,
                method=method,
                path=raw_path + ("?" + redact_query(query) if query else ""),
                upstream=redact_url(upstream.url),
                request_headers=redact_headers(headers),
                request_body=body,
                session_hint=session_hint,
                api=api.name if api else "other",
            ),
            api,
            self.live,
        )
        if self.settings.turn_header:
            capture.record.uid = uuid.uuid4().hex
        if incomplete == SHUT_DOWN:  # still arriving when the grace ran out
            await _answer_error(send, capture, 503, "tooltap_shut_down", "tooltap shut down before the request arrived")
            self.sink(capture.finish("proxy_error", SHUT_DOWN))
            return
        if incomplete:  # a half-sent request must not reach the upstream as if whole
            self.sink(capture.finish("client_aborted", incomplete))
            return
        if not raw_path.startswith("/"):  # `OPTIONS *`: a question to this server, not a route
            error = f"the request target {raw_path!r} names no upstream path"
            await _answer_error(send, capture, 400, "tooltap_bad_target", error)
            self.sink(capture.finish("proxy_error", error))
            return

        url = URL(upstream.url + (raw_path[len(upstream.prefix):] or "/") + ("?" + query if query else ""),
                  encoded=True)
        watch = _HangUpWatch(receive)
        response: aiohttp.ClientResponse | None = None
        status, error = None, None
        started = False  # the client has the response's status line
        try:
            try:
                response = await _request(self.client, method, url, headers, body)
            except _UPSTREAM_ERRORS as exc:
                status, error = "proxy_error", _describe(exc)
                await _answer_error(send, capture, 502, "tooltap_proxy_error",
                                    f"tooltap could not reach the upstream: {error}")
                return
            resp_headers = _strip(list(response.raw_headers))
            capture.response_started(
                response.status,
                redact_headers(_text(resp_headers)),
                response.headers.get("content-type", ""),
                response.headers.get("content-encoding"),
            )
            await send({"type": "http.response.start", "status": response.status,
                        "headers": resp_headers + _turn_header(capture)})
            started = True
            status, error = await _pump(response, capture, send, self.dead_upstreams)
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
    if isinstance(exc, asyncio.TimeoutError):
        return "TimeoutError: no answer from the upstream in time"
    text = " ".join(str(exc).split())  # aiohttp's parser errors span several lines
    return f"{type(exc).__name__}: {text}" if text else type(exc).__name__


class _HangUpWatch:
    """Cancels the request's task the moment the client hangs up, whatever it is waiting
    for (the upstream's headers or its next chunk), so the upstream connection is closed
    at once and no one pays for a generation nobody reads."""

    def __init__(self, receive) -> None:
        self.hung_up = False
        self._task = asyncio.current_task()
        self._watcher = asyncio.create_task(self._watch(receive))

    async def _watch(self, receive) -> None:
        await _wait_disconnect(receive)
        self.hung_up = True
        self._task.cancel()

    def stop(self) -> None:
        self._watcher.cancel()


class _DeadUpstreamWatch:
    """Fails the reads that wait on an upstream connection that is gone.

    aiohttp's C parser, meeting broken chunked framing, closes the connection without
    telling the body's reader and stops the read timeout, so the read would wait forever
    (its pure-Python parser raises instead). Twice a second this looks at the bodies
    being waited on; one whose connection is closed before its end is failed, and the
    stream ends as `upstream_aborted` like any other drop."""

    PERIOD = 0.5

    def __init__(self) -> None:
        self.waiting: set[aiohttp.ClientResponse] = set()
        self._task: asyncio.Task | None = None

    def wait_on(self, response: aiohttp.ClientResponse) -> None:
        self.waiting.add(response)
        if self._task is None:
            self._task = asyncio.get_running_loop().create_task(self._run())

    def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            self._task = None

    async def _run(self) -> None:
        while True:
            await asyncio.sleep(self.PERIOD)
            for response in list(self.waiting):
                _fail_if_dead(response)


def _fail_if_dead(response: aiohttp.ClientResponse) -> None:
    body = response.content
    if body.is_eof() or body.exception() is not None:
        return
    connection = response.connection
    if connection is not None and not connection.closed:
        return
    cause = connection.protocol.exception() if connection is not None and connection.protocol else None
    why = " ".join(str(getattr(cause, "message", cause)).split())[:200] if cause else "no reason given"
    body.set_exception(aiohttp.ClientPayloadError(f"the upstream connection closed mid-body ({why})"))


async def _pump(response: aiohttp.ClientResponse, capture: Capture, send,
                dead: _DeadUpstreamWatch) -> tuple[str | None, str | None]:
    """Copy the body to the client as it arrives, one write per upstream read.
    Returns (status, error) for anything but a normal end."""
    chunks = response.content.iter_any()
    while True:
        # Marked only while awaiting: then aiohttp's buffer is empty, and failing the
        # read cannot drop bytes that came.
        dead.wait_on(response)
        try:
            chunk = await anext(chunks)
        except StopAsyncIteration:
            break
        except _UPSTREAM_ERRORS as exc:
            return "upstream_aborted", _describe(exc)
        finally:
            dead.waiting.discard(response)
        try:
            await send({"type": "http.response.body", "body": chunk, "more_body": True})
        except OSError as exc:  # uvicorn's ClientDisconnected is an OSError
            return "client_aborted", f"the client closed the connection ({type(exc).__name__})"
        capture.feed(chunk)
    await send({"type": "http.response.body", "body": b"", "more_body": False})
    return None, None


async def _wait_disconnect(receive) -> None:
    while (await receive())["type"] != "http.disconnect":
        pass


async def _read_body(receive, scope) -> tuple[bytes, str | None]:
    """The request body (agents' requests are small) and, if it did not all arrive, why."""
    parts = []
    try:
        while True:
            message = await receive()
            if message["type"] == "http.disconnect":
                too_slow = scope.get("extensions", {}).get(TIMED_OUT)
                return b"".join(parts), too_slow or "the client hung up while sending its request"
            parts.append(message.get("body", b""))
            if not message.get("more_body"):
                return b"".join(parts), None
    except asyncio.CancelledError:  # the shutdown grace ran out while it arrived
        asyncio.current_task().uncancel()
        return b"".join(parts), SHUT_DOWN


# The scope extension under which the server says it closed a too-slow request.
TIMED_OUT = "tooltap.timed_out"


async def _answer_error(send, capture: Capture, status: int, kind: str, message: str) -> None:
    """Answer the client with tooltap's own JSON error, and record that as the response."""
    body = json.dumps({"error": {"type": kind, "message": message}}).encode()
    capture.response_started(status, [["content-type", "application/json"]], "application/json", None)
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
