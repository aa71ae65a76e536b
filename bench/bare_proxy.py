"""The floor of tooltap's layers: uvicorn serving a raw ASGI app that forwards with
tooltap's upstream client (proxy/upstream.py), and does nothing else (no capture, no
journal, no redaction, no checks). bench/breakdown.py measures it beside tooltap."""

from __future__ import annotations

from proxy import upstream as upstream_client
from proxy.asgi import read_body

_HOP = {b"transfer-encoding", b"connection", b"keep-alive"}


class BareProxy:
    def __init__(self, upstream: str):
        self.origin = upstream_client.Origin.of(upstream)
        self.client = upstream_client.Client()

    async def __call__(self, scope, receive, send):
        if scope["type"] == "lifespan":
            while True:
                message = await receive()
                await send({"type": message["type"] + ".complete"})
                if message["type"] == "lifespan.shutdown":
                    await self.client.close()
                    return
        body, _ = await read_body(receive)
        query = scope["query_string"].decode("latin-1")
        target = scope["path"] + ("?" + query if query else "")
        headers = [(k, v) for k, v in scope["headers"] if k != b"host"]
        response = await self.client.request(scope["method"], self.origin, target, headers, body)
        await send({"type": "http.response.start", "status": response.status,
                    "headers": [(k, v) for k, v in response.raw_headers if k.lower() not in _HOP]})
        while chunk := await response.read():
            await send({"type": "http.response.body", "body": chunk, "more_body": True})
        await send({"type": "http.response.body", "body": b""})
        response.release()
