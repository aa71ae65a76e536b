"""A raw asyncio server on a thread of its own, for upstreams that must misbehave at the
socket level (close mid-request, watch a body arrive): subclasses write `_connection`."""

from __future__ import annotations

import asyncio
import threading


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

    async def _connection(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        raise NotImplementedError

    def __enter__(self):
        self.thread.start()
        assert self.ready.wait(5)
        return self

    def __exit__(self, *exc) -> None:
        self._loop.call_soon_threadsafe(self._stop.set)
        self.thread.join(5)
