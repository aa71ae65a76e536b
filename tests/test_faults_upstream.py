"""Upstreams that break HTTP mid-stream, on raw sockets: the agent gets the bytes that
came and the same abrupt end, at once, and the turn is `upstream_aborted`."""

from __future__ import annotations

import asyncio
import socket
import struct
import threading
import time

import httpx
import pytest

HEAD = (b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ntransfer-encoding: chunked\r\n"
        b"cache-control: no-cache\r\n\r\n")
FIRST = b'data: {"id":"c","object":"chat.completion.chunk","created":1,"model":"m","choices":[{"index":0,"delta":{"content":"one "}}]}\n\n'
REQ = {"model": "m", "stream": True, "messages": [{"role": "user", "content": "count"}]}


def chunk(data: bytes) -> bytes:
    return b"%x\r\n" % len(data) + data + b"\r\n"


class RawUpstream:
    """Answers every request with `script`: bytes to write and pauses (floats), then
    holds the connection open for `hold` seconds (or resets it, with `reset`)."""

    def __init__(self, script: list, hold: float = 0.0, reset: bool = False):
        self.script, self.hold, self.reset = script, hold, reset
        self.ready = threading.Event()
        self.thread = threading.Thread(target=lambda: asyncio.run(self._serve()), daemon=True)
        self._stop: asyncio.Event | None = None

    async def _serve(self) -> None:
        self._loop = asyncio.get_running_loop()
        self._stop = asyncio.Event()
        server = await asyncio.start_server(self._answer, "127.0.0.1", 0)
        self.port = server.sockets[0].getsockname()[1]
        self.ready.set()
        async with server:
            await self._stop.wait()

    async def _answer(self, reader, writer) -> None:
        try:
            await self._play(reader, writer)
        except asyncio.CancelledError:  # the test is over
            writer.close()

    async def _play(self, reader, writer) -> None:
        head = await reader.readuntil(b"\r\n\r\n")
        length = next((int(line.split(b":")[1]) for line in head.split(b"\r\n")
                       if line.lower().startswith(b"content-length:")), 0)
        await reader.readexactly(length)
        for part in self.script:
            if isinstance(part, float):
                await asyncio.sleep(part)
            else:
                writer.write(part)
                await writer.drain()
        if self.reset:  # RST instead of FIN
            sock = writer.get_extra_info("socket")
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        else:
            await asyncio.sleep(self.hold)
        writer.close()

    def __enter__(self) -> "RawUpstream":
        self.thread.start()
        self.ready.wait(5)
        return self

    def __exit__(self, *exc) -> None:
        self._loop.call_soon_threadsafe(self._stop.set)
        self.thread.join(5)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"


def through(tt) -> tuple[bytes, str | None, float]:
    """Stream a request through tooltap: (bytes received, how it ended, seconds)."""
    got, ended, started = b"", None, time.monotonic()
    try:
        with httpx.stream("POST", f"{tt.url}/chat/completions", json=REQ, timeout=30) as r:
            for piece in r.iter_raw():
                got += piece
    except httpx.HTTPError as exc:
        ended = type(exc).__name__
    return got, ended, time.monotonic() - started


def only_turn(tt) -> dict:
    turns = tt.api("/turns")["turns"]
    assert len(turns) == 1
    return tt.api(f"/turns/{turns[0]['id']}")


@pytest.mark.parametrize("bad, passed", [
    (b"zz\r\nmore data\r\n", b""),  # not a chunk size
    (b"5\r\nmore data than five\r\n", b"more "),  # five bytes, then no CRLF
])
def test_broken_chunked_framing_is_an_upstream_abort(make_tooltap, bad, passed):
    # The upstream then holds its connection open: nothing but tooltap's own check ends
    # the stream (--read-timeout is 600 s).
    with RawUpstream([HEAD, chunk(FIRST), 0.3, bad], hold=15) as up:
        tt = make_tooltap(up.url)
        got, ended, took = through(tt)
        assert got == FIRST + passed and ended == "RemoteProtocolError"  # the bytes that came, then the cut
        assert took < 3, took
        turn = only_turn(tt)
        assert turn["status"] == "upstream_aborted", turn["error"]
        assert turn["response"]["choices"][0]["message"]["content"] == "one "
        assert httpx.get(f"{tt.url}/_tooltap/api/turns/{turn['id']}/raw").content == got


def test_reset_mid_stream_is_an_upstream_abort(make_tooltap):
    with RawUpstream([HEAD, chunk(FIRST), 0.2], reset=True) as up:
        tt = make_tooltap(up.url)
        got, ended, took = through(tt)
        assert got == FIRST and ended == "RemoteProtocolError" and took < 3
        assert only_turn(tt)["status"] == "upstream_aborted"


def test_invalid_utf8_passes_byte_for_byte(make_tooltap):
    bad = b'data: {"choices":[{"index":0,"delta":{"content":"\xff\xfe caf\xc3"}}]}\n\n'
    with RawUpstream([HEAD, chunk(FIRST), chunk(bad), chunk(b"data: [DONE]\n\n"), b"0\r\n\r\n"]) as up:
        tt = make_tooltap(up.url)
        got, ended, _ = through(tt)
        assert ended is None and got == FIRST + bad + b"data: [DONE]\n\n"
        turn = only_turn(tt)
        assert turn["status"] != "proxy_error"
        assert httpx.get(f"{tt.url}/_tooltap/api/turns/{turn['id']}/raw").content == got
