"""MCP over streamable HTTP: `tooltap serve --mcp NAME=URL` serves the server at
`/_mcp/NAME` and records what passes.

The agent's MCP settings get `http://127.0.0.1:8000/_mcp/NAME` where they had URL (a
path after it is appended to URL, query string kept). Every method is forwarded with
its headers (less hop-by-hop ones and Host) and body; the answer comes back as the
server sent it, each chunk the moment it arrives, whatever its type: a JSON body, an SSE
stream on a POST or on the GET stream, a 202, an error. Recorded: the POSTed message (or
batch), each message in a JSON answer or an SSE stream, under the connection the
`Mcp-Session-Id` header names (a server that gives none: one connection per exchange).
Headers are not recorded: they carry the agent's credentials for the server.
"""

from __future__ import annotations

import asyncio
import json
import os
import re
import time
from dataclasses import dataclass, field
from urllib.parse import urlsplit

import aiohttp

from ..asgi import read_body
from ..capture import Decompressor, codings
from ..forward import SHUT_DOWN, ShutDown, UpstreamAborted, sendable
from ..secrets import redact_url
from ..sse import SSEDecoder
from .messages import FROM_SERVER, TO_SERVER, classify, elements, json_id
from .store import Connection, Recorder, new_id

MCP_PREFIX = "/_mcp"
SESSION_HEADER = "mcp-session-id"
_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]*$")
_HOP_BY_HOP = frozenset({b"connection", b"keep-alive", b"proxy-connection", b"proxy-authenticate",
                         b"proxy-authorization", b"te", b"trailer", b"trailers", b"transfer-encoding",
                         b"upgrade", b"expect", b"host"})
_UPSTREAM_ERRORS = (aiohttp.ClientError, asyncio.TimeoutError, OSError)


@dataclass(frozen=True)
class McpUpstream:
    name: str
    url: str

    @property
    def prefix(self) -> str:
        return f"{MCP_PREFIX}/{self.name}"

    @classmethod
    def parse(cls, spec: str) -> "McpUpstream":
        name, sep, url = spec.partition("=")
        if not sep or "://" in name:
            raise ValueError(f"expected NAME=URL, got {spec!r} (NAME is what the agent calls the server)")
        if not _NAME.match(name):
            raise ValueError(f"bad MCP server name {name!r}: use letters, digits, '.', '_', '-'")
        parts = urlsplit(url.strip())
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise ValueError(f"bad MCP server URL {url!r}: expected http(s)://host[:port][/path]")
        try:
            parts.port  # noqa: B018 - raises on a port that is not a number
        except ValueError:
            raise ValueError(f"bad MCP server URL {url!r}: the port is not a number from 1 to 65535") from None
        return cls(name, url.strip().rstrip("/"))


def parse_all(specs) -> tuple[McpUpstream, ...]:
    servers = tuple(McpUpstream.parse(s) for s in specs)
    names = [s.name for s in servers]
    twice = sorted({n for n in names if names.count(n) > 1})
    if twice:
        raise ValueError(f"the MCP server name {twice[0]!r} is given more than once")
    return servers


class McpHttpProxy:
    """A raw ASGI app for everything under /_mcp/."""

    def __init__(self, servers: tuple[McpUpstream, ...], recorder: Recorder):
        self.servers = {s.name: s for s in servers}
        self.recorder = recorder
        self.client: aiohttp.ClientSession | None = None
        self._connections: dict[tuple[str, str], Connection] = {}

    async def start(self) -> None:
        self.recorder.start()
        # No read timeout: a GET stream may stay quiet for hours between server messages.
        self.client = aiohttp.ClientSession(
            timeout=aiohttp.ClientTimeout(total=None, connect=10, sock_read=None),
            auto_decompress=False, cookie_jar=aiohttp.DummyCookieJar(), trust_env=False)

    async def close(self) -> None:
        if self.client is not None:
            await self.client.close()
        await asyncio.to_thread(self.recorder.close, 5.0)

    @staticmethod
    def serves(path: str) -> bool:
        return path == MCP_PREFIX or path.startswith(MCP_PREFIX + "/")

    async def __call__(self, scope, receive, send) -> None:
        name, _, rest = scope["path"][len(MCP_PREFIX) + 1:].partition("/")
        server = self.servers.get(name)
        if server is None:
            served = ", ".join(s.prefix for s in self.servers.values())
            return await _send_json(send, 404, {"error": {"type": "tooltap_no_mcp_server", "message": (
                f"no MCP server is served at {scope['path']}; this tooltap serves {served}")}})
        raw_path = (scope.get("raw_path") or scope["path"].encode()).decode("latin-1")
        query = scope.get("query_string", b"").decode("latin-1")
        url = server.url + raw_path[len(server.prefix):] + ("?" + query if query else "")
        try:
            body, complete = await read_body(receive)
        except asyncio.CancelledError:  # the stop's grace ended while the body came
            asyncio.current_task().uncancel()
            return await _send_json(send, 503, {"error": {"type": "tooltap_shut_down",
                                                          "message": f"{SHUT_DOWN} before the request arrived"}})
        if not complete:
            return
        at = time.time()
        headers = [(k.decode("latin-1"), v.decode("latin-1")) for k, v in scope["headers"]
                   if k.lower() not in _HOP_BY_HOP]
        asked_session = _header(scope["headers"], SESSION_HEADER.encode())
        method = scope["method"]
        posted = body.strip() if method == "POST" else b""
        session = asked_session
        conn: Connection | None = None
        task = asyncio.current_task()
        watcher = asyncio.create_task(_on_hang_up(receive, task))
        response = None
        started = False
        stream = _Stream(answers=method == "POST")
        try:
            try:
                response = await self.client.request(method, url, headers=headers, data=body or None,
                                                      allow_redirects=False,
                                                      skip_auto_headers=("Accept", "Accept-Encoding", "User-Agent",
                                                                         "Content-Type"))
            except _UPSTREAM_ERRORS as exc:
                answer = _unreachable(body, f"tooltap could not reach the MCP server: {_unreached(exc)}")
                if posted:
                    conn = self._answered(server, session, posted, at, answer, "the server could not be reached")
                return await _send_json(send, 502, answer)
            session = response.headers.get(SESSION_HEADER) or asked_session
            conn = self._connection(server, session)
            if posted and not 300 <= response.status < 400:  # redirected, the agent sends it again: once is enough
                self.recorder.record(conn, TO_SERVER, posted, at)
            # A redirect within the server points through tooltap, as the model API's do.
            kept = [(k, v) for k, v in response.raw_headers if k.lower() not in _HOP_BY_HOP]
            await send({"type": "http.response.start", "status": response.status,
                        "headers": sendable(response.status, kept, server, urlsplit(server.url).path)})
            started = True
            await self._pump(response, send, conn, stream)
            if method == "DELETE" and response.status < 300:
                self.recorder.ended(conn, None)
                self._connections.pop((server.name, session or ""), None)
        except asyncio.CancelledError:  # the agent hung up, or tooltap is stopping: the upstream is closed below
            asyncio.current_task().uncancel()
            if watcher.done():  # the agent hung up; before the server's answer began, its message is kept
                if conn is None and posted:
                    conn = self._connection(server, session)
                    self.recorder.record(conn, TO_SERVER, posted, at,
                                         note="the agent hung up before the server answered")
                return
            answer = _unreachable(body, f"{SHUT_DOWN} before the MCP server answered")
            if started:
                # A call answered over an event stream gets the error as the stream's last event,
                # when the stream can take one; any other stream ends abruptly, as the API's do.
                unanswered = stream.unanswered(answer if isinstance(answer, list) else [answer])
                if not unanswered:
                    raise ShutDown(SHUT_DOWN) from None
                await send({"type": "http.response.body", "more_body": False, "body": b"".join(
                    b"event: message\ndata: " + json.dumps(a).encode() + b"\n\n" for a in unanswered)})
                for a in unanswered:
                    self.recorder.record(conn, FROM_SERVER, json.dumps(a).encode(),
                                         note=f"tooltap's answer: {SHUT_DOWN} before the server answered")
                return
            if posted:
                conn = self._answered(server, session, posted, at, answer, f"{SHUT_DOWN} before the server answered")
            await _send_json(send, 503, answer)
        finally:
            watcher.cancel()
            if response is not None:
                response.close()
            if conn is not None and not session and posted:  # an exchange on its own ends with it
                self.recorder.ended(conn, None)

    def _answered(self, server: McpUpstream, session: str | None, posted: bytes, at: float, answer,
                  why: str) -> Connection:
        """The agent's message, and the JSON-RPC error tooltap answered in the server's
        place, recorded as the answer the agent got (a notification has none: the note
        says why it went nowhere)."""
        conn = self._connection(server, session)
        if isinstance(answer, list) or "jsonrpc" in answer:
            self.recorder.record(conn, TO_SERVER, posted, at)
            self.recorder.record(conn, FROM_SERVER, json.dumps(answer).encode(), note=f"tooltap's answer: {why}")
        else:
            self.recorder.record(conn, TO_SERVER, posted, at, note=why)
        return conn

    def _connection(self, server: McpUpstream, session: str | None) -> Connection:
        if not session:  # a server without sessions: each exchange on its own
            return Connection(new_id(), "http", name=server.name, url=redact_url(server.url))
        key = (server.name, session)
        conn = self._connections.get(key)
        if conn is None:
            conn = self._connections[key] = Connection(new_id(), "http", name=server.name,
                                                       url=redact_url(server.url))
        return conn

    async def _pump(self, response: aiohttp.ClientResponse, send, conn: Connection, stream: "_Stream") -> None:
        """The body to the agent chunk by chunk; its messages to the recorder."""
        ctype = response.headers.get("content-type", "").lower()
        sse = SSEDecoder() if "text/event-stream" in ctype else None
        whole: list[bytes] | None = [] if sse is None else None
        # The agent gets the bytes as sent; the recorder reads them decoded (the SDKs ask for gzip).
        coding = ", ".join(response.headers.getall("content-encoding", [])) or None
        stream.events = sse is not None and coding is None
        try:
            decode = Decompressor(coding) if codings(coding) else None
        except ValueError:  # a coding we cannot undo: recorded as sent, and flagged unreadable
            decode = None
        try:
            async for chunk in response.content.iter_any():
                try:
                    plain = decode(chunk) if decode is not None else chunk
                except Exception:  # not what it says it is: what follows is recorded as sent
                    decode, plain = None, chunk
                if sse is not None:  # recorded first, so what the agent answers is recorded after it
                    at = time.time()
                    for event in sse.feed(plain):
                        if event.data.strip():
                            self.recorder.record(conn, FROM_SERVER, event.data.encode(), at)
                            stream.saw(event.data)
                    stream.between_events = chunk.endswith((b"\n\n", b"\r\n\r\n", b"\r\r"))
                else:
                    whole.append(plain)
                await send({"type": "http.response.body", "body": chunk, "more_body": True})
        except _UPSTREAM_ERRORS as exc:
            raise UpstreamAborted(f"the MCP server dropped the stream: {exc}") from None  # so the agent's drops too
        await send({"type": "http.response.body", "body": b"", "more_body": False})
        if whole is not None:
            data = b"".join(whole).strip()
            if data and "json" in ctype:
                self.recorder.record(conn, FROM_SERVER, data)
            elif data and response.status >= 400:
                self.recorder.record(conn, FROM_SERVER, data, note=f"HTTP {response.status}")


@dataclass
class _Stream:
    """What the stop needs to know of an answer being relayed: whether an event can still
    be added to it, and which requests it answered."""

    answers: bool  # a POST's stream, which may answer it (the GET stream answers nothing of the agent's)
    events: bool = False  # an event stream, not content-encoded
    between_events: bool = True
    replies: list = field(default_factory=list)  # its events that may be answers, read only at the stop

    def saw(self, data: str) -> None:
        # Kept, not parsed: the recorder parses every message off the loop, and only a stop
        # needs to know which requests this stream answered.
        if self.answers and self.events and ('"result"' in data or '"error"' in data):
            self.replies.append(data)

    def unanswered(self, errors: list) -> list:
        if not (self.events and self.between_events):
            return []
        answered = {json_id(msg["id"]) for data in self.replies for msg in elements(classify(data.encode()).json)
                    if "id" in msg and ("result" in msg or "error" in msg)}
        return [e for e in errors if "jsonrpc" in e and json_id(e["id"]) not in answered]


def _unreached(exc: BaseException) -> str:
    """Why the server could not be reached, in one line (aiohttp names "ssl:default" for a
    plain-HTTP address that refused the connection)."""
    if isinstance(exc, aiohttp.ClientConnectorError) and not isinstance(exc, aiohttp.ClientSSLError):
        error = exc.os_error
        reason = os.strerror(error.errno) if (error.errno or 0) > 0 else (error.strerror or str(error))
        return f"cannot connect to {exc.host}:{exc.port}: {reason}"  # (a name lookup's errno is negative)
    return str(exc) or type(exc).__name__


def _unreachable(body: bytes, message: str):
    """The 502's (or the stop's 503's) body: to a JSON-RPC request, a JSON-RPC error with
    its id, to a batch one for each request in it (what an MCP client shows the user: it
    said only "Server returned an error response" otherwise); else tooltap's own error."""
    try:
        asked = json.loads(body)
    except ValueError:
        asked = None
    errors = [{"jsonrpc": "2.0", "id": m["id"], "error": {"code": -32000, "message": message,
                                                           "data": {"type": "tooltap_proxy_error"}}}
              for m in (asked if isinstance(asked, list) else [asked]) if isinstance(m, dict) and "id" in m
              and "method" in m]
    if errors:
        return errors if isinstance(asked, list) else errors[0]
    return {"error": {"type": "tooltap_proxy_error", "message": message}}


def _header(headers, name: bytes) -> str | None:
    for k, v in headers:
        if k.lower() == name:
            return v.decode("latin-1")
    return None


async def _on_hang_up(receive, task: asyncio.Task) -> None:
    while (await receive())["type"] != "http.disconnect":
        pass
    task.cancel()


async def _send_json(send, status: int, obj) -> None:
    body = json.dumps(obj).encode()
    await send({"type": "http.response.start", "status": status,
                "headers": [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]})
    await send({"type": "http.response.body", "body": body})
