"""tooltap's upstream client (proxy/upstream.py) against raw-socket servers: the framings
HTTP/1.1 allows, keep-alive, back-pressure, timeouts and broken answers."""

from __future__ import annotations

import asyncio

import pytest

from proxy.upstream import (HIGH_WATER, BadResponse, Client, ConnectError, Origin, UpstreamDisconnected,
                            _request_head)


class Script:
    """A server that reads each request's head and body and answers with `answer(head)`
    (bytes, or a list of bytes and pauses), then closes if `close` is set."""

    def __init__(self, answer, close: bool = False):
        self.answer, self.close = answer, close
        self.heads: list[bytes] = []
        self.connections = 0

    async def __aenter__(self) -> "Script":
        self.server = await asyncio.start_server(self._serve, "127.0.0.1", 0)
        self.origin = Origin.of(f"http://127.0.0.1:{self.server.sockets[0].getsockname()[1]}")
        return self

    async def __aexit__(self, *exc) -> None:
        self.server.close()

    async def _serve(self, reader, writer) -> None:
        self.connections += 1
        try:
            while True:
                head = await reader.readuntil(b"\r\n\r\n")
                self.heads.append(head)
                length = next((int(line.split(b":")[1]) for line in head.split(b"\r\n")
                               if line.lower().startswith(b"content-length:")), 0)
                await reader.readexactly(length)
                parts = self.answer(head)
                for part in parts if isinstance(parts, list) else [parts]:
                    if isinstance(part, float):
                        await asyncio.sleep(part)
                    else:
                        writer.write(part)
                        await writer.drain()
                if self.close:
                    break
        except (asyncio.IncompleteReadError, ConnectionError):
            pass
        writer.close()


async def read_all(response) -> bytes:
    out = b""
    while piece := await response.read():
        out += piece
    return out


def ok(body: bytes, extra: bytes = b"") -> bytes:
    return b"HTTP/1.1 200 OK\r\ncontent-length: %d\r\n%s\r\n%s" % (len(body), extra, body)


def test_the_request_goes_out_with_the_agents_headers_and_our_host_and_length():
    head = _request_head("POST", Origin.of("https://api.example.com/v1"), "/v1/chat?x=1",
                         [(b"authorization", b"Bearer k"), (b"content-length", b"999"), (b"x-a", b"1")], 2)
    assert head == (b"POST /v1/chat?x=1 HTTP/1.1\r\nhost: api.example.com\r\nauthorization: Bearer k\r\n"
                    b"x-a: 1\r\ncontent-length: 2\r\n\r\n")
    assert b"content-length" not in _request_head("GET", Origin.of("http://h:81"), "/", [], 0)
    assert b"content-length: 0" in _request_head("POST", Origin.of("http://h:81"), "/", [], 0)


async def test_keep_alive_reuses_one_connection_and_connection_close_does_not():
    async with Script(lambda head: ok(b"hello")) as up:
        client = Client(read_timeout=5)
        for _ in range(3):
            response = await client.request("POST", up.origin, "/", [], b"x")
            assert response.status == 200 and await read_all(response) == b"hello"
            response.release()
        assert up.connections == 1
    async with Script(lambda head: ok(b"bye", b"connection: close\r\n")) as up:
        for _ in range(2):
            response = await client.request("GET", up.origin, "/", [], b"")
            assert await read_all(response) == b"bye"
            response.release()
        assert up.connections == 2
    await client.close()


async def test_chunked_until_close_informational_head_and_no_content_answers():
    chunked = (b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n"
               b"3\r\nabc\r\n2\r\nde\r\n0\r\n\r\n")
    early = b"HTTP/1.1 103 Early Hints\r\nlink: </a>; rel=preload\r\n\r\n" + ok(b"after hints", b"x-real: 1\r\n")
    answers = {b"/chunked": chunked, b"/early": early, b"/head": ok(b"not sent")[:-8],
               b"/empty": b"HTTP/1.1 204 No Content\r\n\r\n"}
    async with Script(lambda head: answers[head.split(b" ")[1]]) as up:
        client = Client(read_timeout=5)
        got = {}
        for method, path in [("GET", b"/chunked"), ("GET", b"/early"), ("HEAD", b"/head"), ("GET", b"/empty")]:
            response = await client.request(method, up.origin, path.decode(), [], b"")
            got[path] = (response.status, response.raw_headers, await read_all(response))
            response.release()
        assert got[b"/chunked"][2] == b"abcde"
        assert got[b"/early"] == (200, [(b"content-length", b"11"), (b"x-real", b"1")], b"after hints")
        assert got[b"/head"] == (200, [(b"content-length", b"8")], b"")
        assert got[b"/empty"][0] == 204 and got[b"/empty"][2] == b""
        await client.close()
    async with Script(lambda head: b"HTTP/1.1 200 OK\r\ncontent-type: text/plain\r\n\r\nto the end", close=True) as up:
        response = await client.request("GET", up.origin, "/", [], b"")
        assert await read_all(response) == b"to the end"  # delimited by the connection's end


async def test_a_slow_reader_pauses_the_socket_and_loses_nothing():
    big = bytes(range(256)) * (4 * HIGH_WATER // 256)
    async with Script(lambda head: ok(big)) as up:
        client = Client(read_timeout=5)
        response = await client.request("GET", up.origin, "/", [], b"")
        await asyncio.sleep(0.3)  # the server writes while nobody reads
        conn = response._conn
        assert conn.paused and response._buffered < 2 * HIGH_WATER
        assert await read_all(response) == big
        await client.close()


async def test_silence_times_out_and_broken_answers_are_named():
    async with Script(lambda head: [b"HTTP/1.1 200 OK\r\ncontent-length: 10\r\n\r\nabc", 2.0]) as up:
        client = Client(read_timeout=0.3)
        response = await client.request("GET", up.origin, "/", [], b"")
        assert await response.read() == b"abc"
        with pytest.raises(TimeoutError):
            await response.read()
    async with Script(lambda head: b"HTTP/1.1 200 OK\r\ncontent-length: 10\r\n\r\nabc", close=True) as up:
        response = await client.request("GET", up.origin, "/", [], b"")
        assert await response.read() == b"abc"
        with pytest.raises(UpstreamDisconnected, match="while sending its answer"):
            await response.read()
    async with Script(lambda head: b"SMTP ready\r\n\r\n") as up:
        with pytest.raises(BadResponse, match="not valid HTTP/1.1"):
            await client.request("GET", up.origin, "/", [], b"")
    async with Script(lambda head: b"", close=True) as up:
        with pytest.raises(UpstreamDisconnected, match="before answering"):
            await client.request("GET", up.origin, "/", [], b"")
    closed = Origin.of(f"http://127.0.0.1:{up.origin.port}")  # nothing listens any more
    with pytest.raises(ConnectError, match="cannot connect to 127.0.0.1"):
        await client.request("GET", closed, "/", [], b"")
    await client.close()


async def test_the_read_timeout_counts_each_silence_not_the_whole_answer():
    """Pieces 0.15 s apart over more than four timeouts of 0.3 s: never silent for 0.3 s,
    so never timed out (the one timer an answer is moved on, not left to fire); then a
    0.6 s silence is, and the timer is gone once the answer is done."""
    pieces = [b"HTTP/1.1 200 OK\r\ncontent-length: 10\r\n\r\n"]
    for _ in range(9):
        pieces += [0.15, b"x"]
    async with Script(lambda head: [*pieces, 0.6, b"y"]) as up:
        client = Client(read_timeout=0.3)
        response = await client.request("GET", up.origin, "/", [], b"")
        got = b""
        while len(got) < 9:
            got += await response.read()
        assert got == b"x" * 9
        with pytest.raises(TimeoutError):
            await response.read()
        response.close()
        assert response._timer is None
    async with Script(lambda head: ok(b"done")) as up:
        response = await client.request("GET", up.origin, "/", [], b"")
        assert await read_all(response) == b"done"
        response.release()
        assert response._timer is None  # nothing left to fire for an answer handed back
    await client.close()


async def test_bytes_after_the_answer_do_not_change_it_and_the_connection_is_not_reused():
    extra = ok(b"first") + b"HTTP/1.1 500 Oops\r\ncontent-length: 0\r\n\r\n"
    async with Script(lambda head: extra) as up:
        client = Client(read_timeout=5)
        response = await client.request("GET", up.origin, "/", [], b"")
        assert await read_all(response) == b"first"
        assert response.status == 200 and response.raw_headers == [(b"content-length", b"5")]
        response.release()
        response = await client.request("GET", up.origin, "/", [], b"")
        assert response.status == 200
        assert up.connections == 2
        await client.close()


async def parts(*pieces: bytes, pause: float = 0.02):
    for piece in pieces:
        await asyncio.sleep(pause)
        yield piece


async def test_a_streamed_body_goes_out_part_by_part_with_the_announced_length():
    bodies = []

    async def serve(reader, writer):
        head = await reader.readuntil(b"\r\n\r\n")
        bodies.append((head, await reader.readexactly(9)))
        writer.write(ok(b"done"))
        await writer.drain()
        writer.close()

    server = await asyncio.start_server(serve, "127.0.0.1", 0)
    origin = Origin.of(f"http://127.0.0.1:{server.sockets[0].getsockname()[1]}")
    client = Client(read_timeout=5)
    response = await client.request("POST", origin, "/", [(b"content-length", b"9")], b"abc",
                                    rest=parts(b"def", b"ghi"), length=9)
    assert response.status == 200 and await read_all(response) == b"done"
    (head, body), = bodies
    assert body == b"abcdefghi" and b"content-length: 9\r\n" in head
    await client.close()
    server.close()


async def test_an_upstream_that_answers_before_the_body_is_whole_is_heard_and_the_rest_not_sent():
    """A 401 or 413 can come, and the socket close, while the agent is still sending."""
    async def serve(reader, writer):
        await reader.readuntil(b"\r\n\r\n")
        writer.write(b"HTTP/1.1 413 Too Large\r\ncontent-length: 8\r\nconnection: close\r\n\r\ntoo big!")
        await writer.drain()
        writer.close()

    server = await asyncio.start_server(serve, "127.0.0.1", 0)
    origin = Origin.of(f"http://127.0.0.1:{server.sockets[0].getsockname()[1]}")
    client = Client(read_timeout=5)
    response = await client.request("POST", origin, "/", [], b"a" * 1000,
                                    rest=parts(*[b"b" * 65536] * 8, pause=0.05), length=1000 + 8 * 65536)
    assert response.status == 413 and await read_all(response) == b"too big!"
    response.release()
    await client.close()
    server.close()


async def test_an_agent_gone_mid_body_closes_the_upstream_connection_short_of_the_length():
    got = asyncio.get_running_loop().create_future()

    async def serve(reader, writer):
        head = await reader.readuntil(b"\r\n\r\n")
        body = await reader.read()  # to the end of the connection
        got.set_result((head, body))
        writer.close()

    async def gone():
        yield b"def"
        raise RuntimeError("the agent hung up")

    server = await asyncio.start_server(serve, "127.0.0.1", 0)
    origin = Origin.of(f"http://127.0.0.1:{server.sockets[0].getsockname()[1]}")
    client = Client(read_timeout=5)
    with pytest.raises(RuntimeError, match="hung up"):
        await client.request("POST", origin, "/", [], b"abc", rest=gone(), length=100)
    head, body = await asyncio.wait_for(got, 5)
    assert b"content-length: 100\r\n" in head and body == b"abcdef"  # 6 of 100: never a whole request
    await client.close()
    server.close()
