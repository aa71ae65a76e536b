"""Several tooltap processes on one database: as one tooltap.

Three `tooltap serve` processes (each its own writer process and journal) share the test
Postgres; a round-robin client runs 50 agent sessions of 20 turns at once, turn k of
session s going to instance (s + k) % 3, so consecutive turns of a conversation always
reach different instances and are stored in whatever order their writers commit. Every
session must thread exactly as the same requests do through one writer, no session,
blob or chain node may exist twice, and the live view of one instance must show the
turns all three stored. Then the same on one SQLite file (`serve --workers 2`, and two
instances' live views).
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import httpx
import pytest
from sqlalchemy import create_engine, text

from proxy.capture import TurnRecord
from proxy.live import LiveHub
from proxy.scripted import Reply, ScriptedUpstream
from proxy.store.peers import Own, PeerTurns
from proxy.store.writer import Writer
from tests.conftest import Server, free_port, postgres_url
from tests.processes import REPO, Tooltap
from tests.test_writer_speed import snapshot

SESSIONS, TURNS, INSTANCES = 50, 20, 3
SYSTEM = "You are a careful coding agent. " * 40
USAGE = {"prompt_tokens": 100, "completion_tokens": 10, "total_tokens": 110}


def call_id(s: int, k: int) -> str:
    return f"call_{s}_{k}"


def reply_for(request) -> Reply:
    """A streamed answer with one tool call, named after the session and turn it answers."""
    body = request.json()
    task = body["messages"][1]["content"]
    s = int(task.split()[1].rstrip(":"))
    k = sum(1 for m in body["messages"] if m["role"] == "assistant")
    args = json.dumps({"path": f"src/file_{k}.py"})
    chunks = [
        {"choices": [{"index": 0, "delta": {"role": "assistant", "content": f"Step {k}."}, "finish_reason": None}]},
        {"choices": [{"index": 0, "delta": {"tool_calls": [{"index": 0, "id": call_id(s, k), "type": "function",
                                                            "function": {"name": "read_file", "arguments": args}}]},
                      "finish_reason": None}]},
        {"choices": [{"index": 0, "delta": {}, "finish_reason": "tool_calls"}], "usage": USAGE},
    ]
    sse = b"".join(b"data: " + json.dumps({"id": f"c{s}-{k}", "object": "chat.completion.chunk", "created": 1,
                                           "model": "m", **c}).encode() + b"\n\n" for c in chunks)
    return Reply.sse(sse + b"data: [DONE]\n\n")


async def agent(client: httpx.AsyncClient, urls: list[str], s: int, turns: int) -> None:
    """One agent: its turns, each request carrying the whole history, round robin."""
    messages = [{"role": "system", "content": SYSTEM}, {"role": "user", "content": f"session {s}: fix the bug"}]
    for k in range(turns):
        url = urls[(s + k) % len(urls)]
        r = await client.post(f"{url}/v1/chat/completions",
                              json={"model": "m", "stream": True, "messages": messages, "tools": TOOLS})
        assert r.status_code == 200 and r.content.endswith(b"data: [DONE]\n\n"), r.status_code
        args = json.dumps({"path": f"src/file_{k}.py"})
        messages = messages + [
            {"role": "assistant", "content": f"Step {k}.",
             "tool_calls": [{"id": call_id(s, k), "type": "function",
                             "function": {"name": "read_file", "arguments": args}}]},
            {"role": "tool", "tool_call_id": call_id(s, k), "content": f"contents of file {k} in session {s}"},
        ]


TOOLS = [{"type": "function", "function": {"name": "read_file", "description": "Read a file.",
                                           "parameters": {"type": "object", "properties": {"path": {"type": "string"}},
                                                          "required": ["path"]}}}]


def run_agents(urls: list[str], sessions: int = SESSIONS, turns: int = TURNS) -> None:
    async def main():
        limits = httpx.Limits(max_connections=sessions * 2, max_keepalive_connections=sessions * 2)
        async with httpx.AsyncClient(timeout=60, limits=limits) as client:
            await asyncio.gather(*(agent(client, urls, s, turns) for s in range(sessions)))

    asyncio.run(main())


def serve(tmp_path: Path, name: str, upstream: str, db_url: str, *extra: str, port: int | None = None) -> Tooltap:
    port = port or free_port()
    log = tmp_path / f"{name}.log"
    env = {k: v for k, v in os.environ.items() if not k.startswith("TOOLTAP_")}
    env["TOOLTAP_SHUTDOWN_GRACE"] = "4"
    cmd = [sys.executable, "-m", "proxy", "serve", "--upstream", upstream, "--db", db_url, "--port", str(port),
           "--spool", str(tmp_path / f"{name}.spool.jsonl"), "--log-level", "warning", *extra]
    with open(log, "wb") as out:
        proc = subprocess.Popen(cmd, cwd=REPO, env=env, stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
    return Tooltap(proc, port, tmp_path / "unused.db", log)


def wait_ready(tts: list[Tooltap], timeout: float = 40) -> None:
    deadline = time.monotonic() + timeout
    for tt in tts:
        while True:
            assert tt.proc.poll() is None, tt.output()
            try:
                if httpx.get(tt.url + "/_tooltap/api/health", timeout=1).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            assert time.monotonic() < deadline, f"not ready:\n{tt.output()}"
            time.sleep(0.1)


class LiveWatch:
    """The turn ids an instance's live view (/_tooltap/api/live) announces as stored."""

    def __init__(self, url: str):
        self.ids: set[int] = set()
        self.announced: list[int] = []  # in order, repeats included
        self.connected = threading.Event()
        self._stop = False
        self._thread = threading.Thread(target=self._run, args=(url,), daemon=True)
        self._thread.start()
        assert self.connected.wait(15), "the live view did not connect"

    def _run(self, url: str) -> None:
        try:
            self._read(url)
        except httpx.HTTPError:  # the instance stopped
            pass

    def _read(self, url: str) -> None:
        with httpx.stream("GET", url + "/_tooltap/api/live", timeout=None) as r:
            event = None
            for line in r.iter_lines():
                if self._stop:
                    return
                if line.startswith("event:"):
                    event = line.split(":", 1)[1].strip()
                    if event == "hello":
                        self.connected.set()
                elif line.startswith("data:") and event == "turn_stored":
                    self.announced.append(json.loads(line.split(":", 1)[1])["turn_id"])
                    self.ids.add(self.announced[-1])

    def wait_for(self, ids: set[int], timeout: float = 15) -> set[int]:
        deadline = time.monotonic() + timeout
        while not ids <= self.ids and time.monotonic() < deadline:
            time.sleep(0.1)
        self._stop = True
        return ids - self.ids


def stored_count(engine) -> int:
    with engine.connect() as c:
        return c.execute(text("SELECT count(*) FROM turns")).scalar()


def wait_stored(engine, n: int, timeout: float = 60) -> None:
    deadline = time.monotonic() + timeout
    while stored_count(engine) < n:
        assert time.monotonic() < deadline, f"{stored_count(engine)} of {n} turns stored"
        time.sleep(0.2)


def stop(tts: list[Tooltap]) -> None:
    for tt in tts:
        if tt.proc.poll() is None:
            tt.signal(signal.SIGTERM)
    for tt in tts:
        assert tt.wait(20) == 0, tt.output()


def one_writer_baseline(tmp_path: Path, received, engine) -> dict:
    """The same requests, with the same answers, stored by a single writer in arrival order."""
    with engine.connect() as c:
        upstream_url = c.execute(text("SELECT upstream FROM turns LIMIT 1")).scalar()
    writer = Writer(f"sqlite:///{tmp_path / 'one.db'}", spool_path=str(tmp_path / "one.spool"))
    writer.start()
    for n, req in enumerate(received):
        raw = b"".join(reply_for(req).chunks)
        writer.submit(TurnRecord(started_at=1_700_000_000 + n, method="POST", path="/v1/chat/completions",
                                 upstream=upstream_url, request_headers=[["content-type", "application/json"]],
                                 request_body=req.body, api="openai.chat", http_status=200, stream=True,
                                 raw=raw, raw_size=len(raw), response_headers=[["content-type", "text/event-stream"]]))
    writer.flush(60)
    writer.close()
    return snapshot(writer.engine)


def without_times(snap: dict) -> dict:
    """Session rows but their first and last times (each instance stamps its own)."""
    return {**snap, "sessions": sorted(s[:-2] for s in snap["sessions"])}


def test_three_instances_on_one_postgres_thread_every_session_as_one_does(tmp_path):
    url = postgres_url()
    if url is None:
        pytest.skip("no Postgres here: set TOOLTAP_TEST_POSTGRES (.ci/run does)")
    engine = create_engine(url)
    with engine.begin() as c:
        c.execute(text("DROP SCHEMA public CASCADE; CREATE SCHEMA public"))
    scripted = ScriptedUpstream({"/v1/chat/completions": reply_for})
    with Server(scripted) as up:
        tts = [serve(tmp_path, f"i{n}", up.url, url) for n in range(INSTANCES)]
        try:
            wait_ready(tts)
            watch = LiveWatch(tts[0].url)
            run_agents([tt.url for tt in tts])
            wait_stored(engine, SESSIONS * TURNS)
            with engine.connect() as c:
                ids = set(c.execute(text("SELECT id FROM turns")).scalars())
                upstreams = c.execute(text("SELECT count(DISTINCT upstream) FROM turns")).scalar()
            missed = watch.wait_for(ids)
            assert not missed, f"instance 0's live view missed {len(missed)} of {len(ids)} turns"
        finally:
            stop(tts)
    assert upstreams == 1  # every instance names the upstream alike: one chain root per conversation

    spread = snapshot(engine)
    assert len(spread["sessions"]) == SESSIONS
    assert all(s[3] == TURNS and s[4] == TURNS for s in spread["sessions"])  # turns, tool calls
    with engine.connect() as c:
        # Each session is one chain: turn k's parent is turn k-1, whoever stored either.
        rows = c.execute(text("SELECT t.session_id, t.message_count, p.message_count FROM turns t "
                              "LEFT JOIN turns p ON p.id = t.parent_id ORDER BY 1, 2")).all()
        nodes, distinct_nodes = c.execute(text("SELECT count(*), count(DISTINCT hash) FROM chain_nodes")).one()
    for s in range(SESSIONS):
        chain = [(count, parent) for sid, count, parent in rows if sid == rows[s * TURNS][0]]
        assert chain == [(1 + 2 * k, (2 * k - 1) if k else None) for k in range(TURNS)], chain
    assert nodes == distinct_nodes == SESSIONS * (1 + 2 * (TURNS - 1))
    results = [json.loads(c[3])[2]["status"] for c in spread["calls"]]
    assert results.count("ok") == SESSIONS * (TURNS - 1) and results.count("missing") == SESSIONS

    assert without_times(spread) == without_times(one_writer_baseline(tmp_path, scripted.received, engine))


def test_workers_share_a_port_and_one_sqlite_file(tmp_path):
    """`serve --workers 2`: two processes answer on one port, their turns thread as one
    tooltap's, and a stop signal stops them all."""
    db = tmp_path / "w.db"
    scripted = ScriptedUpstream({"/v1/chat/completions": reply_for})
    with Server(scripted) as up:
        tt = serve(tmp_path, "workers", up.url, f"sqlite:///{db}", "--workers", "2")
        try:
            wait_ready([tt])
            pids = set()
            deadline = time.monotonic() + 20
            while len(pids) < 2 and time.monotonic() < deadline:  # new connections spread over both
                pids.add(httpx.get(tt.url + "/_tooltap/api/health").json()["writer"]["proxy_pid"])
            assert len(pids) == 2 and tt.proc.pid not in pids
            watch = LiveWatch(tt.url)  # one worker's live view, whichever answered
            run_agents([tt.url], sessions=6, turns=6)
            engine = create_engine(f"sqlite:///{db}")
            wait_stored(engine, 36)
            with engine.connect() as c:
                ids = set(c.execute(text("SELECT id FROM turns")).scalars())
            assert not watch.wait_for(ids), "a worker's live view missed the other worker's turns"
        finally:
            tt.signal(signal.SIGTERM)
            assert tt.wait(30) == 0, tt.output()
    snap = snapshot(engine)
    assert len(snap["sessions"]) == 6 and all(s[3] == 6 for s in snap["sessions"])
    assert without_times(snap) == without_times(one_writer_baseline(tmp_path, scripted.received, engine))
    for pid in pids:
        assert not Path(f"/proc/{pid}").exists() or "Z" in Path(f"/proc/{pid}/stat").read_text().split()[2]


async def announced(queue, within: float, enough: int | None = None) -> list[int]:
    """The turn ids a live hub's queue gives within `within` seconds (or until `enough`)."""
    seen: list[int] = []
    deadline = time.monotonic() + within
    while (enough is None or len(seen) < enough) and time.monotonic() < deadline:
        try:
            seen.append((await asyncio.wait_for(queue.get(), 0.5))["turn_id"])
        except asyncio.TimeoutError:
            pass
    return seen


def test_a_live_view_on_sqlite_sees_a_burst_stored_before_its_first_poll(tmp_path):
    """Another process's turns that land right after a view opens, before the poller's next
    read, are announced too (the poller knows the newest id before anyone watches)."""
    db_url = f"sqlite:///{tmp_path / 'peers.db'}"
    other = Writer(db_url, spool_path=str(tmp_path / "other.spool"))
    other.start()

    def store(n: int) -> None:
        for k in range(n):
            body = json.dumps({"model": "m", "messages": [{"role": "user", "content": f"task {time.time()} {k}"}]})
            other.submit(TurnRecord(started_at=time.time(), method="POST", path="/v1/chat/completions",
                                    upstream="http://up", request_headers=[], request_body=body.encode(),
                                    api="openai.chat", http_status=200, stream=False, raw=b"{}", raw_size=2))
        other.flush(10)

    async def watch() -> set[int]:
        hub = LiveHub()
        peers = PeerTurns(db_url, hub, "watcher", Own()).start()
        try:
            await asyncio.to_thread(store, 2)  # before anyone watches: not announced
            await asyncio.sleep(1.5)
            queue = hub.subscribe()
            await asyncio.to_thread(store, 3)
            return set(await announced(queue, within=5, enough=3))
        finally:
            peers.close()

    try:
        seen = asyncio.run(watch())
    finally:
        other.close()
    assert seen == {3, 4, 5}


def test_a_live_view_on_sqlite_leaves_a_turn_its_own_writer_announces_a_moment_late(tmp_path):
    """The poller may read a turn this instance's writer has committed but not announced
    yet; a turn the writer names before the next poll is not announced a second time."""
    db_url = f"sqlite:///{tmp_path / 'peers.db'}"
    writer = Writer(db_url, spool_path=str(tmp_path / "w.spool"))
    writer.start()
    own = Own()

    async def watch() -> list[int]:
        hub = LiveHub()
        peers = PeerTurns(db_url, hub, "watcher", own).start()
        try:
            queue = hub.subscribe()
            await asyncio.sleep(1.5)  # the poller knows the newest id
            body = json.dumps({"model": "m", "messages": [{"role": "user", "content": "mine"}]}).encode()
            writer.submit(TurnRecord(started_at=time.time(), method="POST", path="/v1/chat/completions",
                                     upstream="http://up", request_headers=[], request_body=body,
                                     api="openai.chat", http_status=200, stream=False, raw=b"{}", raw_size=2))
            await asyncio.to_thread(writer.flush, 10)
            await asyncio.sleep(1.2)  # read by a poll at least once by now
            own.add(1)  # the writer's own word, late
            return await announced(queue, within=2.5)
        finally:
            peers.close()

    try:
        assert asyncio.run(watch()) == []
    finally:
        writer.close()
