"""`tooltap prune` and `tooltap stats` on real stores: turns made by a real tooltap and a
scripted upstream (or by the writer itself, for Postgres), aged by moving their
started_at back, then pruned while the writer keeps storing."""

from __future__ import annotations

import json
import os
import random
import re
import sqlite3
import subprocess
import sys
import threading
import time

import httpx
import pytest
from sqlalchemy import text

from proxy.capture import TurnRecord
from proxy.scripted import Reply
from proxy.store.db import make_engine, migrate
from proxy.store.read import Reader
from proxy.store.retention import parse_duration, prune
from proxy.store.stats import store_stats
from proxy.store.writer import Writer
from tests.conftest import in_schema, postgres_schema

DAY = 86400
CLI = [sys.executable, "-m", "proxy"]
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))  # this checkout's proxy, from any folder


def cli(*args: str, db=None) -> subprocess.CompletedProcess:
    env = {**os.environ, "TOOLTAP_DB": str(db)} if db else None
    return subprocess.run([*CLI, *args], capture_output=True, text=True, timeout=60, env=env)


def completion(text_: str, call: str | None = None) -> dict:
    message = {"role": "assistant", "content": text_}
    if call:
        message["tool_calls"] = [{"id": f"call_{call}", "type": "function",
                                  "function": {"name": "get_weather", "arguments": json.dumps({"city": call})}}]
    return {"id": "c", "object": "chat.completion", "model": "m1", "choices": [{"index": 0, "message": message}],
            "usage": {"prompt_tokens": 10, "completion_tokens": 3}}


def tools(name: str) -> list:
    return [{"type": "function", "function": {"name": name, "parameters": {"type": "object"}}}]


def conversation(key: str, turns: int, *, filler: int = 0, tool: str = "get_weather") -> list[bytes]:
    """The request bodies of an agent's `turns` turns: each resends the history before it.
    `filler`: random bytes of text in the first message (space a prune can give back)."""
    rng = random.Random(key)
    first = f"task {key} " + "".join(rng.choice("0123456789abcdef") for _ in range(filler))
    messages = [{"role": "system", "content": "you are a shared system prompt"},
                {"role": "user", "content": first}]
    bodies = []
    for n in range(turns):
        bodies.append(json.dumps({"model": "m1", "messages": messages, "tools": tools(tool)}).encode())
        messages = messages + [{"role": "assistant", "content": f"{key} answer {n}"},
                               {"role": "user", "content": f"{key} question {n + 1}"}]
    return bodies


def send(tooltap, bodies: list[bytes]) -> None:
    with httpx.Client(base_url=tooltap.url, timeout=30) as client:
        for body in bodies:
            client.post("/chat/completions", content=body, headers={"content-type": "application/json"})
    tooltap.flush()


def sql(db_path, query: str, *args):
    with sqlite3.connect(db_path) as c:
        return c.execute(query, args).fetchall()


def age(db_path, days: float, where: str, *args) -> None:
    with sqlite3.connect(db_path) as c:
        c.execute(f"UPDATE turns SET started_at = started_at - ? WHERE {where}", (days * DAY, *args))


def counts(db_path) -> dict:
    return {t: sql(db_path, f"SELECT count(*) FROM {t}")[0][0]
            for t in ("turns", "sessions", "blobs", "chain_nodes", "tool_calls")}


def assert_one_line_error(r, needle: str) -> None:
    assert r.returncode == 2, (r.stdout, r.stderr)
    assert "Traceback" not in r.stderr
    errors = [line for line in r.stderr.splitlines() if line.startswith("Error")]
    assert len(errors) == 1 and needle in errors[0], r.stderr


# -- SQLite, through a real tooltap ---------------------------------------------------------

def test_prune_deletes_old_turns_and_only_what_nothing_else_uses(tooltap, upstream):
    upstream.routes["/chat/completions"] = Reply.json(completion("ok", call="Paris"))
    old = conversation("old", 3, filler=400_000, tool="old_only")
    mixed = conversation("mixed", 4)
    new = conversation("new", 2)
    send(tooltap, old + mixed + new)
    db = tooltap.db_path
    by_size = {n: sid for sid, n in sql(db, "SELECT session_id, count(*) FROM turns GROUP BY session_id")}
    old_sid, mixed_sid, new_sid = by_size[3], by_size[4], by_size[2]
    mixed_ids = [i for (i,) in sql(db, "SELECT id FROM turns WHERE session_id = ? ORDER BY id", mixed_sid)]
    age(db, 40, "session_id = ?", old_sid)
    age(db, 35, "id IN (?, ?)", *mixed_ids[:2])
    before = counts(db)
    pages_before = sql(db, "PRAGMA page_count")[0][0]

    r = cli("prune", "--older-than", "30d", db=db)  # while the tooltap runs
    assert r.returncode == 0, r.stderr
    # The old task's own blobs: its 5 messages (the system prompt is shared) and its tools.
    assert r.stdout.startswith("pruned 5 turns, 1 session, 6 blobs, 5 chain nodes, 0 MCP messages; reclaimed "), r.stdout
    after = counts(db)
    assert before["turns"] - after["turns"] == 5
    assert before["sessions"] - after["sessions"] == 1
    assert before["blobs"] - after["blobs"] == 6
    assert before["chain_nodes"] - after["chain_nodes"] == 5  # the mixed task's nodes all still lead somewhere
    assert before["tool_calls"] - after["tool_calls"] == 5
    assert sql(db, "PRAGMA page_count")[0][0] < pages_before * 0.6  # the 400 KB of text given back
    assert sql(db, "PRAGMA freelist_count")[0][0] == 0

    listed = tooltap.api("/sessions")["sessions"]
    assert sorted(s["id"] for s in listed) == sorted([mixed_sid, new_sid])
    mixed_now = tooltap.api(f"/sessions/{mixed_sid}")
    assert [t["id"] for t in mixed_now["turns"]] == mixed_ids[2:]
    row = sql(db, "SELECT turns, tool_calls, input_tokens, errors, started_at, last_at FROM sessions WHERE id = ?",
              mixed_sid)[0]
    first, last = sql(db, "SELECT min(started_at), max(started_at) FROM turns WHERE session_id = ?", mixed_sid)[0]
    assert row == (2, 2, 20, 0, first, last)
    turn = tooltap.api(f"/turns/{mixed_ids[2]}")
    assert turn["parent_id"] is None  # its parent was pruned: it starts the session now
    assert turn["request"] == json.loads(mixed[2])  # messages, system prompt and tools all still there
    assert tooltap.api(f"/turns/{mixed_ids[3]}")["request"] == json.loads(mixed[3])

    send(tooltap, conversation("old", 4)[3:])  # the pruned task goes on: its blobs are stored again
    latest = tooltap.api("/turns?limit=1")["turns"][0]
    assert tooltap.api(f"/turns/{latest['id']}")["request"] == json.loads(conversation("old", 4)[3])


def test_keep_errors_and_dry_run(tooltap, upstream):
    upstream.routes["/chat/completions"] = [Reply.json(completion("fine")),
                                            Reply.json({"error": {"message": "overloaded"}}, status=529)]
    bodies = conversation("flaky", 2)
    send(tooltap, bodies)
    db = tooltap.db_path
    assert [s for (s,) in sql(db, "SELECT status FROM turns ORDER BY id")] == ["ok", "upstream_error"]
    age(db, 3, "1 = 1")
    before = counts(db)
    r = cli("prune", "--older-than", "2d", "--dry-run", db=db)
    assert r.returncode == 0, r.stderr
    # its 3 messages, the system prompt and the tools: nothing else uses them
    assert r.stdout.startswith("would prune 2 turns, 1 session, 5 blobs, 3 chain nodes"), r.stdout
    assert counts(db) == before

    r = cli("prune", "--older-than", "48h", "--keep-errors", db=db)
    assert r.returncode == 0, r.stderr
    assert r.stdout.startswith("pruned 1 turn, 0 sessions, 0 blobs"), r.stdout
    (error_id,) = sql(db, "SELECT id FROM turns")[0]
    turn = tooltap.api(f"/turns/{error_id}")
    assert turn["status"] == "upstream_error" and turn["parent_id"] is None
    assert turn["request"] == json.loads(bodies[1])
    (session,) = tooltap.api("/sessions")["sessions"]
    assert (session["turns"], session["errors"]) == (1, 1)


def test_a_dry_run_and_the_prune_it_foresees_say_the_same(tooltap, upstream):
    upstream.routes["/chat/completions"] = Reply.json(completion("fine"))
    send(tooltap, conversation("once", 3))
    age(tooltap.db_path, 3, "1 = 1")
    engine = make_engine(f"sqlite:///{tooltap.db_path}", busy_timeout=30.0)
    try:
        foreseen = prune(engine, 2 * DAY, dry_run=True, vacuum="none")
        done = prune(engine, 2 * DAY, vacuum="none")
    finally:
        engine.dispose()
    # the chain nodes in both, and one session said in the singular
    assert foreseen.what() == done.what() == "3 turns, 1 session, 7 blobs, 5 chain nodes, 0 MCP messages"


def test_stats_counts_and_growth_per_day(tooltap, upstream):
    upstream.routes["/chat/completions"] = Reply.json(completion("hi"))
    send(tooltap, conversation("a", 3) + conversation("b", 2))
    db = tooltap.db_path
    ids = [i for (i,) in sql(db, "SELECT id FROM turns ORDER BY id")]
    age(db, 1, "id = ?", ids[0])
    age(db, 3, "id IN (?, ?)", *ids[1:3])
    r = cli("stats", "--json", "--days", "5", db=db)
    assert r.returncode == 0, r.stderr
    s = json.loads(r.stdout)
    assert (s["turns"], s["sessions"], s["errors"]) == (5, 2, 0)
    assert [d["turns"] for d in s["days"]] == [0, 2, 0, 1, 2]
    wire = sql(db, "SELECT sum(request_size + raw_size) FROM turns WHERE id IN (?, ?)", *ids[1:3])[0][0]
    assert s["days"][1]["wire_bytes"] == wire
    assert s["database_bytes"] == sql(db, "PRAGMA page_count")[0][0] * sql(db, "PRAGMA page_size")[0][0]
    api = httpx.get(f"{tooltap.url}/_tooltap/api/stats?days=5").json()
    assert api["turns"] == 5 and [d["turns"] for d in api["days"]] == [0, 2, 0, 1, 2]
    assert (api["mcp_messages"], api["mcp_servers"]) == (0, 0)

    from proxy.mcp.store import Connection, Recorder  # MCP traffic counts too: two messages two days ago

    recorder = Recorder(f"sqlite:///{db}", db.parent / "mcp-spool")
    recorder.start()
    run = Connection("run-stats", "stdio", name="weather", started_at=time.time() - 2 * DAY)
    sent = [json.dumps(_call(1, "get_forecast", {"latitude": 1})).encode(), json.dumps(_answer(1, "sunny")).encode()]
    for direction, raw in zip(("to_server", "from_server"), sent):
        recorder.record(run, direction, raw, at=time.time() - 2 * DAY)
    recorder.close()
    s = json.loads(cli("stats", "--json", "--days", "5", db=db).stdout)
    assert (s["mcp_messages"], s["mcp_bytes"], s["mcp_servers"], s["mcp_connections"]) == (
        2, sum(map(len, sent)), 1, 1)
    assert [d["mcp_messages"] for d in s["days"]] == [0, 0, 2, 0, 0]
    table = cli("stats", db=db)
    assert table.returncode == 0 and "turns 5" in table.stdout and "growth" in table.stdout
    assert f"MCP messages 2 ({sum(map(len, sent))} bytes), servers 1, connections 1" in table.stdout
    assert re.search(r"^last turn  \d{4}-\d\d-\d\d \d\d:\d\d:\d\d\.\d{3} UTC$", table.stdout, re.M), table.stdout
    # a day's few kilobytes are said in KB (they read "0.0" in a column of MB)
    assert re.search(rf"\b{wire / 1e3:.1f} KB\b", table.stdout), table.stdout


@pytest.mark.parametrize("args, needle", [
    (["prune", "--older-than", "30x"], "is not an age"),
    (["prune", "--older-than", "0d"], "is not an age"),
    (["prune", "--older-than", "30d"], "no tooltap database"),
    (["stats"], "no tooltap database"),
])
def test_bad_ages_and_missing_database_are_one_line(tmp_path, args, needle):
    r = subprocess.run([*CLI, *args, "--db", str(tmp_path / "none.db")], capture_output=True, text=True,
                       timeout=60, cwd=tmp_path, env={**os.environ, "PYTHONPATH": ROOT})
    assert_one_line_error(r, needle)
    assert list(tmp_path.iterdir()) == []


def test_a_file_made_before_prune_is_vacuumed_once_then_in_steps(tmp_path):
    db = tmp_path / "old.db"
    with sqlite3.connect(db) as c:  # as tooltap made files before: auto_vacuum off
        c.execute("PRAGMA auto_vacuum=NONE")
        c.execute("CREATE TABLE scratch (x)")
    url = f"sqlite:///{db}"
    writer = Writer(url, str(tmp_path / "spool.jsonl"))
    writer.start()
    now = time.time()
    for k in range(6):
        writer.submit(record(conversation(f"t{k}", 1, filler=100_000)[0], now - (k + 1) * DAY))
    writer.close()
    engine = make_engine(url)
    first = prune(engine, 3.5 * DAY)
    # The file gives back (nearly) what the pruned turns held, whatever else it holds.
    freed = lambda r: (r.size_before - r.size_after) / (r.blob_bytes + r.turn_bytes)  # noqa: E731
    assert (first.turns, first.vacuum) == (3, "full") and freed(first) > 0.8, first
    assert sql(db, "PRAGMA auto_vacuum")[0][0] == 2  # incremental from now on
    second = prune(engine, 1.5 * DAY)
    assert (second.turns, second.vacuum) == (2, "incremental") and freed(second) > 0.8, second
    engine.dispose()


def test_ages():
    assert [parse_duration(v) for v in ("90m", "12h", "30d", "2w")] == [5400, 43200, 30 * DAY, 14 * DAY]


# -- while the writer stores: SQLite and Postgres ---------------------------------------------

@pytest.fixture(params=["sqlite", "postgres"])
def engine_url(request, tmp_path):
    """(URL, schema or None): Postgres gets a schema of its own in the test database."""
    if request.param == "sqlite":
        yield f"sqlite:///{tmp_path / 'w.db'}", None
        return
    schema = f"prune_{os.getpid()}"
    url = postgres_schema(schema)
    yield url, schema
    with make_engine(url).begin() as conn:
        conn.execute(text(f"DROP SCHEMA IF EXISTS {schema} CASCADE"))


def record(body: bytes, at: float) -> TurnRecord:
    raw = json.dumps(completion("done")).encode()
    return TurnRecord(started_at=at, method="POST", path="/chat/completions", upstream="http://up",
                      request_headers=[["content-type", "application/json"]], request_body=body, api="openai.chat",
                      http_status=200, raw=raw, raw_size=len(raw), response_headers=[["content-type", "application/json"]])


def test_prune_while_the_writer_stores_loses_nothing(engine_url, tmp_path):
    url, schema = engine_url
    engine = in_schema(make_engine(url, busy_timeout=30), schema)
    migrate(engine)
    writer = Writer(url, str(tmp_path / "spool.jsonl"))
    in_schema(writer.engine, schema)
    writer.start()
    now = time.time()
    try:
        # Old tasks whose tools array is shared by the new turns only after the prune deleted it.
        for k in range(20):
            writer.submit(record(conversation(f"old{k}", 1, tool=f"tool{k % 3}")[0], now - 40 * DAY))
        writer.flush()
        stop, sent, prunes = threading.Event(), [], []

        def keep_pruning():
            while not stop.is_set():
                prunes.append(prune(engine, 30 * DAY, batch=3))  # vacuum steps too

        pruner = threading.Thread(target=keep_pruning)
        pruner.start()
        for k in range(60):  # new turns, some continuing old tasks, all naming the old tools
            body = conversation(f"old{k % 25}", 2 + k // 25, tool=f"tool{k % 3}")[-1]
            writer.submit(record(body, now))
            sent.append(body)
            if k % 5 == 0:
                writer.submit(record(conversation(f"late{k}", 1, tool=f"tool{k % 3}")[0], now - 40 * DAY))
            time.sleep(0.01)
        writer.flush()
        stop.set()
        pruner.join(30)
        last = prune(engine, 30 * DAY, batch=3, vacuum="none")
        writer.flush()
    finally:
        writer.close()
    assert sum(p.turns for p in prunes) + last.turns == 20 + 12 and sum(p.blobs for p in prunes) > 0
    reader = Reader(engine)
    with engine.connect() as conn:
        ids = [i for (i,) in conn.execute(text("SELECT id FROM turns ORDER BY id"))]
        assert conn.execute(text("SELECT count(*) FROM turns WHERE started_at < :c"), {"c": now - DAY}).scalar() == 0
        sessions = conn.execute(text("SELECT count(*), sum(turns) FROM sessions")).one()
    assert len(ids) == len(sent)
    assert sorted(json.dumps(reader.turn(i)["request"], sort_keys=True) for i in ids) == \
        sorted(json.dumps(json.loads(b), sort_keys=True) for b in sent)
    assert sessions[1] == len(sent)
    stats = store_stats(engine, days=2, now=now)
    assert stats.turns == len(sent) and stats.days[-1].turns == len(sent)
    engine.dispose()


# -- MCP: a call goes or stays whole -----------------------------------------------------------

def _call(i, tool: str, arguments: dict) -> dict:
    return {"jsonrpc": "2.0", "id": i, "method": "tools/call", "params": {"name": tool, "arguments": arguments}}


def _answer(i, text_: str, is_error: bool = False) -> dict:
    return {"jsonrpc": "2.0", "id": i, "result": {"content": [{"type": "text", "text": text_}], "isError": is_error}}


def mcp_traffic(old: float, new: float) -> list[tuple[str, str, dict, float]]:
    """(connection, direction, message, at). Run "a", all before the cutoff: an exchange and a
    call that went fine, a tool error (isError), a JSON-RPC error, and a batch of two calls
    of which one failed. Run "b": a call sent before the cutoff, answered after it."""
    up, down = "to_server", "from_server"
    return [
        ("a", up, {"jsonrpc": "2.0", "id": 0, "method": "initialize", "params": {}}, old),
        ("a", down, {"jsonrpc": "2.0", "id": 0, "result": {"serverInfo": {"name": "weather"}}}, old + 1),
        ("a", up, {"jsonrpc": "2.0", "method": "notifications/initialized"}, old + 2),
        ("a", up, _call(1, "get_forecast", {"latitude": 1}), old + 3),
        ("a", down, _answer(1, "sunny"), old + 4),
        ("a", up, _call(2, "get_forecast", {"latitude": 999}), old + 5),
        ("a", down, _answer(2, "latitude out of range", is_error=True), old + 6),
        ("a", up, _call(3, "get_alerts", {"state": "XX"}), old + 7),
        ("a", down, {"jsonrpc": "2.0", "id": 3, "error": {"code": -32602, "message": "no state XX"}}, old + 8),
        ("a", up, [_call(4, "get_alerts", {"state": "CA"}), _call(5, "get_alerts", {"state": "ZZ"})], old + 9),
        ("a", down, _answer(4, "no alerts"), old + 10),
        ("a", down, {"jsonrpc": "2.0", "id": 5, "error": {"code": -32602, "message": "no state ZZ"}}, old + 11),
        ("b", up, _call(1, "get_forecast", {"latitude": 2}), old + 20),
        ("b", down, _answer(1, "rain"), new),
    ]


def test_keep_errors_keeps_an_mcp_call_whole(tooltap):
    """The tester's case: `--keep-errors` kept MCP error answers alone, and the server's page
    showed bare red answers, "0 tools/call". Now each failed call keeps its request (a batch:
    every call in it), and a call the cutoff cuts through stays whole even without the flag."""
    from proxy.mcp.store import Connection, Recorder

    db, now = tooltap.db_path, time.time()
    recorder = Recorder(f"sqlite:///{db}", db.parent / "mcp-spool")
    recorder.start()
    runs = {run: Connection(f"run-{run}-{os.getpid()}", "stdio", name="weather", started_at=now - 3 * DAY)
            for run in "ab"}
    for run, direction, message, at in mcp_traffic(now - 3 * DAY, now - 60):
        recorder.record(runs[run], direction, json.dumps(message).encode(), at=at)
    recorder.ended(runs["a"], 0)
    recorder.close()
    assert sql(db, "SELECT count(*) FROM mcp_messages")[0][0] == 14
    (server,) = tooltap.api("/mcp/servers")["servers"]
    assert server["calls"] == 6  # the two in the batch counted

    def calls() -> list[tuple]:
        report = tooltap.api("/mcp/servers/weather")
        return sorted((c["connection"][4], c["tool"], json.dumps(c["arguments"]), c["is_error"], c["result_text"])
                      for c in report["recent_calls"])

    def cut(*args: str) -> str:
        r = cli("prune", "--older-than", "1d", *args, db=db)  # while the tooltap runs
        assert r.returncode == 0, r.stderr
        return r.stdout

    assert "5 MCP messages" in cut("--keep-errors", "--dry-run")
    assert "5 MCP messages" in cut("--keep-errors")  # initialize, its answer, initialized, call 1 and its answer
    assert calls() == [
        ("a", "get_alerts", '{"state": "CA"}', False, "no alerts"),  # in the batch with call 5
        ("a", "get_alerts", '{"state": "XX"}', True, "no state XX"),
        ("a", "get_alerts", '{"state": "ZZ"}', True, "no state ZZ"),
        ("a", "get_forecast", '{"latitude": 999}', True, "latitude out of range"),
        ("b", "get_forecast", '{"latitude": 2}', False, "rain")]
    html = httpx.get(f"{tooltap.url}/_tooltap/mcp/weather", headers={"accept": "text/html"}).text
    assert "no tools/call recorded" not in html and "no state XX" in html and "no answer" not in html

    assert "7 MCP messages" in cut()  # the errors go too now; run b's call still stays whole
    assert calls() == [("b", "get_forecast", '{"latitude": 2}', False, "rain")]


def test_connections_that_never_said_they_ended_go_once_empty(tmp_path):
    """An HTTP session is rarely closed: once its messages are pruned, its row goes too. A
    stdio run that never said it ended stays (its end may yet come), as does one in use."""
    from proxy.mcp.store import Connection, Recorder

    db, now = tmp_path / "t.db", time.time()
    recorder = Recorder(f"sqlite:///{db}", tmp_path / "mcp-spool")
    recorder.start()
    quiet = Connection("quiet-http", "http", name="weather", started_at=now - 3 * DAY)
    killed = Connection("killed-stdio", "stdio", name="weather", started_at=now - 3 * DAY)
    busy = Connection("busy-stdio", "stdio", name="weather", started_at=now - 3 * DAY)
    for conn in (quiet, killed, busy):
        recorder.record(conn, "to_server", json.dumps(_call(1, "get_forecast", {"latitude": 1})).encode(),
                        at=now - 3 * DAY)
    recorder.record(busy, "to_server", json.dumps(_call(2, "get_forecast", {"latitude": 2})).encode(), at=now - 60)
    recorder.close()
    r = cli("prune", "--older-than", "1d", db=db)
    assert r.returncode == 0, r.stderr
    assert sorted(sql(db, "SELECT id FROM mcp_connections")) == [("busy-stdio",), ("killed-stdio",)]
    assert sql(db, "SELECT connection, seq FROM mcp_messages") == [("busy-stdio", 1)]


def _mcp_rows(traffic: list[tuple[str, str, dict, float]]) -> list[dict]:
    """The rows the recorder would store for `traffic` (the server named already)."""
    import zlib

    from proxy.mcp.messages import classify

    rows = []
    for seq, (run, direction, message, at) in enumerate(traffic):
        raw = json.dumps(message).encode()
        p = classify(raw)
        rows.append({"connection": run, "seq": seq, "server": "weather", "direction": direction, "at": at,
                     "kind": p.kind, "method": p.method, "jsonrpc_id": p.jsonrpc_id, "tool": p.tool,
                     "is_error": p.is_error, "size": len(raw), "note": p.note, "raw": zlib.compress(raw)})
    return rows


def test_mcp_calls_go_whole_on_sqlite_and_postgres(engine_url):
    from proxy.store.models import McpMessage

    url, schema = engine_url
    engine = in_schema(make_engine(url, busy_timeout=30), schema)
    migrate(engine)
    now = time.time()
    with engine.begin() as conn:
        conn.execute(McpMessage.__table__.insert(), _mcp_rows(mcp_traffic(now - 3 * DAY, now - 60)))

    def left() -> list[tuple]:
        with engine.connect() as conn:
            return [tuple(r) for r in conn.execute(text(
                "SELECT connection, direction, kind, jsonrpc_id FROM mcp_messages ORDER BY seq"))]

    try:
        foreseen = prune(engine, DAY, keep_errors=True, dry_run=True, vacuum="none")
        done = prune(engine, DAY, keep_errors=True, vacuum="none")
        assert foreseen.mcp_messages == done.mcp_messages == 5
        assert left() == [("a", "to_server", "request", "2"), ("a", "from_server", "response", "2"),
                          ("a", "to_server", "request", "3"), ("a", "from_server", "response", "3"),
                          ("a", "to_server", "batch", None), ("a", "from_server", "response", "4"),
                          ("a", "from_server", "response", "5"),
                          ("b", "to_server", "request", "1"), ("b", "from_server", "response", "1")]
        assert prune(engine, DAY, vacuum="none").mcp_messages == 7
        assert left() == [("b", "to_server", "request", "1"), ("b", "from_server", "response", "1")]
    finally:
        engine.dispose()
