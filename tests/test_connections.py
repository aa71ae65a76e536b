"""Clients that hold connections without using them: silent sockets, heads and bodies
sent a byte at a time, more connections than file descriptors. Each is closed within
its bound while a normal agent's request still goes through."""

from __future__ import annotations

import logging
import signal
import socket
import threading
import time

import httpx
import pytest

from proxy.connections import Limits
from proxy.scripted import Reply
from tests.processes import soft_fd_limit, start

REQ = {"model": "m", "stream": True, "messages": [{"role": "user", "content": "hi"}]}
SSE = b'data: {"choices":[{"index":0,"delta":{"content":"hi"}}]}\n\ndata: [DONE]\n\n'


@pytest.fixture
def guarded(make_tooltap, upstream):
    """tooltap on uvicorn with the guarded protocol and short bounds."""
    return lambda **limits: make_tooltap(upstream.url, limits=Limits(**limits))


def connect(port: int) -> socket.socket:
    s = socket.create_connection(("127.0.0.1", port), timeout=5)
    s.settimeout(5)
    return s


def closed_by_server(s: socket.socket) -> bytes | None:
    """What the server sent before closing, or None if it is still open."""
    s.settimeout(0)
    got = b""
    try:
        while True:
            piece = s.recv(65536)
            if not piece:
                return got
            got += piece
    except BlockingIOError:
        return None
    except ConnectionResetError:
        return got


def wait_all_closed(socks, within: float) -> list[bytes]:
    deadline = time.monotonic() + within
    answers: list = [None] * len(socks)
    while time.monotonic() < deadline and any(a is None for a in answers):
        for i, s in enumerate(socks):
            if answers[i] is None:
                answers[i] = closed_by_server(s)
        time.sleep(0.05)
    open_ = sum(a is None for a in answers)
    assert open_ == 0, f"{open_} of {len(socks)} connections still open after {within} s"
    return answers


def test_silent_and_dribbling_clients_are_closed_in_time(guarded, upstream, caplog):
    upstream.routes["/chat/completions"] = Reply.sse(SSE)
    tt = guarded(head_timeout=1.0)
    caplog.set_level(logging.WARNING, "tooltap")
    silent = [connect(tt.server.port) for _ in range(200)]
    dribblers = [connect(tt.server.port) for _ in range(50)]
    head = b"POST /chat/completions HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\n"
    stop = threading.Event()

    def dribble():
        for i in range(len(head)):
            if stop.is_set():
                return
            for s in dribblers:
                try:
                    s.send(head[i:i + 1])
                except OSError:
                    pass
            time.sleep(0.1)

    threading.Thread(target=dribble, daemon=True).start()
    opened = time.monotonic()
    # An agent still gets through while they hold their sockets.
    r = httpx.post(f"{tt.url}/chat/completions", json=REQ, timeout=5)
    assert r.status_code == 200 and r.content == SSE
    wait_all_closed(silent, within=opened + 2.5 - time.monotonic())
    answers = wait_all_closed(dribblers, within=opened + 2.5 - time.monotonic())
    stop.set()
    assert all(a.startswith(b"HTTP/1.1 408 ") for a in answers)  # they had started a head
    assert httpx.post(f"{tt.url}/chat/completions", json=REQ, timeout=5).status_code == 200
    logged = [r.getMessage() for r in caplog.records if r.name == "tooltap"]
    assert any("connection(s) that sent no request head within 1 s" in m for m in logged), logged
    assert len(logged) < 10  # one line per kind and interval, not one per socket


def test_a_body_sent_a_byte_at_a_time_is_cut_and_recorded(guarded, upstream):
    tt = guarded(body_timeout=1.0, body_min_rate=1000)
    s = connect(tt.server.port)
    s.sendall(b"POST /chat/completions HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\n"
              b"content-length: 5000\r\n\r\n{")
    started = time.monotonic()
    answer = None
    # It goes on sending after the refusal, as a real slow client does: the 408 must still
    # reach it (a server that closes at once makes the kernel reset the connection, and
    # the reset can destroy the answer before the client reads it).
    while answer is None and time.monotonic() - started < 5:
        try:
            s.send(b" ")
        except OSError:
            pass
        time.sleep(0.01)
        if time.monotonic() - started > 1.5:
            answer = closed_by_server(s)
    assert answer is not None and answer.startswith(b"HTTP/1.1 408 "), answer
    assert time.monotonic() - started < 2.5
    assert upstream.received == []  # half a request never goes upstream
    turn = tt.api("/turns")["turns"][0]
    assert turn["status"] == "client_aborted" and turn["http_status"] == 408  # as answered
    assert "too slow sending its request body" in tt.api(f"/turns/{turn['id']}")["error"]


def test_a_head_on_a_kept_alive_connection_gets_its_whole_time_counted_from_its_first_byte(guarded, upstream):
    """The connection's one deadline timer may have been set for an earlier request: a
    head started later is refused a head timeout after its own first byte, not sooner."""
    upstream.routes["/chat/completions"] = Reply.sse(SSE)
    tt = guarded(head_timeout=1.0)
    s = connect(tt.server.port)
    body = b'{"model": "m", "stream": true, "messages": []}'
    request = (b"POST /chat/completions HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\n"
               b"content-length: %d\r\n\r\n%s" % (len(body), body))
    for _ in range(3):  # served at once, 0.2 s apart
        s.sendall(request)
        answer = b""
        while not answer.endswith(b"0\r\n\r\n"):
            answer += s.recv(65536)
        assert answer.startswith(b"HTTP/1.1 200 ") and SSE in answer
        time.sleep(0.2)
    began = time.monotonic()
    answer = None
    for byte in request[:40]:  # a head a byte at a time
        s.send(bytes([byte]))
        time.sleep(0.05)
        answer = closed_by_server(s)
        if answer is not None:
            break
    waited = time.monotonic() - began
    assert answer is not None and answer.startswith(b"HTTP/1.1 408 "), answer
    assert 0.9 <= waited < 1.6, waited


def test_a_refused_client_that_keeps_sending_is_closed_after_the_linger(guarded):
    """The 408 is followed by a half-close and a short drain, not by a socket left open."""
    from proxy.connections import LINGER
    tt = guarded(head_timeout=0.5)
    s = connect(tt.server.port)
    s.sendall(b"POST /chat/completions HTTP/1.1\r\nhost: x\r\n")
    started, got = time.monotonic(), b""
    while time.monotonic() - started < LINGER + 3:
        try:
            s.send(b"x")  # a header line that never ends
        except OSError:
            break
        s.settimeout(0.05)
        try:
            got += s.recv(65536)
        except (TimeoutError, BlockingIOError):
            pass
        except ConnectionResetError:
            break
    assert got.startswith(b"HTTP/1.1 408 "), got
    assert time.monotonic() - started < 0.5 + LINGER + 1.5


def test_an_oversized_head_is_refused(guarded):
    tt = guarded(max_head_bytes=4096)
    s = connect(tt.server.port)
    s.sendall(b"GET /v1/models HTTP/1.1\r\nhost: x\r\n" + b"x-filler: " + b"a" * 8000 + b"\r\n")
    answer = wait_all_closed([s], within=2)[0]
    assert answer.startswith(b"HTTP/1.1 431 ")


def test_a_long_stream_is_never_cut_by_the_bounds(guarded, upstream):
    """No timer runs while tooltap answers: a stream longer than every bound passes."""
    upstream.routes["/chat/completions"] = Reply.sse(SSE * 3, delay=0.3)
    tt = guarded(head_timeout=0.5, body_timeout=0.5)
    with httpx.Client(timeout=10) as client:
        for _ in range(2):  # and the kept-alive connection serves the next request too
            r = client.post(f"{tt.url}/chat/completions", json=REQ)
            assert r.status_code == 200 and r.content == SSE * 3


def test_at_the_cap_idle_connections_make_room_and_busy_ones_refuse(guarded, upstream, caplog):
    upstream.routes["/slow"] = Reply.sse(SSE * 4, delay=0.3)
    upstream.routes["/chat/completions"] = Reply.sse(SSE)
    tt = guarded(max_connections=4)
    caplog.set_level(logging.WARNING, "tooltap")
    idle = [connect(tt.server.port) for _ in range(4)]
    time.sleep(0.1)
    assert httpx.post(f"{tt.url}/chat/completions", json=REQ, timeout=5).status_code == 200
    assert sum(closed_by_server(s) is not None for s in idle) >= 1  # the oldest idle one went

    streams = []
    results = []

    def stream():
        with httpx.stream("POST", f"{tt.url}/slow", json=REQ, timeout=10) as r:
            results.append((r.status_code, r.read()))

    for _ in range(4):
        t = threading.Thread(target=stream)
        t.start()
        streams.append(t)
    time.sleep(0.8)  # four busy connections: the cap
    r = httpx.post(f"{tt.url}/chat/completions", json=REQ, timeout=5)
    assert r.status_code == 503 and b"connection limit" in r.content
    for t in streams:
        t.join(10)
    assert [code for code, _ in results] == [200] * 4
    logged = " ".join(r.getMessage() for r in caplog.records if r.name == "tooltap")
    assert "connection limit (4)" in logged and "answered 503" in logged


def test_serve_raises_the_fd_limit_and_stays_under_it(tmp_path, upstream):
    """With 512 file descriptors, 600 silent connections: new agents still get answers
    and the log says why connections were closed."""
    upstream.routes["/chat/completions"] = Reply.sse(SSE)
    tt = start(tmp_path, "--upstream", upstream.url, limits=(128, 512))
    try:
        assert soft_fd_limit(tt.proc.pid) == 512  # raised from 128 to the hard limit
        silent = []
        for _ in range(600):
            silent.append(connect(tt.port))
        r = httpx.post(f"{tt.url}/chat/completions", json=REQ, timeout=10)
        assert r.status_code == 200 and r.content == SSE
        closed = sum(closed_by_server(s) is not None for s in silent)
        assert closed >= 600 - 224  # the cap: (512 - 64) // 2
        for s in silent:
            s.close()
    finally:
        tt.signal(signal.SIGTERM)
        tt.wait(10)
    out = tt.output()
    assert "connection limit (224)" in out, out[-2000:]
    assert "Too many open files" not in out and "Traceback" not in out


def test_a_kept_alive_connection_outlives_the_clients_pool(tmp_path, upstream):
    """httpx (and the SDKs on it) drops an idle pooled connection after 5 s, uvicorn by
    default after 5 s as well: an agent whose tool ran for about 5 s then sends its next
    request on a connection the server is closing, and gets a reset (seen as a flaky
    `httpx.ReadError` under load). `tooltap serve` keeps idle connections far longer, so
    the client's pool always lets go first."""
    upstream.routes["/chat/completions"] = Reply.sse(SSE)
    tt = start(tmp_path, "--upstream", upstream.url)
    try:
        with httpx.Client(limits=httpx.Limits(keepalive_expiry=60), timeout=10) as client:
            ports = []
            for pause in (6, 0):
                r = client.post(f"{tt.url}/chat/completions", json=REQ)
                assert r.status_code == 200 and r.content == SSE
                ports.append(r.extensions["network_stream"].get_extra_info("client_addr")[1])
                time.sleep(pause)
        assert len(set(ports)) == 1, f"a new connection after 6 s idle: local ports {ports}"
    finally:
        tt.signal(signal.SIGTERM)
        tt.wait(10)


def test_a_websocket_request_is_refused_in_words_and_its_key_never_logged(guarded, upstream, caplog):
    """OpenAI Realtime and Gemini Live open WebSockets, the key often in the query. They
    are not forwarded: a 501 that says so, and the address is logged nowhere."""
    tt = guarded()
    key = "AIzaSyD-THISISASECRETKEY1234567"
    s = connect(tt.server.port)
    with caplog.at_level(logging.INFO, logger="uvicorn.error"):  # where uvicorn logs a WebSocket's address
        s.sendall(f"GET /ws/live?key={key} HTTP/1.1\r\nHost: x\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n"
                  "Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\nSec-WebSocket-Version: 13\r\n\r\n".encode())
        (answer,) = wait_all_closed([s], within=5)
        assert answer.startswith(b"HTTP/1.1 501 ") and b"does not forward WebSocket" in answer
        upstream.routes["/chat/completions"] = Reply.sse(SSE)
        assert httpx.post(f"{tt.url}/chat/completions", json=REQ).status_code == 200  # it goes on serving
    assert [got.path for got in upstream.received] == ["/chat/completions"]
    assert key not in caplog.text and "asked for a WebSocket" in caplog.text
