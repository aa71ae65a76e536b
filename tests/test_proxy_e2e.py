"""End to end: a real client, a real tooltap (uvicorn), a real scripted upstream, a SQLite file."""

from __future__ import annotations

import hashlib
import json

import httpx
import openai

from proxy.scripted import Reply
from tests.conftest import cline_turn

FINAL_SSE = (
    b'data: {"id":"c4","object":"chat.completion.chunk","created":1,"model":"deepseek-chat",'
    b'"choices":[{"index":0,"delta":{"role":"assistant","content":"Sunny, 21\\u00b0C."},"finish_reason":null}]}\n\n'
    b'data: {"id":"c4","object":"chat.completion.chunk","created":1,"model":"deepseek-chat",'
    b'"choices":[{"index":0,"delta":{},"finish_reason":"stop"}]}\n\n'
    b"data: [DONE]\n\n"
)


def play_cline(tooltap, upstream, split=7):
    """Send the four cline-weather requests through tooltap; return what the client got."""
    turns = [cline_turn(n) for n in (1, 2, 3, 4)]
    upstream.routes["/chat/completions"] = [
        Reply.sse(t["sse"], split=split) for t in turns[:3]
    ] + [Reply.sse(FINAL_SSE)]
    got = []
    with httpx.Client(base_url=tooltap.url, timeout=10) as client:
        for t in turns:
            r = client.post("/chat/completions", content=t["request"],
                            headers={"content-type": "application/json",
                                     "authorization": "Bearer sk-cline-secret-0123456789abcdef"})
            assert r.status_code == 200
            got.append(r.content)
    return turns, got


def test_cline_weather_end_to_end(tooltap, upstream):
    turns, got = play_cline(tooltap, upstream)

    # Byte for byte what the upstream sent, and the upstream got the agent's bytes.
    for t, body in zip(turns[:3], got):
        assert body == t["sse"]
    assert [r.body for r in upstream.received] == [t["request"] for t in turns]

    sessions = tooltap.api("/sessions")["sessions"]
    assert len(sessions) == 1
    s = sessions[0]
    assert s["turns"] == 4 and s["tool_calls"] == 3 and s["models"] == ["deepseek-chat"]
    assert s["title"].startswith("华盛顿明天天气如何")

    session = tooltap.api(f"/sessions/{s['id']}")
    ids = [t["id"] for t in session["turns"]]
    assert [t["parent_id"] for t in session["turns"]] == [None, *ids[:-1]]
    assert [t["tool_call_names"] for t in session["turns"]] == [
        ["list_files"], ["read_file"], ["cIya4J0mcp0get_forecast"], []]

    for n, turn_id in enumerate(ids[:3]):
        turn = tooltap.api(f"/turns/{turn_id}")
        assert turn["api"] == "openai.chat" and turn["status"] == "ok" and turn["stream"] is True
        assert turn["response"] == turns[n]["expected"]
        assert turn["response"] != turns[n]["published"]  # the capture's author lost content and a name
        assert turn["request"] == json.loads(turns[n]["request"])
        assert turn["raw_sha256"] == hashlib.sha256(turns[n]["sse"]).hexdigest()
        assert turn["ttft_ms"] > 0 and turn["duration_ms"] >= turn["ttft_ms"]
        assert turn["usage"] == turns[n]["expected"]["usage"]
        raw = httpx.get(f"{tooltap.url}/_tooltap/api/turns/{turn_id}/raw")
        assert raw.content == turns[n]["sse"]
        assert raw.headers["content-type"] == "text/event-stream"  # as the upstream sent it, no charset added
        call = turn["tool_calls"][0]
        expected_call = turns[n]["expected"]["choices"][0]["message"]["tool_calls"][0]
        assert call["id"] == expected_call["id"]
        assert call["arguments_raw"] == expected_call["function"]["arguments"]
        assert call["arguments"] == json.loads(expected_call["function"]["arguments"])
    last = tooltap.api(f"/turns/{ids[3]}")
    assert last["response"]["choices"][0]["message"]["content"] == "Sunny, 21°C."
    assert [t["id"] for t in tooltap.api("/turns?limit=2")["turns"]] == [ids[3], ids[2]]


def test_storage_is_content_addressed(tooltap, upstream):
    turns, _ = play_cline(tooltap, upstream)
    import sqlite3

    tooltap.flush()
    db = sqlite3.connect(tooltap.db_path)
    blobs = db.execute("select count(*) from blobs").fetchone()[0]
    last_messages = len(json.loads(turns[3]["request"])["messages"])
    # Each distinct message once, plus one tools array (the same in all four turns).
    assert blobs == last_messages + 1
    assert db.execute("select count(distinct tools_hash) from turns").fetchone()[0] == 1


def test_openai_sdk_streaming_tools(tooltap, upstream):
    """The official SDK, streaming with tools, through tooltap; read back from the API."""
    chunks = [
        {"choices": [{"index": 0, "delta": {"role": "assistant", "content": "Checking. "}}]},
        {"choices": [{"index": 0, "delta": {"tool_calls": [
            {"index": 0, "id": "call_a", "type": "function", "function": {"name": "get_weather", "arguments": ""}},
            {"index": 1, "id": "call_b", "type": "function", "function": {"name": "get_time", "arguments": "{\"tz\":"}},
        ]}}]},
        {"choices": [{"index": 0, "delta": {"tool_calls": [
            {"index": 0, "function": {"arguments": "{\"city\": \"Paris\"}"}},
            {"index": 1, "function": {"arguments": "\"CET\"}"}},
        ]}}]},
        {"choices": [{"index": 0, "delta": {}, "finish_reason": "tool_calls"}]},
        {"choices": [], "usage": {"prompt_tokens": 10, "completion_tokens": 5, "total_tokens": 15}},
    ]
    body = b"".join(
        b"data: " + json.dumps({"id": "x", "object": "chat.completion.chunk", "created": 1,
                                "model": "gpt-test", **c}).encode() + b"\n\n"
        for c in chunks
    ) + b"data: [DONE]\n\n"
    upstream.routes["/v1/chat/completions"] = Reply.sse(body)

    client = openai.OpenAI(base_url=f"{tooltap.url}/v1", api_key="sk-test-0123456789abcdef")
    stream = client.chat.completions.create(
        model="gpt-test", messages=[{"role": "user", "content": "weather and time?"}], stream=True,
        stream_options={"include_usage": True},
        tools=[{"type": "function", "function": {"name": "get_weather", "parameters": {"type": "object"}}}],
    )
    seen = [c for c in stream]
    assert len(seen) == 5

    turn = tooltap.api("/turns")["turns"][0]
    full = tooltap.api(f"/turns/{turn['id']}")
    message = full["response"]["choices"][0]["message"]
    assert message["content"] == "Checking. "
    assert [(c["name"], c["arguments"]) for c in full["tool_calls"]] == [
        ("get_weather", {"city": "Paris"}), ("get_time", {"tz": "CET"})]
    assert full["usage"]["total_tokens"] == 15
    assert full["request"]["tools"][0]["function"]["name"] == "get_weather"
    # Keys in headers are fingerprints, never the key.
    auth = dict(full["request_headers"])["authorization"]
    assert "sk-test-0123456789abcdef" not in auth and auth.startswith("Bearer …cdef#")


def test_headers_pass_through_unchanged(tooltap, upstream):
    upstream.routes["/echo"] = Reply(200, [("content-type", "text/plain"), ("x-upstream", "1"),
                                           ("set-cookie", "a=b")], [b"ok"])
    r = httpx.post(f"{tooltap.url}/echo?a=1&b=%20x", content=b"payload",
                   headers={"x-custom": "v", "x-tooltap-session": "mine", "connection": "keep-alive"})
    got = upstream.received[-1]
    assert got.query == "a=1&b=%20x"
    names = [k for k, _ in got.headers]
    # What the client sent, less Host (rewritten), hop-by-hop and tooltap's own header.
    assert "x-tooltap-session" not in names and "connection" not in names
    assert got.header("x-custom") == "v" and got.header("user-agent").startswith("python-httpx")
    assert got.header("host") == upstream.url.removeprefix("http://")
    assert got.body == b"payload"
    # Upstream headers back unchanged, and nothing of uvicorn's own.
    assert r.headers["x-upstream"] == "1" and r.headers["set-cookie"] == "a=b"
    assert "server" not in r.headers and "date" not in r.headers
    turn = tooltap.api("/turns")["turns"][0]
    assert turn["session_id"] == "mine" and turn["api"] == "other"


def test_compressed_body_passes_as_sent_and_is_captured(tooltap, upstream):
    import gzip

    completion = {"id": "c", "object": "chat.completion", "model": "m",
                  "choices": [{"index": 0, "message": {"role": "assistant", "content": "hé"},
                               "finish_reason": "stop"}]}
    packed = gzip.compress(json.dumps(completion).encode())
    upstream.routes["/chat/completions"] = Reply(
        200, [("content-type", "application/json"), ("content-encoding", "gzip"),
              ("content-length", str(len(packed)))], [packed])
    with httpx.Client() as client:
        with client.stream("POST", f"{tooltap.url}/chat/completions",
                           json={"model": "m", "messages": [{"role": "user", "content": "x"}]},
                           headers={"accept-encoding": "gzip"}) as r:
            assert b"".join(r.iter_raw()) == packed
    turn = tooltap.api(f"/turns/{tooltap.api('/turns')['turns'][0]['id']}")
    assert turn["response"] == completion
    assert turn["raw_sha256"] == hashlib.sha256(packed).hexdigest()


def test_named_upstreams(make_tooltap, upstream):
    from proxy.scripted import ScriptedUpstream
    from tests.conftest import Server

    other = ScriptedUpstream({"/v1/messages": Reply.json({"from": "other"})})
    upstream.routes["/chat/completions"] = Reply.json({"from": "root"})
    upstream.routes["/api/chat/completions"] = Reply.json({"from": "root-prefixed"})
    with Server(other) as other_server:
        tt = make_tooltap(upstream.url, f"claude={other_server.url}", f"deep={upstream.url}/api")
        assert httpx.post(f"{tt.url}/chat/completions", json={}).json() == {"from": "root"}
        assert httpx.post(f"{tt.url}/claude/v1/messages", json={}).json() == {"from": "other"}
        assert httpx.post(f"{tt.url}/deep/chat/completions", json={}).json() == {"from": "root-prefixed"}
        assert other.received[0].path == "/v1/messages"
        turns = tt.api("/turns")["turns"]
        assert {t["path"]: t["api"] for t in turns} == {
            "/chat/completions": "openai.chat", "/claude/v1/messages": "anthropic.messages",
            "/deep/chat/completions": "openai.chat"}


def test_named_upstreams_only_a_path_outside_them_is_told_which_prefixes_exist(make_tooltap, upstream):
    """The newcomer's mistake: the client's base URL without the upstream's prefix."""
    tt = make_tooltap(f"oa={upstream.url}", f"claude={upstream.url}")
    r = httpx.post(f"{tt.url}/chat/completions", json={})
    assert r.status_code == 404 and upstream.received == []
    assert r.json()["error"] == {"type": "tooltap_no_upstream", "message": (
        "no upstream serves /chat/completions; this tooltap serves /oa/..., /claude/...: "
        "end the client's base URL with one of those prefixes")}


def test_reserved_prefix_is_not_forwarded(tooltap, upstream):
    assert httpx.get(f"{tooltap.url}/_tooltap/api/turns").json() == {"turns": []}
    assert httpx.get(f"{tooltap.url}/_tooltap/api/nope").status_code == 404
    assert upstream.received == []
    for method in ("GET", "HEAD"):  # HEAD answers as GET does
        r = httpx.request(method, f"{tooltap.url}/", headers={"accept": "text/html"})
        assert r.status_code == 307 and r.headers["location"] == "/_tooltap/"
    # A browser showing the API's JSON asks for an icon: answered here, no turn recorded.
    icon = httpx.get(f"{tooltap.url}/favicon.ico", headers={"sec-fetch-dest": "image"})
    assert icon.status_code == 204 and upstream.received == []
    assert tooltap.api("/turns") == {"turns": []}
    # Anything else at that path is the upstream's, as every path outside /_tooltap/ is.
    httpx.get(f"{tooltap.url}/favicon.ico")
    assert [r.path for r in upstream.received] == ["/favicon.ico"]


def test_cline_weather_decoded(tooltap, upstream):
    """Issue 3's done-criterion, read back through the API."""
    play_cline(tooltap, upstream)
    session = tooltap.api("/sessions")["sessions"][0]
    assert session["agent"] == "cline"
    turns = [tooltap.api(f"/turns/{t['id']}") for t in tooltap.api(f"/sessions/{session['id']}")["turns"]]
    calls = [t["tool_calls"][0] for t in turns[:3]]
    mcp = calls[2]
    assert (mcp["decoded"]["kind"], mcp["decoded"]["server"], mcp["decoded"]["tool"]) == ("mcp", "weather", "get_forecast")
    assert [c["decoded"]["kind"] for c in calls[:2]] == ["builtin", "builtin"]
    assert [(c["task_progress"]["done"], c["task_progress"]["total"]) for c in calls] == [(0, 4), (1, 4), (2, 4)]
    for c in calls:
        assert c["result"]["placeholder"] == "result missing"
        assert c["result"]["source"] == "user_text_block" and c["result"]["text"]
    assert calls[0]["result"]["text"].startswith(".python-version\n")
    assert "Temperature: 68°F" in mcp["result"]["text"]
    assert [v["path"] for v in mcp["violations"]] == ["$.task_progress"]
    assert calls[0]["violations"] == [] and calls[1]["violations"] == []
    assert turns[1]["decoding"]["environment"]["mode"] == "ACT"


def test_redecode_gives_the_live_answer(tooltap, upstream):
    import sqlite3

    from click.testing import CliRunner

    from proxy.cli import main

    play_cline(tooltap, upstream)
    session_id = tooltap.api("/sessions")["sessions"][0]["id"]
    live = [tooltap.api(f"/turns/{t['id']}") for t in tooltap.api(f"/sessions/{session_id}")["turns"]]
    db = sqlite3.connect(tooltap.db_path)
    db.execute("update tool_calls set decoded = null, task_progress = null, result = null, violations = null")
    db.execute("update turns set decoding = null")
    db.commit()
    assert tooltap.api(f"/turns/{live[0]['id']}")["tool_calls"][0]["decoded"] is None

    result = CliRunner().invoke(main, ["redecode", "--db", f"sqlite:///{tooltap.db_path}"])
    assert result.exit_code == 0, result.output
    assert "redecoded 1 session(s)" in result.output
    again = [tooltap.api(f"/turns/{t['id']}") for t in live]
    assert [t["tool_calls"] for t in again] == [t["tool_calls"] for t in live]
    assert [t["decoding"] for t in again] == [t["decoding"] for t in live]


def test_path_encoding_and_odd_header_bytes_pass_through(tooltap, upstream):
    upstream.routes["/v1/files/a/b c"] = Reply(200, [("content-type", "text/plain"), ("x-odd", "café")],
                                               [b"fine"])
    with httpx.Client() as client:
        r = client.get(f"{tooltap.url}/v1/files/a%2Fb%20c",
                       headers=[(b"x-utf8", "café ✓".encode())])
    got = upstream.received[-1]
    assert r.content == b"fine" and (b"x-odd", "café".encode("latin-1")) in r.headers.raw
    assert got.raw_path == b"/v1/files/a%2Fb%20c"  # as the agent encoded it, not re-encoded
    assert got.header("x-utf8").encode("latin-1") == "café ✓".encode()  # the bytes arrived as sent


def test_text_path_tool_calls_are_listed(tooltap, upstream):
    """A model without native tools answers Cline with XML in its text."""
    text = ("I will read it.\n<read_file>\n<path>src/app.py</path>\n"
            "<task_progress>\n- [x] look\n- [ ] fix\n</task_progress>\n</read_file>")
    upstream.routes["/chat/completions"] = Reply.json({
        "id": "x", "object": "chat.completion", "model": "local",
        "choices": [{"index": 0, "message": {"role": "assistant", "content": text}, "finish_reason": "stop"}]})
    body = json.loads(cline_turn(1)["request"])
    body.pop("tools"), body.pop("tool_choice", None)
    httpx.post(f"{tooltap.url}/chat/completions", json=body)
    turn = tooltap.api(f"/turns/{tooltap.api('/turns')['turns'][0]['id']}")
    (call,) = turn["tool_calls"]
    assert call["source"] == "text" and call["name"] == "read_file"
    assert call["arguments"]["path"] == "src/app.py"
    assert (call["task_progress"]["done"], call["task_progress"]["total"]) == (1, 2)


def test_gzip_event_stream_is_assembled_after_the_fact(tooltap, upstream):
    import gzip

    stream = cline_turn(2)["sse"]
    packed = gzip.compress(stream)
    upstream.routes["/chat/completions"] = Reply(
        200, [("content-type", "text/event-stream"), ("content-encoding", "gzip")],
        [packed[i:i + 100] for i in range(0, len(packed), 100)])
    with httpx.Client() as client:
        with client.stream("POST", f"{tooltap.url}/chat/completions", content=cline_turn(2)["request"],
                           headers={"accept-encoding": "gzip"}) as r:
            assert b"".join(r.iter_raw()) == packed
    turn = tooltap.api(f"/turns/{tooltap.api('/turns')['turns'][0]['id']}")
    assert turn["stream"] is True and turn["response"] == cline_turn(2)["expected"]
