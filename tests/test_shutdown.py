"""Every stop short of SIGKILL loses nothing: a real `tooltap serve` in a subprocess,
streams in flight, a signal, then the turns in its SQLite file (and spool) counted
against what the clients got."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import socket
import sqlite3
import time
from dataclasses import dataclass

import httpx
import pytest

from proxy.forward import STREAM_BODY_BYTES
from proxy.scripted import Reply, ScriptedUpstream
from tests.conftest import Server
from tests.processes import group_members, leftovers, start
from tests.raw_upstream import WatchedUpstream


def event(text: str) -> bytes:
    return b"data: " + json.dumps({"id": "s", "object": "chat.completion.chunk", "created": 1, "model": "m",
                                   "choices": [{"index": 0, "delta": {"content": text}}]}).encode() + b"\n\n"


def stream(n: int, delay: float) -> Reply:
    return Reply.sse(b"".join(event(f"{i} ") for i in range(n)) + b"data: [DONE]\n\n", delay=delay)


ROUTES = {
    "/long": stream(80, 0.25),  # 20 s: still open when the grace runs out
    "/finishing": stream(8, 0.25),  # 2 s: ends within the grace
    "/short": stream(3, 0),
    "/hold": Reply.json({"late": True}, wait=30),  # no headers within the grace
}


@pytest.fixture
def upstream():
    scripted = ScriptedUpstream(ROUTES)
    with Server(scripted) as server:
        yield server.url


@dataclass
class Answer:
    session: str
    status: int | None = None
    body: bytes = b""
    complete: bool = False  # the response ended as HTTP says it should
    cut: str | None = None
    ended: float = 0.0  # time.monotonic() when the answer ended


class Clients:
    """Agents talking to tooltap at once; `started` counts those that got a first byte."""

    def __init__(self, url: str):
        self.url = url
        self.client = httpx.AsyncClient(timeout=60, limits=httpx.Limits(max_connections=100))
        self.tasks: list[asyncio.Task] = []
        self.started = 0

    def ask(self, path: str, session: str) -> None:
        self.tasks.append(asyncio.create_task(self._ask(path, session)))

    async def _ask(self, path: str, session: str) -> Answer:
        a = Answer(session)
        body = {"model": "m", "stream": True, "messages": [{"role": "user", "content": session}]}
        try:
            async with self.client.stream("POST", self.url + path, json=body,
                                          headers={"x-tooltap-session": session}) as r:
                a.status = r.status_code
                async for chunk in r.aiter_raw():
                    if not a.body:
                        self.started += 1
                    a.body += chunk
            a.complete = True
        except httpx.HTTPError as exc:
            a.cut = type(exc).__name__
        a.ended = time.monotonic()
        return a

    async def until_started(self, n: int, timeout: float = 10) -> None:
        deadline = time.monotonic() + timeout
        while self.started < n:
            assert time.monotonic() < deadline, f"only {self.started} of {n} streams started"
            await asyncio.sleep(0.02)

    async def answers(self) -> dict[str, Answer]:
        done = await asyncio.gather(*self.tasks)
        await self.client.aclose()
        return {a.session: a for a in done}


def check_every_answer_is_stored(answers: dict[str, Answer], turns: list[dict]) -> dict[str, dict]:
    by_session = {t["session"]: t for t in turns}
    assert len(turns) == len(by_session), "a turn stored twice"
    missing = sorted(set(answers) - set(by_session))
    assert not missing, f"{len(missing)} of {len(answers)} turns lost: {missing[:5]}"
    for session, a in answers.items():
        t = by_session[session]
        assert t["raw_size"] == len(a.body), (session, t, len(a.body))
        if a.complete and a.status == 200:
            assert t["status"] == "ok", (session, t)
    return by_session


def no_tracebacks(output: str) -> None:
    assert "Traceback" not in output and "Exception in ASGI" not in output, output[-3000:]


async def test_sigterm_as_docker_stops_within_the_default_grace(tmp_path, upstream):
    """docker stop: SIGTERM, SIGKILL 10 s later. With the default grace tooltap is gone
    before that, every stream cut by the stop recorded as proxy_error."""
    tt = start(tmp_path, "--upstream", upstream)
    clients = Clients(tt.url)
    for i in range(8):
        clients.ask("/short", f"done-{i}")
    await asyncio.gather(*clients.tasks)  # answered in full before the stop
    for i in range(28):
        clients.ask("/long", f"long-{i}")
    for i in range(4):
        clients.ask("/hold", f"hold-{i}")
    await clients.until_started(8 + 28)
    await asyncio.sleep(0.3)  # the /hold requests are waiting for the upstream's headers

    stopped = time.monotonic()
    tt.signal(signal.SIGTERM)
    code = await asyncio.to_thread(tt.wait, 10)
    took = time.monotonic() - stopped
    answers = await clients.answers()

    assert code == 0 and took < 9.5, (code, took)
    turns = check_every_answer_is_stored(answers, tt.turns())
    assert len(turns) == 40
    for i in range(28):
        a, t = answers[f"long-{i}"], turns[f"long-{i}"]
        assert not a.complete and a.cut == "RemoteProtocolError"  # the same abrupt end as an upstream drop
        assert t["status"] == "proxy_error" and t["error"] == "tooltap shut down"
        assert a.body.startswith(b"data: ") and len(a.body) > 1000  # ~5 s of the stream went through
    for i in range(4):
        a, t = answers[f"hold-{i}"], turns[f"hold-{i}"]
        assert a.status == 503 and json.loads(a.body)["error"]["type"] == "tooltap_shut_down"
        assert t["status"] == "proxy_error" and t["error"] == "tooltap shut down"
    no_tracebacks(tt.output())
    assert leftovers(tt.proc.pid) == []  # the writer process is gone too


async def test_sighup_lets_streams_finish_within_the_grace(tmp_path, upstream):
    """The terminal closed (SIGHUP to the whole group): uvicorn would die at once. Streams
    that end within the grace end normally; the rest are cut and recorded."""
    tt = start(tmp_path, "--upstream", upstream, "--shutdown-grace", "5")
    clients = Clients(tt.url)
    for i in range(16):
        clients.ask("/finishing", f"fin-{i}")
        clients.ask("/long", f"long-{i}")
    await clients.until_started(32)
    tt.signal(signal.SIGHUP, group=True)
    code = await asyncio.to_thread(tt.wait, 8)
    answers = await clients.answers()

    assert code == 0
    turns = check_every_answer_is_stored(answers, tt.turns())
    assert all(answers[f"fin-{i}"].complete and answers[f"fin-{i}"].body.endswith(b"data: [DONE]\n\n")
               for i in range(16))
    assert {turns[f"fin-{i}"]["status"] for i in range(16)} == {"ok"}
    assert {turns[f"long-{i}"]["error"] for i in range(16)} == {"tooltap shut down"}
    no_tracebacks(tt.output())
    assert leftovers(tt.proc.pid) == []


async def test_a_second_ctrl_c_cuts_at_once_and_still_stores(tmp_path, upstream):
    tt = start(tmp_path, "--upstream", upstream)  # the default grace: 8 s
    clients = Clients(tt.url)
    for i in range(32):
        clients.ask("/long", f"long-{i}")
    await clients.until_started(32)
    first = time.monotonic()
    tt.signal(signal.SIGINT, group=True)
    await asyncio.sleep(0.5)
    second = time.monotonic()
    tt.signal(signal.SIGINT, group=True)
    code = await asyncio.to_thread(tt.wait, 9)
    took = time.monotonic() - first
    answers = await clients.answers()

    assert code == 0 and took < 8.5, took
    # Cut at the second Ctrl-C, not 5 s after the first.
    assert max(a.ended for a in answers.values()) - second < 1.5
    turns = check_every_answer_is_stored(answers, tt.turns())
    assert {t["error"] for t in turns.values()} == {"tooltap shut down"}
    output = tt.output()
    no_tracebacks(output)
    assert output.count("\n") < 30, output  # a few lines, not uvicorn's ~95


async def test_an_open_live_view_ends_as_a_finished_stream_at_ctrl_c(tmp_path, upstream):
    """An inspector tab left open: its live stream ends as a stream that finished, and the
    stop prints no ERROR (uvicorn's "returned without completing response" for a stream
    cut off)."""
    tt = start(tmp_path, "--upstream", upstream)
    ended: dict[str, object] = {}

    async def watch() -> None:
        async with httpx.AsyncClient(timeout=30) as client:
            async with client.stream("GET", tt.url + "/_tooltap/api/live") as r:
                try:
                    async for line in r.aiter_lines():
                        ended.setdefault("hello", line == "event: hello")
                    ended["complete"] = True
                except httpx.HTTPError as exc:
                    ended["cut"] = type(exc).__name__

    watcher = asyncio.create_task(watch())
    deadline = time.monotonic() + 10
    while "hello" not in ended:
        assert time.monotonic() < deadline, "the live view did not connect"
        await asyncio.sleep(0.05)
    stopped = time.monotonic()
    tt.signal(signal.SIGINT, group=True)
    code = await asyncio.to_thread(tt.wait, 10)
    await asyncio.wait_for(watcher, 5)

    assert code == 0 and time.monotonic() - stopped < 4
    assert ended == {"hello": True, "complete": True}, ended
    output = tt.output()
    no_tracebacks(output)
    assert "ERROR" not in output, output


@pytest.mark.parametrize("size", [2000, 3 * STREAM_BODY_BYTES], ids=["read-whole", "streamed"])
def test_a_request_still_arriving_at_the_stop_gets_503_and_never_reaches_the_upstream_whole(tmp_path, size):
    body = b'{"model": "m", "messages": [{"role": "user", "content": "' + b"z" * size + b'"}]}'
    sent = len(body) * 2 // 3
    with WatchedUpstream() as up:
        tt = start(tmp_path, "--upstream", up.url, env={"TOOLTAP_SHUTDOWN_GRACE": "1"})
        with socket.create_connection(("127.0.0.1", tt.port), timeout=15) as s:
            s.sendall(b"POST /v1/chat/completions HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\n"
                      b"content-length: %d\r\n\r\n" % len(body) + body[:sent])
            if size > STREAM_BODY_BYTES:
                assert up.wait_for(STREAM_BODY_BYTES)  # streamed: the upstream has its first part
            else:
                time.sleep(0.5)  # read whole first: the upstream has nothing yet
            tt.signal(signal.SIGTERM)  # the rest never comes
            answer = b""
            while piece := s.recv(65536):
                answer += piece
        assert tt.wait(10) == 0
        assert answer.startswith(b"HTTP/1.1 503") and b"tooltap_shut_down" in answer, answer[:300]
        (turn,) = tt.turns()  # kept with the part of the body that came (stored: flagged as not JSON)
        assert turn["status"] == "proxy_error" and turn["error"].startswith("tooltap shut down")
        assert up.bodies == []  # no complete request reached it
        if size > STREAM_BODY_BYTES:
            assert up.lengths == [len(body)] and len(up.ended) == 1 and up.ended[0] <= sent
        else:
            assert up.lengths == []
        no_tracebacks(tt.output())


def test_demo_stopped_with_sigterm_leaves_no_writer_and_no_folder(tmp_path):
    tmp = tmp_path / "tmp"
    tmp.mkdir()
    tt = start(tmp_path, "--live-every", "0", command="demo", env={"TMPDIR": str(tmp)})
    assert [p.name for p in tmp.iterdir() if p.name.startswith("tooltap-demo-")]
    assert len(group_members(tt.proc.pid)) >= 2  # tooltap and its writer
    tt.signal(signal.SIGTERM)
    code = tt.wait(15)
    assert code == 0, (code, tt.output())  # (one CI run saw -2 here, with only "stopped" in the log)
    assert leftovers(tt.proc.pid) == [], "the writer process outlived the demo"
    assert not [p.name for p in tmp.iterdir() if p.name.startswith("tooltap-demo-")]
    no_tracebacks(tt.output())
    assert "stopped" in tt.output()


def test_demo_stopped_while_a_turn_streams_prints_no_traceback(tmp_path):
    """The demo streams a slow turn every --live-every seconds: a stop in the middle of
    one cuts the scripted upstream's reply too, which is the demo's own doing."""
    tt = start(tmp_path, "--live-every", "0.5", command="demo")

    def haikus() -> int:
        turns = httpx.get(tt.url + "/_tooltap/api/turns", timeout=5).json()["turns"]
        return sum(1 for t in turns if t["model"] == "gpt-4.1-mini")  # the slow haiku's

    deadline = time.monotonic() + 30
    while "Ctrl-C to stop" not in tt.output():  # the scripted sessions are played
        assert time.monotonic() < deadline, tt.output()
        time.sleep(0.05)
    before = haikus()
    while haikus() == before:  # one ended: the next starts 0.5 s later and streams ~3 s
        assert time.monotonic() < deadline, tt.output()
        time.sleep(0.05)
    time.sleep(0.7)
    tt.signal(signal.SIGINT)
    assert tt.wait(15) == 0
    no_tracebacks(tt.output())
    assert "cutting 1 open request(s)" in tt.output()  # it did stop mid-stream


def test_group_members_sees_a_live_group(tmp_path):
    """The check the tests above rely on finds a process that is there."""
    import subprocess
    import sys

    p = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(5)"], start_new_session=True)
    try:
        assert group_members(p.pid) == [p.pid]
    finally:
        os.killpg(p.pid, signal.SIGKILL)
        p.wait()


def test_sigusr1_prints_every_threads_stack_and_tooltap_keeps_serving(tmp_path):
    """For a report of a hang: `kill -USR1` to tooltap and to its writer process."""
    scripted = ScriptedUpstream({"/v1/chat/completions": lambda r: Reply.sse(b"data: [DONE]\n\n")})
    body = {"model": "m", "messages": [{"role": "user", "content": "hi"}], "stream": True}
    def until(done) -> None:
        deadline = time.monotonic() + 10
        while not done():
            assert time.monotonic() < deadline, tt.output()
            time.sleep(0.05)

    def one_turn(stored: int) -> None:
        r = httpx.post(tt.url + "/v1/chat/completions", json=body)
        assert r.status_code == 200 and r.content == b"data: [DONE]\n\n"
        until(lambda: len(tt.turns()) >= stored)

    with Server(scripted) as up:
        tt = start(tmp_path, "--upstream", up.url)
        try:
            one_turn(1)  # stored: the writer process is at work
            tt.dump_stacks()
            until(lambda: tt.output().count("Current thread") >= 2)  # tooltap's and the writer's
            assert "proxy/store/writer.py" in tt.output()  # the writer thread, where it waits
            one_turn(2)
        finally:
            tt.signal(signal.SIGTERM)
            assert tt.wait(15) == 0
        assert "writer process exited" not in tt.output()


async def test_after_a_stop_the_database_file_alone_holds_every_turn(tmp_path, upstream):
    """Copied on its own after tooltap stops (to share it, or to open it elsewhere), the
    .db file must hold every turn: no write-ahead log is left beside it."""
    tt = start(tmp_path, "--upstream", upstream)
    clients = Clients(tt.url)
    for i in range(5):
        clients.ask("/short", f"short-{i}")
    await clients.answers()
    await asyncio.to_thread(lambda: httpx.get(tt.url + "/_tooltap/api/sessions", timeout=5))  # the inspector reads
    tt.signal(signal.SIGTERM)
    assert await asyncio.to_thread(tt.wait, 10) == 0
    assert not os.path.exists(f"{tt.db}-wal"), os.path.getsize(f"{tt.db}-wal")
    copy = tmp_path / "copy.db"
    copy.write_bytes(tt.db.read_bytes())
    with sqlite3.connect(copy) as conn:
        assert conn.execute("select count(*) from turns").fetchone()[0] == 5


async def test_mcp_requests_open_at_the_stop_end_as_the_api_s_do(tmp_path, upstream):
    """At the end of the grace an MCP event stream ends abruptly and a call still waiting
    for the server gets a 503 naming the stop (a JSON-RPC error with its id), with no
    'ASGI callable returned without completing response' in the log."""
    tt = start(tmp_path, "--upstream", upstream, "--mcp", f"long={upstream}/long", "--mcp", f"hold={upstream}/hold")
    cut: list[str] = []
    async with httpx.AsyncClient(timeout=30) as client:
        async def listen():
            try:
                async with client.stream("GET", f"{tt.url}/_mcp/long", headers={"mcp-session-id": "s1"}) as r:
                    async for _ in r.aiter_raw():
                        pass
            except httpx.HTTPError as exc:
                cut.append(type(exc).__name__)

        async def call_over_events():  # a call the server answers over an event stream (the SDK's way)
            async with client.stream("POST", f"{tt.url}/_mcp/long", headers={"mcp-session-id": "s1"},
                                     json={"jsonrpc": "2.0", "id": 5, "method": "tools/call"}) as r:
                return b"".join([chunk async for chunk in r.aiter_raw()])

        stream = asyncio.create_task(listen())
        waiting = asyncio.create_task(client.post(f"{tt.url}/_mcp/hold", headers={"mcp-session-id": "s1"},
                                                  json={"jsonrpc": "2.0", "id": 4, "method": "tools/call"}))
        events = asyncio.create_task(call_over_events())
        # and a request whose body is still arriving
        partial = socket.create_connection(("127.0.0.1", tt.port))
        partial.sendall(b"POST /_mcp/hold HTTP/1.1\r\nhost: x\r\ncontent-length: 100\r\n\r\n{\"jsonrpc\"")
        await asyncio.sleep(1.0)
        tt.signal(signal.SIGINT, group=True)
        await asyncio.sleep(0.5)
        tt.signal(signal.SIGINT, group=True)  # cut now
        answer = await waiting
        await stream
        last = (await events).rstrip(b"\n").rsplit(b"\n\n", 1)[-1]
        partial.settimeout(10)
        assert partial.recv(4096).startswith(b"HTTP/1.1 503 ")
        partial.close()
    assert await asyncio.to_thread(tt.wait, 9) == 0
    assert cut == ["RemoteProtocolError"]
    assert answer.status_code == 503 and answer.json()["id"] == 4
    # The stream ended whole, its last event the error for the call it never answered.
    assert last.startswith(b"event: message\ndata: ") and json.loads(last.split(b"data: ", 1)[1])["id"] == 5
    assert answer.json()["error"]["message"] == "tooltap shut down before the MCP server answered"
    output = tt.output()
    no_tracebacks(output)
    assert "without completing response" not in output, output
    with sqlite3.connect(tt.db) as db:  # the call and the error answered in the server's place
        rows = db.execute("SELECT direction, note FROM mcp_messages WHERE server = 'hold' ORDER BY seq").fetchall()
    assert rows == [("to_server", None),
                    ("from_server", "tooltap's answer: tooltap shut down before the server answered")]
    with sqlite3.connect(tt.db) as db:
        notes = db.execute("SELECT note FROM mcp_messages WHERE server = 'long' AND direction = 'from_server'"
                           " AND note LIKE 'tooltap%'").fetchall()
    assert notes == [("tooltap's answer: tooltap shut down before the server answered",)]
