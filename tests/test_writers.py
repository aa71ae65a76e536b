"""`serve --writers N`: several writer processes in one tooltap (proxy/store/shards.py).

End to end, a real tooltap with two writers takes a dozen agents at once: every turn is
stored once and threads exactly as one writer threads the same requests, each writer
stores a share, the live view announces every turn once, and a stop loses nothing.
Below that: the conversation key that picks a writer, for each wire API, and the spools
of writers that are gone.
"""

from __future__ import annotations

import collections
import json
import signal

import httpx
import pytest
from sqlalchemy import create_engine, text

from proxy.scripted import ScriptedUpstream
from proxy.store.shards import conversation_key, shard_spool
from proxy.workers import adopt_left_over_spools
from tests.conftest import Server, postgres_url
from tests.test_multi_instance import (LiveWatch, one_writer_baseline, reply_for, run_agents, serve, wait_ready,
                                       wait_stored, without_times)
from tests.test_writer_speed import snapshot

SESSIONS, TURNS = 12, 6


def databases() -> list:
    no_postgres = pytest.mark.skipif(postgres_url() is None,
                                     reason="no Postgres here: set TOOLTAP_TEST_POSTGRES (.ci/run does)")
    return ["sqlite", pytest.param("postgres", marks=no_postgres)]


@pytest.mark.parametrize("database", databases())
def test_two_writers_store_every_turn_once_threaded_as_one_writer_does(tmp_path, database):
    if database == "sqlite":
        url = f"sqlite:///{tmp_path / 'w.db'}"
    else:
        url = postgres_url()
        with create_engine(url).begin() as c:
            c.execute(text("DROP SCHEMA public CASCADE; CREATE SCHEMA public"))
    scripted = ScriptedUpstream({"/v1/chat/completions": reply_for})
    with Server(scripted) as up:
        tt = serve(tmp_path, "writers", up.url, url, "--writers", "2")
        try:
            wait_ready([tt])
            health = httpx.get(tt.url + "/_tooltap/api/health").json()
            assert health["status"] == "ok" and health["writer"]["writers"] == 2
            pids = {w["pid"] for w in health["writer"]["each"]}
            assert len(pids) == 2 and all(health["writer"]["each"][i]["alive"] for i in (0, 1))
            watch = LiveWatch(tt.url)
            run_agents([tt.url], sessions=SESSIONS, turns=TURNS)
            engine = create_engine(url)
            wait_stored(engine, SESSIONS * TURNS)
            with engine.connect() as c:
                ids = set(c.execute(text("SELECT id FROM turns")).scalars())
            assert not watch.wait_for(ids), "the live view missed turns"
            repeated = [i for i, n in collections.Counter(watch.announced).items() if n > 1]
            assert not repeated, f"the live view announced turns twice: {repeated[:5]}"
            each = httpx.get(tt.url + "/_tooltap/api/health").json()["writer"]["each"]
            shares = [w["written"] for w in each]
            assert sum(shares) == SESSIONS * TURNS and min(shares) >= TURNS, shares  # both work, whole sessions
        finally:
            tt.signal(signal.SIGTERM)
            assert tt.wait(30) == 0, tt.output()
    assert "Traceback" not in tt.output()
    snap = snapshot(engine)
    assert len(snap["sessions"]) == SESSIONS and all(s[3] == TURNS for s in snap["sessions"])
    assert without_times(snap) == without_times(one_writer_baseline(tmp_path, scripted.received, engine))


def conversation(api: str, task: str, turns: int) -> list[bytes]:
    """The bodies an SDK sends for `turns` turns of one conversation, history resent."""
    bodies, history = [], []
    for k in range(turns):
        if api == "openai.chat":
            history += [{"role": "user", "content": task if k == 0 else f"result {k}"}]
            body = {"model": "gpt-4.1", "messages": [{"role": "system", "content": "You code."}] + history,
                    "stream": True}
            history += [{"role": "assistant", "content": f"step {k}"}]
        elif api == "anthropic.messages":
            history += [{"role": "user", "content": [{"type": "text", "text": task if k == 0 else f"result {k}"}]}]
            body = {"model": "claude-sonnet-4-5", "max_tokens": 1024, "system": "You code.", "messages": history}
            history += [{"role": "assistant", "content": [{"type": "text", "text": f"step {k}"}]}]
        elif api == "gemini":
            history += [{"role": "user", "parts": [{"text": task if k == 0 else f"result {k}"}]}]
            body = {"systemInstruction": {"parts": [{"text": "You code."}]}, "contents": list(history)}
            history += [{"role": "model", "parts": [{"text": f"step {k}"}]}]
        else:  # openai.responses
            history += [{"role": "user", "content": task if k == 0 else f"result {k}"}]
            body = {"model": "gpt-5", "instructions": "You code.", "input": list(history), "stream": True}
            history += [{"role": "assistant", "content": f"step {k}"}]
        bodies.append(json.dumps(body).encode())
    return bodies


@pytest.mark.parametrize("api", ["openai.chat", "anthropic.messages", "gemini", "openai.responses"])
def test_a_conversation_keeps_its_writer_and_conversations_spread(api):
    # Short and long first messages: a window past a short one would take in what follows.
    tasks = [f"Fix test {n}." if n % 2 else f"Fix the failing test number {n} in the parser module, then run the "
             f"whole suite again and tell me what changed." for n in range(40)]
    keys = []
    for task in tasks:
        mine = {conversation_key(body) for body in conversation(api, task, 5)}
        assert len(mine) == 1, f"{api}: one conversation, {len(mine)} keys"
        keys.append(mine.pop())
    assert len({k % 2 for k in keys}) == 2 and len({k % 4 for k in keys}) == 4, "conversations not spread"
    # A session the client names goes by that name; a body with no user message, to writer 0.
    assert conversation_key(b'{"messages": []}', "my-session") == conversation_key(b"other", "my-session")
    assert conversation_key(b'{"model": "m"}') == 0


def test_the_spools_of_writers_no_longer_running_go_to_writer_0(tmp_path):
    spool = str(tmp_path / "t.spool.jsonl")
    for index, line in [(0, b'{"a": 0}\n'), (1, b'{"a": 1}\n'), (2, b'{"a": 2}\n'), (3, b'{"a": 3}')]:
        with open(shard_spool(spool, index), "wb") as f:
            f.write(line)
    assert adopt_left_over_spools(spool, 2, "writer") == 2
    assert open(spool, "rb").read() == b'{"a": 0}\n{"a": 2}\n{"a": 3}\n'
    assert open(shard_spool(spool, 1), "rb").read() == b'{"a": 1}\n'  # writer 1 still runs
    # A former worker's writers' spools go with the worker's.
    with open(f"{spool}.worker3.writer1", "wb") as f:
        f.write(b'{"a": 31}\n')
    assert adopt_left_over_spools(spool, 2) == 1
    assert open(spool, "rb").read().endswith(b'{"a": 31}\n')
