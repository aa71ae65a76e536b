"""A scripted upstream: a real HTTP app that answers with recorded or made-up exchanges.

Used by the end-to-end tests, the benchmarks and `tooltap demo`. Each route answers a
`Reply`: a status, headers and body chunks sent one by one (with an optional pause
between them), optionally dropping the connection after some chunks, the way a provider
that crashes mid-stream does. Every request it receives is kept for inspection.
"""

from __future__ import annotations

import asyncio
import json
from dataclasses import dataclass, field
from typing import Callable

from .asgi import read_body


@dataclass
class Reply:
    status: int = 200
    headers: list[tuple[str, str]] = field(default_factory=list)
    chunks: list[bytes] = field(default_factory=list)
    delay: float = 0.0  # seconds before each chunk
    wait: float = 0.0  # seconds before the status line: a model thinking, or a hung upstream
    drop_after: int | None = None  # drop the connection after this many chunks

    @classmethod
    def json(cls, obj, status: int = 200, **kw) -> "Reply":
        return cls(status, [("content-type", "application/json")], [json.dumps(obj).encode()], **kw)

    @classmethod
    def sse(cls, body: bytes, *, split: int | None = None, **kw) -> "Reply":
        """An event stream, cut into pieces of `split` bytes (or at each blank line)."""
        if split:
            chunks = [body[i:i + split] for i in range(0, len(body), split)]
        else:
            chunks = [p + b"\n\n" for p in body.split(b"\n\n") if p.strip()]
        return cls(200, [("content-type", "text/event-stream"), ("cache-control", "no-cache")], chunks, **kw)


class Dropped(Exception):
    """Raised inside the app to make the server cut the connection mid-body."""


@dataclass
class Received:
    method: str
    path: str
    query: str
    headers: list[tuple[str, str]]  # names lower-cased, bytes as latin-1
    body: bytes
    raw_path: bytes = b""

    def header(self, name: str) -> str | None:
        return next((v for k, v in self.headers if k == name.lower()), None)

    def json(self):
        return json.loads(self.body)


class ScriptedUpstream:
    """routes: path -> Reply, or a callable (Received) -> Reply, or a list of them
    (answered in turn, the last one repeated)."""

    def __init__(self, routes: dict[str, Reply | Callable | list] | None = None):
        self.routes = dict(routes or {})
        self.received: list[Received] = []
        self.finished: list[bool] = []  # per request: did the whole reply go out

    def _reply(self, req: Received) -> Reply:
        route = self.routes.get(req.path)
        if route is None:
            return Reply.json({"error": {"message": f"no scripted route for {req.path}"}}, status=404)
        if isinstance(route, list):
            seen = sum(1 for r in self.received if r.path == req.path) - 1
            route = route[min(seen, len(route) - 1)]
        return route(req) if callable(route) else route

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return
        body, _ = await read_body(receive)
        req = Received(scope["method"], scope["path"], scope["query_string"].decode("latin-1"),
                       [(k.decode("latin-1").lower(), v.decode("latin-1")) for k, v in scope["headers"]],
                       body, scope.get("raw_path") or b"")
        self.received.append(req)
        reply = self._reply(req)
        if reply.wait:
            await asyncio.sleep(reply.wait)
        headers = [(k.encode("latin-1"), v.encode("latin-1")) for k, v in reply.headers]
        await send({"type": "http.response.start", "status": reply.status, "headers": headers})
        self.finished.append(False)
        n = len(self.finished) - 1
        for i, chunk in enumerate(reply.chunks):
            if reply.drop_after is not None and i >= reply.drop_after:
                raise Dropped()
            if reply.delay:
                await asyncio.sleep(reply.delay)
            await send({"type": "http.response.body", "body": chunk, "more_body": True})
        await send({"type": "http.response.body", "body": b"", "more_body": False})
        self.finished[n] = True
