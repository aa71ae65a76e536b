"""A store that lost a blob (a damaged file, a hand-edited database) still reads: the
turn is served without what is missing, never a 500."""

from __future__ import annotations

import sqlite3

import httpx

from proxy.demo import chat_sse, words
from proxy.scripted import Reply


def test_a_turn_whose_system_prompt_blob_is_gone_still_reads(tooltap, upstream):
    upstream.routes["/chat/completions"] = Reply.sse(chat_sse("m", words("hello there")))
    body = {"model": "m", "stream": True, "messages": [{"role": "system", "content": "You are terse."},
                                                       {"role": "user", "content": "hi"}]}
    assert httpx.post(f"{tooltap.url}/chat/completions", json=body).status_code == 200
    (turn,) = tooltap.api("/turns")["turns"]
    with sqlite3.connect(tooltap.db_path) as db:
        (system_hash,) = db.execute("select system_hash from turns where id = ?", (turn["id"],)).fetchone()
        assert db.execute("delete from blobs where hash = ?", (system_hash,)).rowcount == 1
    r = httpx.get(f"{tooltap.url}/_tooltap/api/turns/{turn['id']}")
    assert r.status_code == 200
    assert r.json()["request"]["messages"] == [{"role": "user", "content": "hi"}]
    for path in (f"/_tooltap/turns/{turn['id']}", f"/_tooltap/sessions/{turn['session_id']}"):
        page = httpx.get(tooltap.url + path)
        assert page.status_code == 200 and "hello there" in page.text, path
