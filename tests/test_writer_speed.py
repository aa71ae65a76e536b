"""The batched writer: what makes it fast, and that fast stores exactly what slow did.

Not timed (timings belong to bench/writer.py): a batch costs a fixed number of
statements however many turns it holds; a batch, turns one at a time, and turns that
arrive out of order all store the same sessions, parents and decodings; a request parsed
from an earlier one (store/requests.py) is the value json.loads gives.
"""

from __future__ import annotations

import json
import random

import pytest
from sqlalchemy import event, text
from sqlmodel import Session as DB

from proxy.capture import TurnRecord
from proxy.store import content
from proxy.store.db import make_engine, migrate
from proxy.store.decoding import BlobCache, RecentTurns, decode_new_turns, decode_sessions
from proxy.store.ingest import Ingestor
from proxy.store.requests import Requests
from tests.conftest import cline_turn, in_schema, postgres_schema
from tests.test_proxy_e2e import FINAL_SSE

TURNS = [cline_turn(n) for n in (1, 2, 3, 4)]


def cline_session(k: int) -> list[TurnRecord]:
    """The cline-weather session with its own task text: its own messages and chain."""
    out = []
    for n, t in enumerate(TURNS):
        body = t["request"].replace(b"<task>\\n", f"<task>\\nsession {k} ".encode(), 1)
        raw = t.get("sse", FINAL_SSE)
        out.append(TurnRecord(
            started_at=1_700_000_000 + 100 * k + n, method="POST", path="/chat/completions",
            upstream="http://up", request_headers=[["content-type", "application/json"]], request_body=body,
            api="openai.chat", http_status=200, stream=True, raw=raw, raw_size=len(raw),
            response_headers=[["content-type", "text/event-stream"]]))
    return out


@pytest.fixture(params=["sqlite", "postgres"])
def database(request, tmp_path):
    """A function that gives a fresh, migrated engine each call."""
    made = []

    def fresh():
        if request.param == "sqlite":
            engine = make_engine(f"sqlite:///{tmp_path / f'w{len(made)}.db'}")
        else:  # a schema of its own in the test database, for each engine
            engine = schema_engine(f"writer_speed_{len(made)}")
        migrate(engine)
        made.append(engine)
        return engine

    yield fresh
    for engine in made:
        engine.dispose()


def schema_engine(schema: str):
    """An engine on a new, empty schema of its own in the test Postgres (skips without one)."""
    return in_schema(make_engine(postgres_schema(schema)), schema)


class Store:
    """The writer's commit (store/writer.py) over one engine, counting statements."""

    def __init__(self, engine):
        self.engine = engine
        self.ingestor = Ingestor(engine.dialect.name)
        self.recent, self.blobs = RecentTurns(), BlobCache()
        self.statements = 0
        event.listen(engine, "before_cursor_execute", self._count)

    def _count(self, *args) -> None:
        self.statements += 1  # an executemany is one

    def batch(self, records: list[TurnRecord]) -> int:
        """Store one batch; returns the statements it took."""
        before = self.statements
        with DB(self.engine, autoflush=False) as db:
            items = [self.ingestor.add(r) for r in records]
            self.ingestor.write(db, items)
            decode_new_turns(db, items, self.recent, self.blobs)
            db.commit()
        return self.statements - before


def snapshot(engine) -> dict:
    """Everything threading and decoding decided, with turns named by their request."""
    with engine.connect() as c:
        turns = c.execute(text("SELECT id, session_id, parent_id, chain_hash, decoding, tool_call_count "
                               "FROM turns ORDER BY id")).all()
        name = {t.id: t.chain_hash for t in turns}
        calls = c.execute(text('SELECT turn_id, "index", name, decoded, task_progress, result, violations '
                               'FROM tool_calls')).all()
        sessions = c.execute(text("SELECT id, title, agent, turns, tool_calls, input_tokens, output_tokens, "
                                  "errors, models, uids, started_at, last_at FROM sessions")).all()
    load = lambda v: json.loads(v) if isinstance(v, str) else v  # SQLite gives JSON as text
    return {
        "turns": sorted((t.chain_hash, t.session_id, name.get(t.parent_id), load(t.decoding), t.tool_call_count)
                        for t in turns),
        "calls": sorted((name[c.turn_id], c.index, c.name, json.dumps([load(c.decoded), load(c.task_progress),
                                                                       load(c.result), load(c.violations)],
                                                                      sort_keys=True)) for c in calls),
        "sessions": sorted((s.id, s.title, s.agent, s.turns, s.tool_calls, s.input_tokens, s.output_tokens,
                            s.errors, json.dumps(load(s.models)), json.dumps(load(s.uids), sort_keys=True),
                            s.started_at, s.last_at) for s in sessions),
    }


def interleaved(sessions: list[list[TurnRecord]]) -> list[TurnRecord]:
    """Agents at work together: turn 1 of each, then turn 2 of each..."""
    return [s[n] for n in range(len(TURNS)) for s in sessions]


def test_a_batch_costs_the_same_statements_whatever_its_size(database):
    store = Store(database())
    small = store.batch(interleaved([cline_session(k) for k in range(3)]))  # 12 turns
    large = store.batch(interleaved([cline_session(k) for k in range(3, 9)]))  # 24 turns
    assert small == large, (small, large)
    one_by_one = sum(store.batch([r]) for r in cline_session(9))
    assert one_by_one >= 4 * small * 0.5  # a turn alone pays most of a batch's statements
    with store.engine.connect() as c:
        assert c.execute(text("SELECT count(*) FROM turns")).scalar() == 40
        assert c.execute(text("SELECT count(*) FROM sessions")).scalar() == 10


def test_one_batch_and_one_turn_at_a_time_store_the_same(database):
    records = interleaved([cline_session(k) for k in range(4)])
    batched, single = Store(database()), Store(database())
    batched.batch(records)
    for r in interleaved([cline_session(k) for k in range(4)]):
        single.batch([r])
    a, b = snapshot(batched.engine), snapshot(single.engine)
    assert a == b
    assert len(a["sessions"]) == 4 and all(s[3] == 4 for s in a["sessions"])
    # Each session threads 1 <- 2 <- 3 <- 4, and its calls carry the results the next turn brought.
    parents = [p for _, _, p, _, _ in a["turns"]]
    assert parents.count(None) == 4
    assert any('"status"' in c[3] for c in a["calls"])


def test_the_live_decoding_is_the_whole_session_decoding(database):
    store = Store(database())
    store.batch(interleaved([cline_session(k) for k in range(2)]))
    live = snapshot(store.engine)
    with DB(store.engine) as db:
        db.execute(text("UPDATE tool_calls SET decoded = NULL, task_progress = NULL, result = NULL, violations = NULL"))
        db.execute(text("UPDATE turns SET decoding = NULL"))
        ids = [s[0] for s in live["sessions"]]
        decode_sessions(db, ids, BlobCache())
        db.commit()
    assert snapshot(store.engine) == live


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_turns_that_arrive_out_of_order_thread_as_in_order(database, seed):
    """Consecutive turns of a conversation may reach different tooltap instances and be
    stored in any order: a late turn adopts the later turns of its conversation."""
    in_order = Store(database())
    for r in interleaved([cline_session(k) for k in range(3)]):
        in_order.batch([r])
    shuffled = Store(database())
    records = interleaved([cline_session(k) for k in range(3)])
    random.Random(seed).shuffle(records)
    while records:  # batches of 1-3 turns, in the shuffled order
        n = random.Random(seed + len(records)).randint(1, 3)
        shuffled.batch(records[:n])
        records = records[n:]
    assert snapshot(shuffled.engine) == snapshot(in_order.engine)


def tool_session(s: int, turns: int = 8) -> list[TurnRecord]:
    """An OpenAI-chat agent reading one file per turn: turn k carries turn k-1's result."""
    messages = [{"role": "system", "content": "You fix bugs."}, {"role": "user", "content": f"session {s}: fix it"}]
    out = []
    for k in range(turns):
        call = {"id": f"call_{s}_{k}", "type": "function",
                "function": {"name": "read_file", "arguments": json.dumps({"path": f"f{k}.py"})}}
        chunks = [{"choices": [{"index": 0, "delta": {"role": "assistant", "content": f"Step {k}.",
                                                      "tool_calls": [{"index": 0, **call}]}, "finish_reason": None}]},
                  {"choices": [{"index": 0, "delta": {}, "finish_reason": "tool_calls"}]}]
        raw = b"".join(b"data: " + json.dumps({"id": f"c{s}-{k}", "model": "m", **c}).encode() + b"\n\n"
                       for c in chunks) + b"data: [DONE]\n\n"
        body = json.dumps({"model": "m", "stream": True, "messages": messages}).encode()
        out.append(TurnRecord(
            started_at=1_700_000_000 + 100 * s + k, method="POST", path="/v1/chat/completions",
            upstream="http://up", request_headers=[["content-type", "application/json"]], request_body=body,
            api="openai.chat", http_status=200, stream=True, raw=raw, raw_size=len(raw),
            response_headers=[["content-type", "text/event-stream"]]))
        messages = messages + [{"role": "assistant", "content": f"Step {k}.", "tool_calls": [call]},
                               {"role": "tool", "tool_call_id": call["id"], "content": f"contents of f{k}.py"}]
    return out


def in_order(database, sessions: list[list[TurnRecord]]) -> dict:
    one = Store(database())
    for n in range(max(map(len, sessions))):
        one.batch([turns[n] for turns in sessions if n < len(turns)])
    return snapshot(one.engine)


def test_writers_sharing_a_database_see_what_the_others_changed(database):
    """Three writers, each with its own memory of recent turns, store one conversation
    out of order. Writer 1 remembers turn 5 as a child of turn 2; writer 2 then stores
    turn 4, which adopts turn 5. When writer 1 stores turn 3 (adopting turn 4), turn 4's
    results must still come from turn 5: it used to read them from its stale memory and
    mark turn 4's call "missing"."""
    engine = database()
    writers = [Store(engine) for _ in range(3)]
    turns = tool_session(1)
    for w, ks in [(0, [2]), (0, [5]), (1, [0]), (2, [1]), (2, [4]), (2, [7]), (1, [3, 6])]:
        writers[w].batch([turns[k] for k in ks])
    stored = snapshot(engine)
    assert [json.loads(c[3])[2]["status"] for c in stored["calls"]].count("missing") == 1  # the last turn's
    assert stored == in_order(database, [tool_session(1)])


@pytest.mark.parametrize("seed", [12, 40, 41])  # 12 failed before writers checked their memory
def test_three_writers_storing_turns_in_any_order_store_what_one_does(database, seed):
    """Agents send turn k of session s to writer (s + k) % 3, as three instances behind a
    round-robin balancer do; each writer commits what it holds in batches at random."""
    rng = random.Random(seed)
    engine = database()
    writers = [Store(engine) for _ in range(3)]
    sessions = [tool_session(s) for s in range(4)]
    held: list[list[TurnRecord]] = [[], [], []]
    sent = [0] * len(sessions)
    while any(n < len(turns) for n, turns in zip(sent, sessions)) or any(held):
        waiting = [s for s, turns in enumerate(sessions) if sent[s] < len(turns)]
        if waiting and rng.random() < 0.6:
            s = rng.choice(waiting)
            held[(s + sent[s]) % 3].append(sessions[s][sent[s]])
            sent[s] += 1
        elif held[w := rng.randrange(3)]:
            n = rng.randint(1, len(held[w]))
            writers[w].batch(held[w][:n])
            held[w] = held[w][n:]
    assert snapshot(engine) == in_order(database, [tool_session(s) for s in range(4)])


def test_sqlite_writes_a_batch_of_tool_calls_in_one_statement_as_executemany_does(tmp_path, monkeypatch):
    """On SQLite a batch's tool calls go in by one INSERT, and their decodings by one
    UPDATE, unpacked from JSON (store/one_statement.py: a statement per call made FTS5
    flush the search index at each). They store the very text executemany stores (SQL
    NULL for nothing, a JSON column's text, escapes and non-ASCII as they were), in the
    same order, and the search index holds the same words."""
    from proxy.store import one_statement

    sessions = [tool_session(s) for s in range(3)]
    for t in sessions[0]:  # arguments and results with escapes and non-ASCII in them
        t.request_body = t.request_body.replace(b"contents of", "contenu de \u00e9t\u00e9 \\n".encode())
        t.raw = t.raw.replace(b'\\"f', b'\\"caf\\u00e9/f')
        t.raw_size = len(t.raw)
    stored = {}
    for at_once in (True, False):
        monkeypatch.setattr(one_statement, "AVAILABLE", at_once)
        store = Store(make_engine(f"sqlite:///{tmp_path / f'{at_once}.db'}"))
        migrate(store.engine)
        statements = [store.batch([turns[n] for turns in sessions]) for n in range(len(sessions[0]))]
        with store.engine.connect() as c:
            rows = c.execute(text("SELECT *, typeof(task_progress) FROM tool_calls ORDER BY id")).all()
            words = {(table, w): c.execute(text(f"SELECT group_concat(rowid) FROM {table} WHERE {table} MATCH :w"),
                                           {"w": w}).scalar()
                     for table in ("search_tool_args", "search_tool_results")
                     for w in ("contents", "f3", "été", "café", "status")}
        store.engine.dispose()
        stored[at_once] = rows, words, statements
    (rows, words, statements), each = stored[True], stored[False]
    assert (rows, words, statements) == each  # an executemany is one statement too: no more, no fewer
    assert len(rows) == 24 and all(r.result for r in rows) and {r[-1] for r in rows} == {"null"}
    assert "été" in "".join(r.result for r in rows) and "café/f3.py" in "".join(r.arguments_raw for r in rows)
    assert all(words[t, w] for t, w in [("search_tool_args", "café"), ("search_tool_args", "f3"),
                                         ("search_tool_results", "été"), ("search_tool_results", "contents")])


def test_a_request_that_extends_an_earlier_one_parses_to_the_same_value():
    requests = Requests()
    reused, before = [], []
    for k in range(2):
        previous = 0
        for t in cline_session(k):
            parsed = requests.parse(t.request_body, "messages")
            assert (parsed.value, parsed.problem) == content.parse_strict(t.request_body)
            reused.append(parsed.reused)
            before.append(previous)
            previous = len(parsed.value["messages"])
            requests.keep(parsed)
    assert reused == before and sum(reused) > 0  # each turn reads only the messages it added
    odd = [b'{"messages": [1,]}', b'{"messages": [{"a": 1}], "x": NaN}', b'{"a": 1, "a": 2, "messages": []}',
           b'{"messages": [{"a": "\\ud800"}]}', b'{"messages": [{"a": 1e999}]}', b'{"messages":[{"a":1}]} x',
           b'{"messages": [{"n": 123456789012345678901234567890}]}', b'{ "messages" : [ {"a":1} , 2 ] } ',
           b'{"messages": [' + b"[" * 300 + b"]" * 300 + b"]}", b"{}", b'{"messages": "text"}', b"[1]"]
    for body in odd:
        parsed = requests.parse(body, "messages")
        assert (parsed.value, parsed.problem) == content.parse_strict(body), body
    # Characters beyond ASCII in the shared part and after it; then bytes that are not
    # UTF-8 after it: the same value, or the same problem, as parsing the whole body.
    messages = [{"role": "system", "content": "Réponds en français ✓"}]
    for k in range(4):
        messages = messages + [{"role": "user", "content": f"tâche {k} — 😀"}]
        body = json.dumps({"model": "m", "messages": messages, "tools": [{"n": "é" * 2000}]},
                          ensure_ascii=False).encode()
        parsed = requests.parse(body, "messages")
        assert (parsed.value, parsed.problem) == content.parse_strict(body)
        assert parsed.reused == (k + 1 if k else 0)
        requests.keep(parsed)
    shared = body[:body.index(b'], "tools"')]  # the messages this body shares with the next
    broken = shared + b', {"role": "user", "content": "\xff"}], "x": 1}'
    parsed = requests.parse(broken, "messages")
    assert parsed.value is None and (parsed.value, parsed.problem) == content.parse_strict(broken)
    # An extension that changes an earlier message shares nothing, and is still right.
    first = cline_session(5)[2].request_body
    edited = first.replace(b"session 5", b"session 6", 1)
    requests.keep(requests.parse(first, "messages"))
    parsed = requests.parse(edited, "messages")
    assert parsed.reused == 0 and parsed.value == json.loads(edited)


def test_a_request_is_looked_for_among_its_own_conversations_requests(monkeypatch):
    """The writer remembers thousands of short conversations (one-shot requests, sub-agents,
    bench/overhead.py's); a request is compared with its own conversation's only, and
    still found when it is the oldest remembered."""
    from proxy.store import requests as requests_module

    compared = []
    real_base = Requests._base

    def counting_base(self, body, conversation):
        compared.append(len(self._of.get(conversation, ())))
        return real_base(self, body, conversation)

    monkeypatch.setattr(Requests, "_base", counting_base)
    requests = Requests()
    system = {"role": "system", "content": "You are a careful coding agent. " * 40}
    for k in range(2000):
        body = json.dumps({"model": "m", "messages": [system, {"role": "user", "content": f"one-shot {k}"}]}).encode()
        parsed = requests.parse(body, "messages")
        assert parsed.reused == 0
        requests.keep(parsed)
    assert max(compared) == 0  # each new conversation: nothing of its own to compare with
    messages = [system, {"role": "user", "content": "one-shot 0"}, {"role": "assistant", "content": "Yes."},
                {"role": "user", "content": "And?"}]
    body = json.dumps({"model": "m", "messages": messages}).encode()
    parsed = requests.parse(body, "messages")
    assert parsed.reused == 2 and parsed.value == json.loads(body)
    assert compared[-1] == 1
    assert requests_module.conversation_key(body) == parsed.base.key
