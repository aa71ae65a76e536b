"""Storage: secrets, durability, a locked or missing database, sessions and branches, Postgres."""

from __future__ import annotations

import json
import os
import signal
import sqlite3
import subprocess
import sys
import threading
import time
from pathlib import Path

import httpx
import pytest

from proxy.capture import TurnRecord
from proxy.scripted import Reply
from proxy.store import spool
from proxy.store.read import Reader
from proxy.store.writer import Writer
from tests.conftest import free_port, locked_sqlite, postgres_url

KEY = "sk-live-SUPERSECRET-0123456789abcdef"
GOOGLE_KEY = "AIzaSy-GOOGLESECRET-987654321"


def chat(content="hi", history=()):
    return {"model": "m", "messages": [*history, {"role": "user", "content": content}]}


def reply(text="ok"):
    return Reply.json({"id": "r", "object": "chat.completion", "model": "m",
                       "choices": [{"index": 0, "message": {"role": "assistant", "content": text},
                                    "finish_reason": "stop"}]})


def db_bytes(path: Path) -> bytes:
    return b"".join(p.read_bytes() for p in path.parent.glob(path.name + "*"))


def spooled_bodies(path: str) -> bytes:
    lines = [ln for p in (path, path + ".replaying") if Path(p).exists()
             for ln in Path(p).read_text().split("\n") if ln]
    return b"".join(spool.decode(ln).request_body for ln in lines)


def test_secrets_never_reach_the_database(tooltap, upstream):
    upstream.routes["/chat/completions"] = reply()
    upstream.routes["/v1beta/models/gemini-pro:generateContent"] = Reply.json({"candidates": []})
    httpx.post(f"{tooltap.url}/chat/completions", json=chat(),
               headers={"authorization": f"Bearer {KEY}", "x-api-key": KEY, "api-key": KEY,
                        "cookie": f"session={KEY}"})
    httpx.post(f"{tooltap.url}/v1beta/models/gemini-pro:generateContent?key={GOOGLE_KEY}&alt=json",
               json={"contents": []}, headers={"x-goog-api-key": GOOGLE_KEY})
    # The upstream did get the keys: tooltap forwards them untouched.
    assert upstream.received[0].header("authorization") == f"Bearer {KEY}"
    assert GOOGLE_KEY in upstream.received[1].query
    tooltap.flush()
    stored = db_bytes(tooltap.db_path)
    assert len(stored) > 10_000
    for secret in (KEY, GOOGLE_KEY, "SUPERSECRET", "GOOGLESECRET"):
        assert secret.encode() not in stored
    turns = tooltap.api("/turns")["turns"]
    assert any("key=…4321#" in t["path"] for t in turns)


def test_writer_flushes_on_sigterm(tmp_path, upstream):
    """A real `tooltap serve` process: a turn sent just before SIGTERM is in the database."""
    upstream.routes["/chat/completions"] = reply()
    db = tmp_path / "t.db"
    port = free_port()
    proc = subprocess.Popen(
        [sys.executable, "-m", "proxy", "serve", "--upstream", upstream.url, "--db", str(db),
         "--port", str(port)], stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    try:
        deadline = time.monotonic() + 20
        while True:
            try:
                httpx.get(f"http://127.0.0.1:{port}/_tooltap/api/turns", timeout=1)
                break
            except httpx.TransportError:
                assert time.monotonic() < deadline and proc.poll() is None, proc.stdout.read().decode()
                time.sleep(0.1)
        for i in range(5):
            httpx.post(f"http://127.0.0.1:{port}/chat/completions", json=chat(f"q{i}"))
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(20) in (0, -signal.SIGTERM)  # uvicorn re-raises the signal once shut down
    finally:
        proc.kill()
    rows = sqlite3.connect(db).execute("select count(*) from turns").fetchone()[0]
    assert rows == 5


def test_locked_database_spools_then_recovers(tooltap, upstream):
    upstream.routes["/chat/completions"] = reply("still works")
    tooltap.app.writer.engine.dispose()
    with locked_sqlite(tooltap.db_path):
        r = httpx.post(f"{tooltap.url}/chat/completions", json=chat("during the lock"), timeout=10)
        assert r.status_code == 200 and r.json()["choices"][0]["message"]["content"] == "still works"
        tooltap.flush()
        assert tooltap.app.writer.spooled == 1
        assert b"during the lock" in spooled_bodies(tooltap.app.writer.spool.path)
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        turns = tooltap.api("/turns")["turns"]
        if turns:
            break
        time.sleep(0.2)
    assert len(turns) == 1
    assert tooltap.api(f"/turns/{turns[0]['id']}")["request"]["messages"][0]["content"] == "during the lock"
    assert not tooltap.app.writer.spool.pending()


def test_unavailable_database_never_breaks_the_request(make_tooltap, upstream, tmp_path):
    upstream.routes["/chat/completions"] = reply("served")
    tt = make_tooltap(upstream.url)
    # The database file's directory disappears from under the writer.
    tt.app.writer.engine.dispose()
    for p in tt.db_path.parent.glob(tt.db_path.name + "*"):
        p.unlink()
    tt.db_path.mkdir()  # a directory where the file was: sqlite cannot open it
    r = httpx.post(f"{tt.url}/chat/completions", json=chat("lost?"))
    assert r.json()["choices"][0]["message"]["content"] == "served"
    tt.flush()
    assert tt.app.writer.spooled == 1
    assert b"lost?" in spooled_bodies(tt.app.writer.spool.path)


def test_sessions_threading_branches_and_header(tooltap, upstream):
    upstream.routes["/chat/completions"] = reply()
    post = lambda body, **h: httpx.post(f"{tooltap.url}/chat/completions", json=body, headers=h)
    sys_msg = {"role": "system", "content": "You are terse."}
    a1 = [sys_msg, {"role": "user", "content": "task A"}]
    post({"model": "m", "messages": a1})
    a2 = a1 + [{"role": "assistant", "content": "ok"}, {"role": "user", "content": "more"}]
    post({"model": "m", "messages": a2})
    post({"model": "m", "messages": a2})  # a retry of turn 2
    a_edit = a1 + [{"role": "assistant", "content": "ok"}, {"role": "user", "content": "edited"}]
    post({"model": "m", "messages": a_edit})  # an edited history
    post({"model": "m", "messages": [sys_msg, {"role": "user", "content": "task B"}]})  # same system, new task
    post({"model": "m", "messages": [{"role": "user", "content": "task C"}]}, **{"X-Tooltap-Session": "pinned"})
    post({"model": "m", "messages": [{"role": "user", "content": "unrelated"}]}, **{"X-Tooltap-Session": "pinned"})

    sessions = {s["title"]: s for s in tooltap.api("/sessions")["sessions"]}
    assert set(sessions) == {"task A", "task B", "task C"}
    a = tooltap.api(f"/sessions/{sessions['task A']['id']}")
    t1, t2, t3, t4 = a["turns"]
    assert (t1["parent_id"], t2["parent_id"], t3["parent_id"], t4["parent_id"]) == (None, t1["id"], t1["id"], t1["id"])
    assert sessions["task C"]["id"] == "pinned" and sessions["task C"]["turns"] == 2


def test_request_rebuilds_exactly_with_system_prompt(tooltap, upstream):
    upstream.routes["/v1/messages"] = Reply.json({"id": "msg", "type": "message", "role": "assistant",
                                                  "content": [{"type": "text", "text": "hi"}],
                                                  "model": "claude", "stop_reason": "end_turn",
                                                  "usage": {"input_tokens": 3, "output_tokens": 1}})
    body = {"model": "claude", "max_tokens": 10, "system": [{"type": "text", "text": "Be brief."}],
            "messages": [{"role": "user", "content": "hello"}],
            "tools": [{"name": "t", "input_schema": {"type": "object"}}], "stream": False}
    httpx.post(f"{tooltap.url}/v1/messages", json=body)
    turn = tooltap.api(f"/turns/{tooltap.api('/turns')['turns'][0]['id']}")
    assert turn["api"] == "anthropic.messages"
    assert turn["request"] == body and list(turn["request"]) == list(body)
    assert turn["response"]["content"][0]["text"] == "hi"
    assert tooltap.api("/sessions")["sessions"][0]["input_tokens"] == 3


def _record(i: int, messages: list, prompt_tokens: int = 0) -> TurnRecord:
    body = json.dumps({"model": "m", "messages": messages}).encode()
    raw = json.dumps({"choices": [], "usage": {"prompt_tokens": prompt_tokens, "completion_tokens": 1}}).encode()
    return TurnRecord(started_at=1_700_000_000 + i, method="POST", path="/chat/completions",
                      upstream="http://up", request_headers=[], request_body=body, api="openai.chat",
                      http_status=200, raw=raw, raw_size=len(raw),
                      response_headers=[["content-type", "application/json"]])


@pytest.mark.parametrize("backend", ["sqlite", "postgres"])
def test_writer_and_reader_on_each_backend(backend, tmp_path):
    if backend == "sqlite":
        url = f"sqlite:///{tmp_path / 'w.db'}"
    else:
        url = postgres_url()
        if url is None:
            pytest.skip("no Postgres here: set TOOLTAP_TEST_POSTGRES (.ci/run does)")
        from sqlalchemy import create_engine, text

        with create_engine(url).begin() as conn:  # a clean schema for this run
            conn.execute(text("DROP SCHEMA public CASCADE; CREATE SCHEMA public"))
    writer = Writer(url, spool_path=str(tmp_path / "spool"))
    writer.start()
    history = []
    for i in range(6):
        history = history + [{"role": "user", "content": f"step {i} ✓ \u2028 sep \u0000 nul"}]
        writer.submit(_record(i, history, prompt_tokens=1_500_000_000))
        history = history + [{"role": "assistant", "content": f"done {i}"}]
    writer.flush()
    writer.close()
    assert writer.written == 6 and writer.spooled == 0
    reader = Reader(writer.engine)
    sessions = reader.sessions()
    assert len(sessions) == 1 and sessions[0]["turns"] == 6
    assert sessions[0]["input_tokens"] == 9_000_000_000  # past 2**31: a Postgres BIGINT (migration 0009)
    turns = reader.session(sessions[0]["id"])["turns"]
    assert [t["parent_id"] for t in turns] == [None] + [t["id"] for t in turns[:-1]]
    last = reader.turn(turns[-1]["id"])
    assert last["request"]["messages"] == history[:-1]
    # Restarting migrates nothing and keeps everything.
    again = Writer(url, spool_path=str(tmp_path / "spool"))
    again.start()
    again.close()
    assert len(Reader(again.engine).turns()) == 6


def test_system_prompt_change_stays_in_the_session(tooltap, upstream):
    """Cline rebuilds its system prompt when MCP servers or rules change mid-task."""
    upstream.routes["/chat/completions"] = reply()
    first = [{"role": "system", "content": "v1"}, {"role": "user", "content": "the task"}]
    second = [{"role": "system", "content": "v2 with a new MCP server"}, {"role": "user", "content": "the task"},
              {"role": "assistant", "content": "ok"}, {"role": "user", "content": "go on"}]
    only_system = [{"role": "system", "content": "just a system prompt"}]
    for messages in (first, second, only_system):
        httpx.post(f"{tooltap.url}/chat/completions", json={"model": "m", "messages": messages})
    sessions = tooltap.api("/sessions")["sessions"]
    task = next(s for s in sessions if s["title"] == "the task")
    assert task["turns"] == 2
    turns = tooltap.api(f"/sessions/{task['id']}")["turns"]
    assert turns[1]["parent_id"] == turns[0]["id"]
    rebuilt = [tooltap.api(f"/turns/{t['id']}")["request"]["messages"] for t in turns]
    assert rebuilt == [first, second]
    last = tooltap.api("/turns")["turns"][0]
    assert tooltap.api(f"/turns/{last['id']}")["request"]["messages"] == only_system


def test_unusable_session_header_and_nul_text_are_stored(tooltap, upstream):
    upstream.routes["/chat/completions"] = reply("a\u0000b")
    long_hint = "x" * 300
    r = httpx.post(f"{tooltap.url}/chat/completions", json=chat("nul \u0000 inside"),
                   headers={"x-tooltap-session": long_hint})
    assert r.status_code == 200
    (session,) = tooltap.api("/sessions")["sessions"]
    assert session["id"].startswith("h-") and len(session["id"]) <= 64
    assert tooltap.app.writer.written == 1


def test_a_session_named_dot_or_dot_dot_gets_a_page_of_its_own(tooltap, upstream):
    """`.` and `..` as a session's name would make its link lead to the sessions list (a
    browser resolves them, escaped or not): they are named by a hash, each its own. (Within a
    longer name the link escapes its `/`: test_inspector_pages, `../../escape`.)"""
    upstream.routes["/chat/completions"] = reply("ok")
    for name in (".", ".."):
        r = httpx.post(f"{tooltap.url}/chat/completions", json=chat(f"named {name}"),
                       headers={"x-tooltap-session": name})
        assert r.status_code == 200
    tooltap.flush()
    ids = sorted(s["id"] for s in tooltap.api("/sessions")["sessions"])
    assert len(ids) == 2 and all(i.startswith("h-") for i in ids)
    for i in ids:
        page = httpx.get(f"{tooltap.url}/_tooltap/sessions/{i}")
        assert page.status_code == 200 and "named ." in page.text


def test_a_turn_that_cannot_be_stored_does_not_hold_back_the_others(tmp_path, monkeypatch):
    from proxy.store import ingest

    real_add = ingest.Ingestor.add

    def add(self, rec):
        if b"poison" in rec.request_body:
            raise ValueError("a value this database refuses")
        return real_add(self, rec)

    monkeypatch.setattr(ingest.Ingestor, "add", add)
    writer = Writer(f"sqlite:///{tmp_path / 'w.db'}", spool_path=str(tmp_path / "spool"))
    writer.start()
    for i, text in enumerate(["before", "poison", "after"]):
        writer.submit(_record(i, [{"role": "user", "content": text}]))
    writer.flush()
    writer.close()
    assert writer.written == 2
    assert not writer.spool.pending()  # nothing waits behind it
    quarantined = Path(writer.spool.failed_path).read_text().split("\n")
    assert [spool.decode(line).request_body for line in quarantined if line] == [
        _record(1, [{"role": "user", "content": "poison"}]).request_body]


def test_turns_land_in_order_after_an_outage(tooltap, upstream):
    """A turn sent just after the database comes back waits behind the spooled ones, so
    the session threads as the agent lived it."""
    upstream.routes["/chat/completions"] = reply()
    post = lambda messages: httpx.post(f"{tooltap.url}/chat/completions", json={"model": "m", "messages": messages})
    t1 = [{"role": "user", "content": "ordered task"}]
    t2 = t1 + [{"role": "assistant", "content": "ok"}, {"role": "user", "content": "two"}]
    t3 = t2 + [{"role": "assistant", "content": "ok"}, {"role": "user", "content": "three"}]
    post(t1)
    tooltap.flush()
    tooltap.app.writer.engine.dispose()
    with locked_sqlite(tooltap.db_path):
        post(t2)
        tooltap.flush()
        assert tooltap.app.writer.spooled == 1
    post(t3)  # the database answers again, but turn 2 is still in the spool
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline and len(tooltap.api("/turns")["turns"]) < 3:
        time.sleep(0.2)
    session = tooltap.api("/sessions")["sessions"][0]
    turns = tooltap.api(f"/sessions/{session['id']}")["turns"]
    assert [len(tooltap.api(f"/turns/{t['id']}")["request"]["messages"]) for t in turns] == [1, 3, 5]
    assert [t["parent_id"] for t in turns] == [None, turns[0]["id"], turns[1]["id"]]


def test_requests_without_a_conversation_share_one_session(tooltap, upstream):
    upstream.routes["/v1/models"] = Reply.json({"data": []})
    upstream.routes["/chat/completions"] = reply()
    for _ in range(3):
        httpx.get(f"{tooltap.url}/v1/models")
    httpx.post(f"{tooltap.url}/chat/completions", json=chat("a real task"))
    sessions = {s["title"]: s for s in tooltap.api("/sessions")["sessions"]}
    assert set(sessions) == {"Requests without a conversation", "a real task"}
    assert sessions["Requests without a conversation"]["turns"] == 3


def test_a_dead_writer_process_is_replaced_and_loses_nothing(tooltap, upstream):
    upstream.routes["/chat/completions"] = reply()
    httpx.post(f"{tooltap.url}/chat/completions", json=chat("before"))
    tooltap.flush()
    writer = tooltap.app.writer
    first = writer._process
    os.kill(first.pid, signal.SIGKILL)
    first.join(5)
    httpx.post(f"{tooltap.url}/chat/completions", json=chat("after the crash"))
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline and len(tooltap.api("/turns")["turns"]) < 2:
        time.sleep(0.2)
    assert writer._process is not first and writer._process.is_alive()
    assert [t["id"] for t in tooltap.api("/turns")["turns"]] and len(tooltap.api("/turns")["turns"]) == 2


def test_turns_the_writer_never_confirmed_are_spooled_at_close(tmp_path):
    """A writer process that is gone for good at shutdown: the proxy still has the turns."""
    from proxy.store.process import WriterProcess

    writer = WriterProcess(f"sqlite:///{tmp_path / 'w.db'}", spool_path=str(tmp_path / "spool"))
    writer.start()
    writer._closing = True  # no replacement: this writer stays dead
    os.kill(writer._process.pid, signal.SIGKILL)
    writer._process.join(5)
    writer.submit(_record(0, [{"role": "user", "content": "kept anyway"}]))
    writer.close(timeout=1)
    assert b"kept anyway" in spooled_bodies(writer.spool.path)


def test_a_flush_waiting_on_a_writer_that_dies_is_answered_by_its_successor(tmp_path):
    from proxy.store.process import WriterProcess

    writer = WriterProcess(f"sqlite:///{tmp_path / 'w.db'}", spool_path=str(tmp_path / "spool"))
    writer.start()
    try:
        first = writer._process.pid
        os.kill(first, signal.SIGSTOP)  # the flush reaches it, and it never answers
        writer.submit(_record(0, [{"role": "user", "content": "flushed across a crash"}]))
        started = time.monotonic()
        flushing = threading.Thread(target=writer.flush, args=(30,))
        flushing.start()
        time.sleep(0.5)
        os.kill(first, signal.SIGKILL)
        flushing.join(30)
        took = time.monotonic() - started
        assert writer._process.pid != first and took < 15, took  # not the whole timeout
        assert writer.written == 1
    finally:
        writer.close(timeout=10)
    with sqlite3.connect(tmp_path / "w.db") as conn:
        assert conn.execute("select count(*) from turns").fetchone()[0] == 1


def test_the_spool_keeps_whole_lines_through_a_full_disk_and_a_torn_tail(tmp_path, monkeypatch):
    """A write the disk cuts short leaves nothing behind; a torn line left by a killed run
    is ended before the next append, so no turn is glued onto it; and a line that cannot
    be set aside in `.bad` (the disk still full) stays, with the turns after it, for a
    later replay instead of stopping the writer."""
    s = spool.Spool(str(tmp_path / "spool.jsonl"))
    s.append([_record(0, [{"role": "user", "content": "zero"}])])
    whole = os.path.getsize(s.path)
    real_write = os.write

    def half_then_full(fd, data):
        real_write(fd, bytes(data[: len(data) // 2]))
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(os, "write", half_then_full)
    with pytest.raises(OSError):
        s.append([_record(1, [{"role": "user", "content": "one"}])])
    monkeypatch.setattr(os, "write", real_write)
    assert os.path.getsize(s.path) == whole  # taken back

    with open(s.path, "ab") as f:  # a run killed mid-line
        f.write(b'{"started_at": 17000')
    s.append([_record(2, [{"role": "user", "content": "two"}]), _record(3, [{"role": "user", "content": "three"}])])
    real_open = open

    def no_room_for_bad(path, *args, **kwargs):
        if str(path).endswith(".bad"):
            raise OSError(28, "No space left on device")
        return real_open(path, *args, **kwargs)

    monkeypatch.setattr("builtins.open", no_room_for_bad)
    got = [r.started_at for batch, _ in s.replay(100, 1 << 20) for r in batch]
    assert got == [1_700_000_000]  # up to the torn line
    assert s.done() is False and s.pending()  # the rest waits
    monkeypatch.setattr("builtins.open", real_open)
    got = [r.started_at for batch, _ in s.replay(100, 1 << 20) for r in batch]
    assert got == [1_700_000_002, 1_700_000_003]  # the torn line went to .bad, the turns after it replayed
    assert s.done() is True and not s.pending()
    assert (tmp_path / "spool.jsonl.bad").read_bytes() == b'{"started_at": 17000\n'
