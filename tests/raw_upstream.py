"""Raw asyncio servers on a thread of their own, for upstreams that must misbehave or
watch at the socket level (close mid-request, see a body arrive): `RawUpstream`'s
subclasses write `_connection(reader, writer)`, asyncio's connection callback."""

from __future__ import annotations

import asyncio
import threading
import time


class RawUpstream:
    def __init__(self) -> None:
        self.ready = threading.Event()
        self.thread = threading.Thread(target=lambda: asyncio.run(self._serve()), daemon=True)

    async def _serve(self) -> None:
        self._loop = asyncio.get_running_loop()
        self._stop = asyncio.Event()
        server = await asyncio.start_server(self._connection, "127.0.0.1", 0)
        self.url = f"http://127.0.0.1:{server.sockets[0].getsockname()[1]}"
        self.ready.set()
        async with server:
            await self._stop.wait()

    def __enter__(self):
        self.thread.start()
        assert self.ready.wait(5)
        return self

    def __exit__(self, *exc) -> None:
        self._loop.call_soon_threadsafe(self._stop.set)
        self.thread.join(5)


ANSWER = b'{"id":"c","object":"chat.completion","created":1,"model":"m","choices":[]}'


class WatchedUpstream(RawUpstream):
    """Counts each request's body bytes as they arrive (`got`), and answers once a body
    is whole; `ended` lists, per connection, how many body bytes it had when it closed."""

    def __init__(self):
        self.got = 0
        self.lengths: list[int] = []
        self.bodies: list[bytes] = []
        self.ended: list[int] = []
        super().__init__()

    async def _connection(self, reader, writer) -> None:
        body = b""
        try:
            head = await reader.readuntil(b"\r\n\r\n")
            length = next(int(line.split(b":")[1]) for line in head.split(b"\r\n")
                          if line.lower().startswith(b"content-length:"))
            self.lengths.append(length)
            while len(body) < length:
                piece = await reader.read(65536)
                if not piece:
                    break
                body += piece
                self.got = len(body)
            if len(body) == length:
                self.bodies.append(body)
                writer.write(b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\n"
                             b"content-length: %d\r\n\r\n%s" % (len(ANSWER), ANSWER))
                await writer.drain()
                await reader.read()  # until tooltap lets the connection go
        except (asyncio.IncompleteReadError, ConnectionError):
            pass
        self.ended.append(len(body))
        writer.close()

    def wait_for(self, n: int, timeout: float = 5.0) -> bool:
        deadline = time.monotonic() + timeout
        while self.got < n and time.monotonic() < deadline:
            time.sleep(0.01)
        return self.got >= n
