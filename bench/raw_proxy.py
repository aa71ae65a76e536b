"""The floor of a Python proxy on this machine: an asyncio protocol with httptools on both
legs, the upstream's response bytes relayed as they come (chunked framing and all), and
nothing else. bench/breakdown.py measures it beside the uvicorn + aiohttp floor."""

from __future__ import annotations

import asyncio
from urllib.parse import urlsplit

import httptools


class _Upstream(asyncio.Protocol):
    """One kept-alive upstream connection; relays each response's bytes to `sink`."""

    def __init__(self):
        self.parser = httptools.HttpResponseParser(self)
        self.transport = None
        self.sink = None
        self.done: asyncio.Future | None = None

    def connection_made(self, transport):
        self.transport = transport

    def data_received(self, data):
        self.sink.write(data)
        self.parser.feed_data(data)

    def on_message_complete(self):
        self.done.set_result(None)

    def connection_lost(self, exc):
        if self.done is not None and not self.done.done():
            self.done.set_exception(ConnectionError("upstream closed"))


class RawProxy(asyncio.Protocol):
    def __init__(self, host: str, port: int):
        self.host, self.port = host, port
        self.parser = httptools.HttpRequestParser(self)
        self.upstream: _Upstream | None = None
        self.headers: list[bytes] = []
        self.body: list[bytes] = []
        self.url = b""

    def connection_made(self, transport):
        self.transport = transport

    def data_received(self, data):
        self.parser.feed_data(data)

    def on_url(self, url):
        self.url += url

    def on_header(self, name, value):
        if name.lower() != b"host":
            self.headers.append(name + b": " + value)

    def on_body(self, body):
        self.body.append(body)

    def on_message_complete(self):
        head = (self.parser.get_method() + b" " + self.url + b" HTTP/1.1\r\nhost: upstream\r\n"
                + b"\r\n".join(self.headers) + b"\r\n\r\n")
        body = b"".join(self.body)
        self.url, self.headers, self.body = b"", [], []
        asyncio.get_running_loop().create_task(self.forward(head + body))

    async def forward(self, data: bytes):
        if self.upstream is None or self.upstream.transport.is_closing():
            loop = asyncio.get_running_loop()
            _, self.upstream = await loop.create_connection(_Upstream, self.host, self.port)
        up = self.upstream
        up.sink = self.transport
        up.done = asyncio.get_running_loop().create_future()
        up.transport.write(data)
        await up.done


def main() -> None:
    import argparse

    import uvloop

    ap = argparse.ArgumentParser()
    ap.add_argument("--upstream", required=True)
    ap.add_argument("--port", type=int, required=True)
    a = ap.parse_args()
    target = urlsplit(a.upstream)

    async def serve():
        loop = asyncio.get_running_loop()
        server = await loop.create_server(lambda: RawProxy(target.hostname, target.port), "127.0.0.1", a.port)
        async with server:
            await server.serve_forever()

    try:
        uvloop.run(serve())
    except KeyboardInterrupt:  # bench/common.stop's SIGINT
        pass


if __name__ == "__main__":
    main()
