"""The floor of tooltap's layers: uvicorn serving a raw ASGI app that forwards with an
aiohttp client, as tooltap does, and does nothing else (no capture, no journal, no
redaction, no checks). bench/breakdown.py measures it beside tooltap."""

from __future__ import annotations

import aiohttp

from proxy.asgi import read_body

_HOP = {b"transfer-encoding", b"connection", b"keep-alive"}


class BareProxy:
    def __init__(self, upstream: str):
        self.upstream = upstream.rstrip("/")
        self.client: aiohttp.ClientSession | None = None

    async def request(self, method: str, url: str, headers, body: bytes):
        return await self.client.request(method, url, headers=headers, data=body or None,
                                         allow_redirects=False)

    async def __call__(self, scope, receive, send):
        if scope["type"] == "lifespan":
            while True:
                message = await receive()
                if message["type"] == "lifespan.startup":
                    self.client = aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0),
                                                        auto_decompress=False)
                    await send({"type": "lifespan.startup.complete"})
                else:
                    await self.client.close()
                    await send({"type": "lifespan.shutdown.complete"})
                    return
        body, _ = await read_body(receive)
        query = scope["query_string"].decode("latin-1")
        url = self.upstream + scope["path"] + ("?" + query if query else "")
        headers = [(k.decode("latin-1"), v.decode("latin-1")) for k, v in scope["headers"] if k != b"host"]
        response = await self.request(scope["method"], url, headers, body)
        await send({"type": "http.response.start", "status": response.status,
                    "headers": [(k, v) for k, v in response.raw_headers if k.lower() not in _HOP]})
        async for chunk in response.content.iter_any():
            await send({"type": "http.response.body", "body": chunk, "more_body": True})
        await send({"type": "http.response.body", "body": b""})
        response.release()
