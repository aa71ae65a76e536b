"""The hot path: forward one request upstream and stream the answer back untouched.

A raw ASGI app, so nothing sits between the client's socket and the upstream's but this
file: read the request, send it upstream with its headers as they came (less hop-by-hop
ones and Host), pass every response chunk to the client the moment it arrives, then hand
the capture to the store's queue. No database call, no re-serialization, no buffering.
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
from typing import Callable

import aiohttp
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

Headers = list[tuple[bytes, bytes]]


class UpstreamAborted(Exception):
    """Raised after the response has started, so the server drops the client connection
    and the client sees the same abrupt end the upstream gave us."""


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


def _proxy_error_body(cause: str) -> bytes:
    return json.dumps(
        {"error": {"type": "tooltap_proxy_error", "message": f"tooltap could not reach the upstream: {cause}"}}
    ).encode()


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
    )


# aiohttp adds these when absent; the upstream must get only what the agent sent.
_NO_AUTO_HEADERS = ("Accept", "Accept-Encoding", "User-Agent", "Content-Type")
_UPSTREAM_ERRORS = (aiohttp.ClientError, asyncio.TimeoutError, OSError)


class Forwarder:
    def __init__(self, settings: Settings, client: aiohttp.ClientSession, sink: Callable[[TurnRecord], None],
                 live: LiveHub | None = None):
        self.settings = settings
        self.client = client
        self.sink = sink  # must not block: the store's queue.put_nowait
        self.live = live
        self.in_flight = 0  # requests between arrival and their turn being queued for the store

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
        body = await _read_body(receive)

        session_hint = next((v.decode("latin-1") for k, v in scope["headers"] if k.lower() == SESSION_HEADER), None)
        headers = _text(_strip(scope["headers"], frozenset({b"host", SESSION_HEADER})))
        query = scope.get("query_string", b"").decode("latin-1")
        method = scope["method"]
        api = apis.detect(method, upstream_path)
        capture = Capture(
            TurnRecord(
                started_at=started_at,
                method=method,
                path=path + ("?" + redact_query(query) if query else ""),
                upstream=redact_url(upstream.url),
                request_headers=redact_headers(headers),
                request_body=body,
                session_hint=session_hint,
                api=api.name if api else "other",
            ),
            api,
            self.live,
        )

        # The path as the agent encoded it (scope["path"] is percent-decoded).
        raw_path = scope.get("raw_path") or path.encode()
        upstream_raw = raw_path[len(upstream.prefix):].decode("latin-1") or "/"
        url = URL(upstream.url + upstream_raw + ("?" + query if query else ""), encoded=True)
        try:
            response = await self.client.request(
                method, url, headers=headers, data=body, allow_redirects=False,
                skip_auto_headers=_NO_AUTO_HEADERS,
            )
        except _UPSTREAM_ERRORS as exc:
            cause = _describe(exc)
            body = _proxy_error_body(cause)
            capture.response_started(502, [["content-type", "application/json"]], "application/json", None)
            await _send_raw(send, 502, [(b"content-type", b"application/json")], body)
            capture.feed(body)
            self.sink(capture.finish("proxy_error", cause))
            return

        status, error = None, None
        try:
            resp_headers = _strip(list(response.raw_headers))
            capture.response_started(
                response.status,
                redact_headers(_text(resp_headers)),
                response.headers.get("content-type", ""),
                response.headers.get("content-encoding"),
            )
            await send({"type": "http.response.start", "status": response.status, "headers": resp_headers})
            status, error = await _pump(response, capture, receive, send)
        except asyncio.CancelledError:  # server shutting down mid-stream
            status, error = "proxy_error", "tooltap shut down during the response"
            raise
        finally:
            if status is None:
                response.release()  # read to the end: the connection goes back to the pool
            else:
                response.close()  # cut short: close it, so the upstream stops generating
            self.sink(capture.finish(status, error))
        if status == "upstream_aborted":
            raise UpstreamAborted(error)


def _describe(exc: BaseException) -> str:
    if isinstance(exc, asyncio.TimeoutError):
        return "TimeoutError: no answer from the upstream in time"
    return f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__


async def _pump(response: aiohttp.ClientResponse, capture: Capture, receive, send) -> tuple[str | None, str | None]:
    """Copy the body to the client as it arrives, one write per upstream read. A watcher
    cancels the copy the moment the client hangs up, so the upstream connection is closed
    at once. Returns (status, error) for anything but a normal end."""
    pump = asyncio.current_task()
    hung_up = False

    async def watch() -> None:
        nonlocal hung_up
        await _wait_disconnect(receive)
        hung_up = True
        pump.cancel()

    watcher = asyncio.create_task(watch())
    try:
        chunks = response.content.iter_any()
        while True:
            try:
                chunk = await anext(chunks)
            except StopAsyncIteration:
                break
            except _UPSTREAM_ERRORS as exc:
                return "upstream_aborted", _describe(exc)
            try:
                await send({"type": "http.response.body", "body": chunk, "more_body": True})
            except OSError as exc:  # uvicorn's ClientDisconnected is an OSError
                return "client_aborted", f"the client closed the connection ({type(exc).__name__})"
            capture.feed(chunk)
        await send({"type": "http.response.body", "body": b"", "more_body": False})
        return None, None
    except asyncio.CancelledError:
        if not hung_up:
            raise
        pump.uncancel()
        return "client_aborted", "the client closed the connection"
    finally:
        watcher.cancel()


async def _wait_disconnect(receive) -> None:
    while (await receive())["type"] != "http.disconnect":
        pass


async def _read_body(receive) -> bytes:
    parts = []
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            break
        parts.append(message.get("body", b""))
        if not message.get("more_body"):
            break
    return b"".join(parts)


async def _send_raw(send, status: int, headers: list[tuple[bytes, bytes]], body: bytes) -> None:
    headers = headers + [(b"content-length", str(len(body)).encode())]
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": body})


async def _send_json(send, status: int, obj) -> None:
    await _send_raw(send, status, [(b"content-type", b"application/json")], json.dumps(obj).encode())
