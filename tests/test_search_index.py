"""The full-text search index (migration 0008, proxy/store/search.py): what a user types
finds what the writer stored, in messages, tool arguments and tool results, however
many messages are stored; FTS syntax in a query is just text; the migration indexes a
database stored before it. SQLite files, and Postgres when TOOLTAP_TEST_POSTGRES is set
(a schema of its own per engine, as in test_writer_speed.py)."""

from __future__ import annotations

import json

import httpx
import pytest
from alembic import command
from sqlalchemy import inspect, text

from inspector_ui import queries
from inspector_ui.queries import Filters, Queries
from proxy.capture import TurnRecord
from proxy.scripted import Reply
from proxy.store import ingest, search
from proxy.store.db import alembic_config, make_engine
from proxy.store.read import Reader
from tests.test_writer_speed import Store, schema_engine

HOSTILE = ['"', '""', 'read_file"', '*', 'file*', '-', '-read', 'NEAR', 'NEAR(read file)', 'read AND',
           'AND OR NOT', '(', ')', '(read', 'read)', ':', 'body:read', '{body}: x', '^read', '+', "'", '\\',
           'é', '华盛顿', '🙂', '\x00', 'read_file NEAR/2 app', 'a' * 3000, 'x ' * 200]


@pytest.fixture(params=["sqlite", "postgres"])
def engine_at(request, tmp_path):
    """A function giving a fresh engine migrated to a revision (default: the newest)."""
    made = []

    def fresh(revision: str = "head"):
        if request.param == "sqlite":
            engine = make_engine(f"sqlite:///{tmp_path / f's{len(made)}.db'}")
        else:
            engine = schema_engine(f"search_index_{len(made)}")
        upgrade(engine, revision)
        made.append(engine)
        return engine

    yield fresh
    for engine in made:
        engine.dispose()


def upgrade(engine, revision: str, down: bool = False) -> None:
    cfg = alembic_config(str(engine.url.render_as_string(hide_password=False)))
    with engine.begin() as conn:
        cfg.attributes["connection"] = conn
        (command.downgrade if down else command.upgrade)(cfg, revision)


def sse(*chunks: dict) -> bytes:
    return b"".join(b"data: " + json.dumps(c).encode() + b"\n\n" for c in chunks) + b"data: [DONE]\n\n"


def reply(content: str = "", call: tuple[str, dict] | None = None) -> bytes:
    delta: dict = {"role": "assistant", "content": content}
    if call:
        delta["tool_calls"] = [{"index": 0, "id": "call_1", "type": "function",
                                "function": {"name": call[0], "arguments": json.dumps(call[1])}}]
    return sse({"id": "c", "object": "chat.completion.chunk", "created": 1, "model": "m",
                "choices": [{"index": 0, "delta": delta, "finish_reason": None}]},
               {"id": "c", "object": "chat.completion.chunk", "created": 1, "model": "m",
                "choices": [{"index": 0, "delta": {}, "finish_reason": "tool_calls" if call else "stop"}]})


def record(at: float, messages: list[dict], raw: bytes) -> TurnRecord:
    body = json.dumps({"model": "m", "stream": True, "messages": messages}).encode()
    return TurnRecord(started_at=at, method="POST", path="/chat/completions", upstream="http://up",
                      request_headers=[["content-type", "application/json"]], request_body=body,
                      api="openai.chat", http_status=200, stream=True, raw=raw, raw_size=len(raw),
                      response_headers=[["content-type", "text/event-stream"]])


def coding_session(at: float) -> list[TurnRecord]:
    """Two turns: the model reads src/app.py with read_file, then answers from the result."""
    ask = {"role": "user", "content": "Please look at the app and tell me what it does."}
    call = {"role": "assistant", "content": None, "tool_calls": [
        {"id": "call_1", "type": "function", "function": {"name": "read_file", "arguments": '{"path": "src/app.py"}'}}]}
    result = {"role": "tool", "tool_call_id": "call_1",
              "content": "def get_weather(city):\n    return 'the quick brown fox, café'"}
    return [record(at, [ask], reply(call=("read_file", {"path": "src/app.py"}))),
            record(at + 1, [ask, call, result], reply("It defines get_weather."))]


def chat(at: float, text_: str) -> TurnRecord:
    return record(at, [{"role": "user", "content": text_}], reply("ok"))


def found(engine, q: str) -> dict[str, list[str]]:
    """Session title -> where the query matched."""
    page = Queries(Reader(engine)).sessions_page(Filters(q=q))
    assert page.search_note is None
    return {s["title"]: page.matched_by.get(s["id"], []) for s in page.sessions}


@pytest.mark.parametrize("common", [False, True])
def test_identifiers_paths_and_phrases_are_found_where_they_are(engine_at, monkeypatch, common):
    """`common`: as a query that matches much is run (sessions newest first, each looked up)."""
    if common:
        monkeypatch.setattr(search, "COMMON", 1)
    engine = engine_at()
    store = Store(engine)
    store.batch(coding_session(1_700_000_000))
    store.batch([chat(1_700_000_100, "What is the weather like in Paris?"),
                 chat(1_700_000_200, "Unrelated: a recipe for bread")])
    app = "Please look at the app and tell me what it does."

    assert found(engine, "read_file") == {app: ["messages"]}  # the call, in the next request
    assert found(engine, "src/app.py") == {app: ["tool arguments", "messages"]}
    assert found(engine, "get_weather") == {app: ["tool results", "messages"]}
    assert found(engine, '"quick brown fox"') == {app: ["tool results", "messages"]}
    assert found(engine, '"brown quick fox"') == {}  # a phrase keeps its order
    assert found(engine, "CAFÉ") == {app: ["tool results", "messages"]}  # any case
    assert set(found(engine, "weather")) == {app, "What is the weather like in Paris?"}
    assert found(engine, "weather paris") == {"What is the weather like in Paris?": ["title", "messages"]}
    assert found(engine, "recipe") == {"Unrelated: a recipe for bread": ["title", "messages"]}
    assert found(engine, "no such words anywhere") == {}
    for q in HOSTILE:  # never an FTS syntax error, whatever the input
        found(engine, q)
    assert found(engine, "NEAR") == {} and found(engine, '"src/app.py" *') == {app: ["tool arguments", "messages"]}


def pages(engine, q: str, limit: int) -> list[tuple[str, list[str]]]:
    """Every page of a search, followed by its cursor: (title, where it matched), in order."""
    queries, out, cursor = Queries(Reader(engine)), [], None
    while True:
        page = queries.sessions_page(Filters(q=q), cursor, limit=limit)
        out += [(s["title"], page.matched_by[s["id"]]) for s in page.sessions]
        if page.next_cursor is None:
            return out
        cursor = page.next_cursor


def test_a_common_word_walks_the_sessions_to_the_same_pages(engine_at, monkeypatch):
    """A query that matches much is answered by walking the sessions newest first, a
    batch at a time (the index read from where the batch's rows start): page by page it
    must find what the index-first way finds, in the same order, including a session
    whose only match is a message first sent long before, and an old session that is
    active again."""
    engine = engine_at()
    store = Store(engine)
    old = {"role": "user", "content": "task 0: a persimmon grows here"}
    store.batch([record(1_700_000_000, [old], reply("ok"))])
    for k in range(1, 40):
        ask = {"role": "user", "content": f"task {k}" + (" with a kumquat" if k % 3 == 0 else "")}
        call = ("read_file", {"path": f"src/kumquat_{k}.py" if k % 5 == 0 else f"src/m{k}.py"})
        store.batch([record(1_700_000_000 + 10 * k, [ask], reply(call=call))])
    # The newest session: its only persimmon is the old session's first message, sent again.
    store.batch([record(1_700_001_000, [{"role": "user", "content": "task 40"}, old], reply("ok"))])
    store.batch([record(1_700_002_000, [old, {"role": "assistant", "content": "ok"},
                                        {"role": "user", "content": "task 0, again"}], reply("ok"))])
    walked = {}
    # Walked (the messages' start found first, or not), index-first, and index-first
    # finding more sessions than it takes (then walked).
    for common, floor_at, hits_max in ((1, 0, 9), (1, 10 ** 9, 9), (10 ** 9, 0, 10 ** 9), (10 ** 9, 0, 2)):
        monkeypatch.setattr(search, "COMMON", common)
        monkeypatch.setattr(search, "FLOOR_AT", floor_at)
        monkeypatch.setattr(queries, "HITS_MAX", hits_max)
        walked[common, floor_at, hits_max] = {(q, limit): pages(engine, q, limit)
                                              for q in ("kumquat", "persimmon", "task") for limit in (3, 50)}
    assert len({repr(w) for w in walked.values()}) == 1
    pages_of = walked[1, 0, 9]
    for q in ("kumquat", "persimmon", "task"):  # pages of 3 add up to the page of 50
        assert pages_of[q, 3] == pages_of[q, 50]
    assert pages_of["persimmon", 3] == [("task 0: a persimmon grows here", ["title", "messages"]),
                                        ("task 40", ["messages"])]
    kumquat = pages_of["kumquat", 3]
    assert len(kumquat) == 13 + 5  # 13 asked for one, 5 more only read src/kumquat_*.py
    assert ("task 5", ["tool arguments"]) in kumquat and ("task 39 with a kumquat", ["title", "messages"]) in kumquat
    assert len(pages_of["task", 3]) == 41


def test_a_path_of_common_words_is_looked_up_by_its_rare_ones_with_the_same_answer(engine_at, monkeypatch):
    """Postgres: `src`, `util` and `py` are in every call's arguments, so the index is
    asked for `kiwi` alone and the phrase is checked on what it finds; a call holding the
    same words in another order is still no match. SQLite's index needs no such help."""
    engine = engine_at()
    store = Store(engine)
    for k in range(30):
        store.batch([record(1_700_000_000 + k, [{"role": "user", "content": f"task {k}"}],
                            reply(call=("read_file", {"path": f"src/m{k}/util.py"})))])
    store.batch([record(1_700_001_000, [{"role": "user", "content": "the kiwi one"}],
                        reply(call=("read_file", {"path": "src/kiwi/util.py"}))),
                 record(1_700_001_001, [{"role": "user", "content": "the shuffled one"}],
                        reply(call=("note", {"text": "py util kiwi src"})))])
    postgres = engine.dialect.name == "postgresql"
    if postgres:
        with engine.begin() as conn:
            conn.execute(text("ANALYZE tool_calls"))
    with engine.connect() as conn:
        probes = search.places(conn, engine.dialect.name, ["src/kiwi/util.py"]).place_params
    assert {p: v.get("probe") for p, v in probes.items()} == ({"tool arguments": "'kiwi'"} if postgres else
                                                              {p: None for p in probes})
    assert found(engine, "src/kiwi/util.py") == {"the kiwi one": ["tool arguments"]}
    assert found(engine, "kiwi") == {"the kiwi one": ["title", "tool arguments", "messages"],
                                     "the shuffled one": ["tool arguments"]}
    monkeypatch.setattr(search, "COMMON_WORD", 2.0)  # no word is common: the phrase as it is
    with engine.connect() as conn:
        probes = search.places(conn, engine.dialect.name, ["src/kiwi/util.py"]).place_params
    assert [p for p, v in probes.items() if "probe" in v] == []
    assert found(engine, "src/kiwi/util.py") == {"the kiwi one": ["tool arguments"]}


def test_a_title_is_found_by_any_part_of_it_and_postgres_has_an_index_for_that(engine_at):
    """Titles match by substring (part of a word too); on Postgres migration 0010 adds a
    trigram index that such a LIKE can use instead of reading every session."""
    engine = engine_at()
    Store(engine).batch([chat(1_700_000_000, "Refactor the Quokkaloader module"), chat(1_700_000_100, "other")])
    assert found(engine, "kkaLOAD") == {"Refactor the Quokkaloader module": ["title"]}
    if engine.dialect.name != "postgresql":
        return
    with engine.begin() as c:
        c.execute(text("SET LOCAL enable_seqscan = off"))  # two rows: the planner would rightly scan them
        plan = " ".join(c.execute(text("EXPLAIN SELECT id FROM sessions "
                                       "WHERE lower(title) LIKE '%kkaload%'")).scalars())
    assert "ix_sessions_title_trgm" in plan, plan


def test_an_mcp_tool_is_found_by_its_name_inside_clines_mangled_one(engine_at):
    """Cline calls an MCP tool `<uid>0mcp0<tool>`: one word to both tokenizers, so the
    index adds the tool's own name."""
    engine = engine_at()
    ask = {"role": "user", "content": "Forecast for Seattle?"}
    call = {"role": "assistant", "content": None, "tool_calls": [
        {"id": "call_1", "type": "function",
         "function": {"name": "cIya4J0mcp0get_forecast", "arguments": '{"latitude": 47.6}'}}]}
    result = {"role": "tool", "tool_call_id": "call_1", "content": "Rain."}
    Store(engine).batch([record(1_700_000_000, [ask], reply(call=("cIya4J0mcp0get_forecast", {"latitude": 47.6}))),
                         record(1_700_000_001, [ask, call, result], reply("Rain tomorrow."))])
    assert found(engine, "get_forecast") == {"Forecast for Seattle?": ["messages"]}
    assert found(engine, "cIya4J0mcp0get_forecast") == {"Forecast for Seattle?": ["messages"]}


def test_a_message_in_the_oldest_of_many_sessions_is_found(engine_at):
    """The old search inflated at most 20,000 message blobs, newest sessions first: a word
    only in the oldest session was missed once the database held more."""
    engine = engine_at()
    store = Store(engine)
    sessions, per = 105, 200
    for batch in range(0, sessions, 35):
        store.batch([record(1_700_000_000 + k, [{"role": "user" if i % 2 == 0 else "assistant",
                                                 "content": f"session {k} message {i} "
                                                 + ("the zanzibar_quokka is here" if k == 0 and i == per - 1 else "")}
                                                for i in range(per)], reply("ok"))
                     for k in range(batch, batch + 35)])
    with engine.connect() as c:
        assert c.execute(text("SELECT count(DISTINCT message_hash) FROM chain_nodes")).scalar() > 20_000
    hits = found(engine, "zanzibar_quokka")
    assert hits == {"session 0 message 0": ["messages"]}
    assert len(found(engine, "message 17")) == 50  # a page of the many that hold it


def test_the_migration_indexes_a_database_stored_before_it(engine_at, monkeypatch):
    engine = engine_at("0007")
    newer = ("continue_id", "route")  # columns of migrations 0011 and 0012
    with monkeypatch.context() as m:  # the writer as it was at 0007: no index to feed, none of the newer columns
        m.setattr(search, "index_messages", lambda *a, **k: None)
        row = ingest._turn_row
        m.setattr(ingest, "_turn_row", lambda turn: {k: v for k, v in row(turn).items() if k not in newer})
        store = Store(engine)
        store.batch(coding_session(1_700_000_000))
        store.batch([chat(1_700_000_100, "weather in Paris")])
    assert "search_messages" not in inspect(engine).get_table_names()
    upgrade(engine, "head")
    app = "Please look at the app and tell me what it does."
    assert found(engine, "src/app.py") == {app: ["tool arguments", "messages"]}
    assert found(engine, "get_weather") == {app: ["tool results", "messages"]}
    assert found(engine, "paris") == {"weather in Paris": ["title", "messages"]}
    upgrade(engine, "0007", down=True)
    names = inspect(engine).get_table_names()
    assert not [n for n in names if n.startswith("search_")]
    upgrade(engine, "head")  # and again, on what the newest writer stores too
    Store(engine).batch([chat(1_700_000_300, "a later turn about kangaroos")])
    assert found(engine, "kangaroos") == {"a later turn about kangaroos": ["title", "messages"]}
    assert found(engine, "get_weather") == {app: ["tool results", "messages"]}


def test_results_replaced_or_deleted_leave_the_index(engine_at):
    """A tool result the decoders change later is searched as it is now; a deleted tool
    call is forgotten (SQLite's triggers tell the contentless index the old text)."""
    engine = engine_at()
    Store(engine).batch(coding_session(1_700_000_000))
    app = "Please look at the app and tell me what it does."
    with engine.begin() as c:
        c.execute(text("UPDATE tool_calls SET result = :r"), {"r": json.dumps({"content": "kiwi ümlaut"})})
    assert found(engine, "get_weather") == {app: ["messages"]}
    assert found(engine, "ümlaut") == {app: ["tool results"]}
    with engine.begin() as c:
        c.execute(text("DELETE FROM tool_calls"))
    assert found(engine, "kiwi") == {} and found(engine, "src/app.py") == {app: ["messages"]}


def test_search_page_over_http_escapes_and_takes_any_input(tooltap, upstream):
    upstream.routes["/chat/completions"] = Reply.sse(reply("fine"))
    for content in ["<script>alert('pwned')</script> findme_marker", "another session entirely"]:
        r = httpx.post(tooltap.url + "/chat/completions", timeout=10, json={
            "model": "m", "stream": True, "messages": [{"role": "user", "content": content}]})
        assert r.status_code == 200
    tooltap.flush()
    html = httpx.get(tooltap.url + "/_tooltap/", params={"q": "findme_marker"}, timeout=10).text
    assert "findme_marker" in html and "matched in title, messages" in html
    assert "<script>alert(" not in html and "&lt;script&gt;alert(" in html
    api = httpx.get(tooltap.url + "/_tooltap/api/search", params={"q": "alert pwned"}, timeout=10).json()
    assert [s["title"] for s in api["sessions"]] == ["<script>alert('pwned')</script> findme_marker"]
    assert api["note"] is None
    for q in HOSTILE:
        assert httpx.get(tooltap.url + "/_tooltap/", params={"q": q}, timeout=10).status_code == 200, q
        assert httpx.get(tooltap.url + "/_tooltap/api/search", params={"q": q}, timeout=10).status_code == 200, q


def test_query_terms():
    assert search.query_terms('read_file "quick  brown" src/app.py') == ["read_file", "quick  brown", "src/app.py"]
    assert search.query_terms('* - ( ) "" "') == []
    assert search.fts5_query(['say "hi"', "NEAR"]) == '"say ""hi""" AND "NEAR"'
