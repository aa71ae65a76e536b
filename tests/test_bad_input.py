"""Bad input must neither break storage nor reads: bodies no database can hold as JSON
are kept as their bytes, captured oddities read back without a 500, ids of any size and
session names with '/' get a clear answer. Real tooltap, real HTTP, a SQLite file."""

from __future__ import annotations

import base64
import gzip
import json
from pathlib import Path

import httpx
import pytest

from proxy.scripted import Reply

OK = Reply.json({"id": "r", "object": "chat.completion", "model": "m",
                 "choices": [{"index": 0, "message": {"role": "assistant", "content": "ok"}, "finish_reason": "stop"}]})
JSON = {"content-type": "application/json"}
HUGE = str(2**64 + 1)


def send(tooltap, body: bytes, headers=JSON) -> dict:
    """POST `body` through tooltap; return the stored turn as the API gives it."""
    r = httpx.post(f"{tooltap.url}/chat/completions", content=body, headers=headers, timeout=20)
    assert r.status_code == 200
    tooltap.flush()
    newest = tooltap.api("/turns?limit=1")["turns"][0]
    r = httpx.get(f"{tooltap.url}/_tooltap/api/turns/{newest['id']}", timeout=20)
    assert r.status_code == 200, r.text
    return r.json()


def nothing_quarantined(tooltap) -> bool:
    return not list(Path(tooltap.db_path).parent.glob("*.failed"))


@pytest.mark.parametrize("body, why", [
    (b'{"model":"m","messages":[{"role":"user","content":' + b"[" * 100_000 + b"]" * 100_000 + b"}]}",
     "nested deeper than 254 levels"),
    (b'{"model":"m","messages":[{"role":"user","content":' + b"[" * 300 + b"]" * 300 + b"}]}",
     "nested deeper than 254 levels"),
    (b'{"model":"m","messages":[{"role":"user","content":"half a pair \\ud800 here"}]}', "lone surrogate"),
    (b'{"model":"m","temperature":NaN,"messages":[{"role":"user","content":"nan"}]}', "NaN"),
    (b'{"model":"m","top_p":1e999,"messages":[{"role":"user","content":"big"}]}', "too large for a double"),
    (b'{"model":"m","messages":[{"role":"user","content":"x"}],"bias":-Infinity}', "-Infinity"),
], ids=["100k-deep", "300-deep", "lone-surrogate", "NaN", "1e999", "-Infinity"])
def test_json_no_database_can_hold_is_stored_as_sent(tooltap, upstream, body, why):
    upstream.routes["/chat/completions"] = OK
    turn = send(tooltap, body)
    assert upstream.received[-1].body == body
    assert turn["request"] == body.decode() and turn["request_encoding"] == "text"
    assert why in turn["error"] and "unparsed" in turn["error"]
    assert turn["status"] == "ok"
    assert nothing_quarantined(tooltap)
    for page in (f"/_tooltap/turns/{turn['id']}", f"/_tooltap/sessions/{turn['session_id']}",
                 f"/_tooltap/turns/{turn['id']}/download", f"/_tooltap/api/sessions/{turn['session_id']}"):
        assert httpx.get(tooltap.url + page, timeout=20).status_code == 200, page


def test_bytes_come_back_exact_and_say_how_they_are_written(tooltap, upstream):
    upstream.routes["/chat/completions"] = OK
    binary = bytes(range(256)) * 4
    bad_utf8 = b'{"model":"m","messages":[{"role":"user","content":"caf\xe9 \xff"}]}'
    zipped = gzip.compress(b"\xff not UTF-8 once decompressed")
    for body, headers in [(binary, {"content-type": "application/octet-stream"}), (bad_utf8, JSON),
                          (zipped, {**JSON, "content-encoding": "gzip"})]:
        turn = send(tooltap, body, headers)
        assert upstream.received[-1].body == body
        assert turn["request_encoding"] == "base64"
        assert base64.b64decode(turn["request"]) == body  # as sent: compressed
    assert "not UTF-8 text once decompressed (content-encoding 'gzip')" in turn["error"]

    plain = "plain text, not JSON: é ✓".encode()
    turn = send(tooltap, plain, {"content-type": "text/plain"})
    assert turn["request"] == plain.decode() and turn["request_encoding"] == "text"
    assert turn["error"] is None  # a body that never claimed to be JSON needs no word

    good = {"model": "m", "messages": [{"role": "user", "content": "fine"}], "n": 2**70}
    turn = send(tooltap, json.dumps(good).encode())
    assert turn["request"] == good and turn["request_encoding"] == "json"  # 2^70 exactly

    r = httpx.get(f"{tooltap.url}/v1/models")
    tooltap.flush()
    turn = tooltap.api(f"/turns/{tooltap.api('/turns?limit=1')['turns'][0]['id']}")
    assert turn["method"] == "GET" and turn["request"] is None and turn["request_encoding"] is None


def test_captured_nan_and_lone_surrogates_read_back(tooltap, upstream):
    """What a model sends is not ours to fix: NaN in tool arguments, half a surrogate pair
    in its text. The turn is stored and every read answers."""
    stream = (
        b'data: {"id":"c","object":"chat.completion.chunk","model":"m","choices":[{"index":0,"delta":'
        b'{"role":"assistant","content":"whole "},"finish_reason":null}]}\n\n'
        b'data: {"id":"c","object":"chat.completion.chunk","model":"m","choices":[{"index":0,"delta":'
        b'{"content":"half \\ud83d pair"},"finish_reason":null}]}\n\n'
        b'data: {"id":"c","object":"chat.completion.chunk","model":"m","choices":[{"index":0,"delta":'
        b'{"tool_calls":[{"index":0,"id":"call_1","type":"function","function":{"name":"set",'
        b'"arguments":"{\\"x\\": NaN, \\"y\\": \\"\\\\ud800\\"}"}}]},"finish_reason":null}]}\n\n'
        b'data: {"id":"c","object":"chat.completion.chunk","model":"m","choices":[{"index":0,"delta":{},'
        b'"finish_reason":"tool_calls"}]}\n\ndata: [DONE]\n\n'
    )
    upstream.routes["/chat/completions"] = Reply.sse(stream)
    r = httpx.post(f"{tooltap.url}/chat/completions", headers=JSON,
                   json={"model": "m", "stream": True, "messages": [{"role": "user", "content": "go"}]})
    assert r.content == stream
    tooltap.flush()
    assert nothing_quarantined(tooltap)
    (summary,) = tooltap.api("/turns")["turns"]
    turn = tooltap.api(f"/turns/{summary['id']}")
    call = turn["tool_calls"][0]
    assert call["arguments_raw"] == '{"x": NaN, "y": "\\ud800"}'
    assert call["arguments"] in (None, {"x": None, "y": "\ud800"}, {"x": None, "y": "\ufffd"})
    assert turn["response"]["choices"][0]["message"]["content"].startswith("whole")
    raw = httpx.get(f"{tooltap.url}/_tooltap/api/turns/{summary['id']}/raw")
    assert raw.content == stream
    for page in (f"/_tooltap/turns/{summary['id']}", f"/_tooltap/sessions/{summary['session_id']}",
                 f"/_tooltap/turns/{summary['id']}/download", f"/_tooltap/fragments/turn/{summary['id']}",
                 f"/_tooltap/api/sessions/{summary['session_id']}", "/_tooltap/api/turns", "/_tooltap/"):
        assert httpx.get(tooltap.url + page, timeout=20).status_code == 200, page


def test_tool_arguments_with_integers_beyond_64_bits_are_stored_as_they_are(tooltap, upstream):
    """A JSON column's text is orjson's, which refuses such integers; json.dumps takes them."""
    big = 2**100 + 7
    upstream.routes["/chat/completions"] = Reply.json({
        "id": "r", "object": "chat.completion", "model": "m", "choices": [{"index": 0, "finish_reason": "tool_calls",
            "message": {"role": "assistant", "content": None, "tool_calls": [{"id": "call_1", "type": "function",
                        "function": {"name": "count", "arguments": json.dumps({"n": big, "keys": {"1": 2}})}}]}}]})
    turn = send(tooltap, b'{"model":"m","messages":[{"role":"user","content":"count"}]}')
    assert nothing_quarantined(tooltap) and turn["status"] == "ok"
    assert turn["tool_calls"][0]["arguments"] == {"n": big, "keys": {"1": 2}}


def test_ids_of_any_size_are_answered_not_crashed_on(tooltap, upstream):
    upstream.routes["/chat/completions"] = OK
    send(tooltap, b'{"model":"m","messages":[{"role":"user","content":"hi"}]}')
    for path in [f"/_tooltap/api/turns/{HUGE}", f"/_tooltap/api/turns/{HUGE}/raw",
                 f"/_tooltap/api/turns/{HUGE}/timeline", f"/_tooltap/api/turns/-{HUGE}",
                 f"/_tooltap/turns/{HUGE}", f"/_tooltap/turns/{HUGE}/download",
                 f"/_tooltap/fragments/turn/{HUGE}", f"/_tooltap/api/sessions/{HUGE}", f"/_tooltap/sessions/{HUGE}"]:
        assert httpx.get(tooltap.url + path).status_code == 404, path
    for path in [f"/_tooltap/api/turns?before={HUGE}", f"/_tooltap/api/turns?before=-{HUGE}",
                 f"/_tooltap/api/sessions?offset={HUGE}"]:
        r = httpx.get(tooltap.url + path)
        assert r.status_code == 400 and "2^63" in r.text, path
    r = httpx.get(f"{tooltap.url}/_tooltap/schemas", params={"a": f"turn:{HUGE}", "b": "turn:1"})
    assert r.status_code == 200 and "not found" in r.text
    # a parameter the page does not take is said, not silently dropped for a default comparison
    r = httpx.get(f"{tooltap.url}/_tooltap/schemas", params={"before": "turn:1", "after": "x"})
    assert r.status_code == 200
    assert "no parameter &#39;before&#39; here (not applied): the page compares a=SOURCE and b=SOURCE" in r.text
    assert "no parameter &#39;after&#39; here" in r.text


def test_a_session_named_with_a_slash_has_its_page_and_api_entry(tooltap, upstream):
    upstream.routes["/chat/completions"] = OK
    for name in ("team/alice", "team/alice/tools-study"):
        r = httpx.post(f"{tooltap.url}/chat/completions", headers={**JSON, "x-tooltap-session": name},
                       json={"model": "m", "messages": [{"role": "user", "content": f"hello from {name}"}]})
        assert r.status_code == 200
    tooltap.flush()
    ids = {s["id"] for s in tooltap.api("/sessions")["sessions"]}
    assert ids == {"team/alice", "team/alice/tools-study"}
    for sid in ("team/alice", "team%2Falice"):
        api = tooltap.api(f"/sessions/{sid}")
        assert api["id"] == "team/alice" and api["turns"][0]["session_id"] == "team/alice"
        page = httpx.get(f"{tooltap.url}/_tooltap/sessions/{sid}")
        assert page.status_code == 200 and "hello from team/alice" in page.text
        assert "hello from team/alice/tools-study" not in page.text
        tools = httpx.get(f"{tooltap.url}/_tooltap/sessions/{sid}/tools")
        assert tools.status_code == 200
        row = httpx.get(f"{tooltap.url}/_tooltap/fragments/session-row/{sid}")
        assert row.status_code == 200 and "hello from team/alice" in row.text
    assert tooltap.api("/sessions/team/alice/tools-study")["id"] == "team/alice/tools-study"
    listing = httpx.get(f"{tooltap.url}/_tooltap/").text
    # '/' in a name is quoted in links, so a name such as '../x' cannot step out of /sessions/
    assert 'href="/_tooltap/sessions/team%2Falice"' in listing
    assert httpx.get(f"{tooltap.url}/_tooltap/sessions/team/bob").status_code == 404
