"""Correlation: the cline-weather session through a real tooltap, its MCP call through
the wrapper around a real SDK server, tied together; and the matching rules alone."""

from __future__ import annotations

import json

import httpx
from click.testing import CliRunner
from sqlalchemy import text

from proxy.cli import main
from proxy.mcp.correlate import LlmCall, compare_result, correlate
from proxy.mcp.read import McpCall
from proxy.scripted import Reply
from tests.conftest import cline_turn
from tests.mcp_support import WEATHER, sdk_conversation, with_db, wrapped
from tests.test_proxy_e2e import FINAL_SSE


def play_cline_with_mcp(tooltap, upstream, *, extra_mcp=None):
    """The four cline-weather requests through tooltap, and between turns 3 and 4 what
    Cline did: the MCP call turn 3 asked for, through `tooltap mcp` around the weather
    server, task_progress included. Returns the turns and the MCP result the agent got."""
    turns = [cline_turn(n) for n in (1, 2, 3, 4)]
    upstream.routes["/chat/completions"] = [Reply.sse(t["sse"], split=7) for t in turns[:3]] + [Reply.sse(FINAL_SSE)]
    asked = turns[2]["expected"]["choices"][0]["message"]["tool_calls"][0]["function"]
    arguments = json.loads(asked["arguments"])
    assert "task_progress" in arguments

    async def body(session):
        result = await session.call_tool("get_forecast", arguments)
        if extra_mcp:
            await extra_mcp(session)
        return result

    with httpx.Client(base_url=tooltap.url, timeout=30) as client:
        def post(t):
            r = client.post("/chat/completions", content=t["request"],
                            headers={"content-type": "application/json", "authorization": "Bearer sk-cline-0123456789abcdef"})
            assert r.status_code == 200
        for t in turns[:3]:
            post(t)
        tooltap.flush()
        result = sdk_conversation(wrapped(f"sqlite:///{tooltap.db_path}", *WEATHER), body)
        post(turns[3])
    tooltap.flush()
    return turns, result


def test_cline_weather_mcp_call_is_tied_to_its_turn(make_tooltap, upstream):
    tooltap = make_tooltap(upstream.url)

    async def unasked(session):  # a call no model turn asked for
        await session.call_tool("get_alerts", {"state": "DC"})

    turns, result = play_cline_with_mcp(tooltap, upstream, extra_mcp=unasked)
    forecast = result.content[0].text

    (s,) = tooltap.api("/sessions")["sessions"]
    ids = [t["id"] for t in tooltap.api(f"/sessions/{s['id']}")["turns"]]
    assert len(ids) == 4
    for turn_id in ids[:2]:  # built-in tools: nothing to tie
        assert [c["mcp"] for c in tooltap.api(f"/turns/{turn_id}")["tool_calls"]] == [None]
    (call,) = tooltap.api(f"/turns/{ids[2]}")["tool_calls"]
    assert call["decoded"]["server"] == "weather" and call["decoded"]["tool"] == "get_forecast"
    m = call["mcp"]
    assert m["server"] == "weather" and m["tool"] == "get_forecast" and m["matched_by"] == "arguments"
    assert m["undeclared_arguments"] == ["task_progress"]  # the server's schema says additionalProperties: false
    assert m["is_error"] is False and m["result_text"] == forecast
    assert m["request_at"] < m["result_at"]
    assert m["arguments"] == call["arguments"]  # task_progress reached the server
    # The result ties to the text the agent sent the model in the next turn.
    assert m["next_turn_id"] == ids[3] and m["result_match"] == "same"
    assert call["result"]["text"].strip() == forecast.strip()
    t = m["timings"]
    assert t["model_ms"] > 0 and t["tool_ms"] > 0 and t["agent_delay_ms"] > 0
    assert [f["kind"] for f in m["flags"]] == ["undeclared_arguments"]

    msg = tooltap.api(f"/mcp/messages/{m['message_id']}")
    assert msg["direction"] == "to_server" and msg["method"] == "tools/call"
    assert msg["json"]["params"]["arguments"]["task_progress"] == call["arguments"]["task_progress"]

    report = tooltap.api(f"/mcp/sessions/{s['id']}")
    assert [link["tool_call"] for link in report["links"]] and report["unreached"] == []
    assert [u["tool"] for u in report["unasked"]] == ["get_alerts"]

    servers = tooltap.api("/mcp/servers")["servers"]
    assert [(x["name"], x["calls"], x["errors"]) for x in servers] == [("weather", 2, 0)]
    newest = tooltap.api("/mcp/messages?server=weather&limit=2")["messages"]
    assert [(x["direction"], x["method"], x["json"]["id"]) for x in newest] == [
        ("from_server", "tools/call", newest[1]["jsonrpc_id"]), ("to_server", "tools/call", newest[1]["jsonrpc_id"])]
    assert newest[0]["id"] > newest[1]["id"] and newest[1]["json"]["params"]["name"] == "get_alerts"

    page = tooltap.api("/mcp/servers/weather")
    asked = {c["tool"]: c["asked_by"] for c in page["recent_calls"]}
    assert asked["get_alerts"] is None and asked["get_forecast"]["turn_id"] == ids[2]
    assert page["latency"]["count"] == 2 and page["tool_sets"][0]["tool_names"][:2] == ["crash", "get_alerts"]

    for missing in ("/mcp/servers/nope", "/mcp/messages/99999999", "/mcp/sessions/nope"):
        assert httpx.get(f"{tooltap.url}/_tooltap/api{missing}").status_code == 404

    # What the server declared against what the agent offered the model of it.
    out = CliRunner().invoke(main, ["schemas", "diff", "mcp:weather", f"mcp:weather@session:{s['id']}",
                                    "--format", "json", "--db", f"sqlite:///{tooltap.db_path}"])
    diff = json.loads(out.output)
    status = {t["name"]: t["status"] for t in diff["tools"]}
    assert status["get_radar"] == status["crash"] == "removed"  # the fixture's Cline offered two tools
    assert status["get_forecast"] != "removed" and out.exit_code == 1  # removing tools is breaking
    out = CliRunner().invoke(main, ["schemas", "show", "mcp:weather@999", "--db", f"sqlite:///{tooltap.db_path}"])
    assert out.exit_code == 2 and "mcp:weather@999: no tool set 999 of MCP server 'weather'" in out.output


def test_two_agents_asking_for_the_same_call_at_once_each_get_their_own(make_tooltap, upstream):
    """Two Cline windows play the same session side by side, each with its own MCP
    server process: the two identical calls go one to each session, none is unasked."""
    tooltap = make_tooltap(upstream.url)
    turns = [cline_turn(n) for n in (1, 2, 3, 4)]
    upstream.routes["/chat/completions"] = [Reply.sse(t["sse"], split=7) for t in turns[:3] for _ in "ab"] \
        + [Reply.sse(FINAL_SSE)] * 2
    arguments = json.loads(turns[2]["expected"]["choices"][0]["message"]["tool_calls"][0]["function"]["arguments"])

    async def body(session):
        return await session.call_tool("get_forecast", arguments)

    with httpx.Client(base_url=tooltap.url, timeout=30) as client:
        def post(t, window):
            r = client.post("/chat/completions", content=t["request"],
                            headers={"content-type": "application/json", "x-tooltap-session": window})
            assert r.status_code == 200
        for t in turns[:3]:
            post(t, "window-a")
            post(t, "window-b")
        tooltap.flush()
        for _ in "ab":
            sdk_conversation(wrapped(f"sqlite:///{tooltap.db_path}", *WEATHER), body)
        post(turns[3], "window-a")
        post(turns[3], "window-b")
    tooltap.flush()
    reports = [tooltap.api(f"/mcp/sessions/{window}") for window in ("window-a", "window-b")]
    claimed = [[link["message_id"] for link in r["links"]] for r in reports]
    assert len(claimed[0]) == len(claimed[1]) == 1 and claimed[0] != claimed[1], claimed
    assert [r["unasked"] for r in reports] == [[], []]


def test_matching_rules():
    def llm(row_id, turn, tool, args, started, next_at, server="weather", call_id=None, result=None):
        return LlmCall(row_id, turn, 0, call_id, server, tool, args, result, started, started + 1, 1000.0,
                       turn + 1 if next_at else None, next_at)

    def mcp(msg_id, tool, args, at, server="weather", meta=None):
        return McpCall(msg_id, server, "c1", str(msg_id), tool, args, meta, at)

    calls = [llm(1, 1, "get_forecast", {"latitude": 1, "task_progress": "- [ ] a"}, 10.0, 20.0),
             llm(2, 2, "get_forecast", {"latitude": 1}, 20.0, 30.0),
             llm(3, 3, "get_forecast", {"latitude": 2}, 30.0, None, call_id="call_x"),
             llm(4, 4, "get_alerts", {"state": "CA"}, 40.0, 50.0, server="cIya4J")]  # an unresolved uid
    sent = [mcp(100, "get_forecast", {"latitude": 1}, 5.0),  # before any turn asked: nobody's
            mcp(101, "get_forecast", {"latitude": 1, "task_progress": "- [x] a"}, 12.0),
            mcp(102, "get_forecast", {"latitude": 1}, 22.0),
            mcp(103, "get_forecast", {"latitude": 9}, 31.0, meta={"toolCallId": "call_x"}),  # by id, args aside
            mcp(104, "get_alerts", {"state": "CA"}, 41.0, server="weather")]
    found, how = correlate(calls, sent, known_servers={"weather"})
    assert {k: v.message_id for k, v in found.items()} == {1: 101, 2: 102, 3: 103, 4: 104}
    assert how == {1: "arguments", 2: "arguments", 3: "meta", 4: "arguments"}
    # No next turn (its answer ended at 31.0): an MCP call is its own only while it is due.
    last = llm(5, 5, "get_forecast", {"latitude": 3}, 30.0, None)
    assert correlate([last], [mcp(400, "get_forecast", {"latitude": 3}, 31.0 + 26)], {"weather"})[0] == {}
    assert correlate([last], [mcp(401, "get_forecast", {"latitude": 3}, 31.0 + 2)], {"weather"})[1] == {5: "arguments"}
    # An MCP call after the next turn started cannot be this turn's.
    late = [mcp(200, "get_forecast", {"latitude": 1}, 25.0)]
    assert correlate(calls[:1], late, {"weather"})[0] == {}
    # Another server's tool of the same name is not it, when the call's server is a known one.
    other = [mcp(300, "get_forecast", {"latitude": 1}, 12.0, server="other")]
    assert correlate(calls[:1], other, {"weather", "other"})[0] == {}
    # Two sessions, each with its own connection: a later call keeps to its session's one,
    # though the other session's call of the same arguments came first.
    a1, b1 = llm(10, 10, "t", {"n": 1}, 10.0, 20.0), llm(11, 11, "t", {"n": 2}, 10.0, 20.0)
    a2, b2 = llm(12, 12, "t", {"n": 3}, 30.0, 40.0), llm(13, 13, "t", {"n": 3}, 30.0, 40.0)
    a1.session = a2.session = "a"
    b1.session = b2.session = "b"
    on = [McpCall(20, "weather", "conn-a", "1", "t", {"n": 1}, None, 11.0),
          McpCall(21, "weather", "conn-b", "1", "t", {"n": 2}, None, 11.0),
          McpCall(22, "weather", "conn-b", "2", "t", {"n": 3}, None, 31.0),
          McpCall(23, "weather", "conn-a", "2", "t", {"n": 3}, None, 31.5)]
    found = correlate([a1, b1, a2, b2], on, {"weather"})[0]
    assert {k: v.message_id for k, v in found.items()} == {10: 20, 11: 21, 12: 23, 13: 22}

    def of(session, *calls):
        for c in calls:
            c.session = session
        return list(calls)

    # A call the user denied (never sent) does not take another agent's call on that
    # agent's connection, though its turn came first.
    b0 = of("b", llm(30, 30, "t", {"n": 0}, 0.0, 5.0))
    a_denied, b_same = of("a", llm(31, 31, "t", {"n": 9}, 10.0, 20.0)) + of("b", llm(32, 32, "t", {"n": 9}, 10.5, 20.0))
    sent = [McpCall(40, "weather", "conn-b", "1", "t", {"n": 0}, None, 1.0),
            McpCall(41, "weather", "conn-b", "2", "t", {"n": 9}, None, 11.0)]
    found = correlate(sorted([*b0, a_denied, b_same], key=lambda c: c.turn_started), sent, {"weather"})[0]
    assert {k: v.message_id for k, v in found.items()} == {30: 40, 32: 41}
    # Both agents make the same first call, B's reaching its server first: A keeps to the
    # connection its unambiguous second call proves is its own, for the first and the third.
    calls = [*of("a", llm(50, 50, "t", {"n": 1}, 10.0, 20.0)), *of("b", llm(51, 51, "t", {"n": 1}, 10.0, 20.0)),
             *of("a", llm(52, 52, "t", {"n": 2}, 20.0, 30.0)), *of("b", llm(53, 53, "t", {"n": 3}, 20.0, 30.0)),
             *of("a", llm(54, 54, "t", {"n": 4}, 30.0, 40.0)), *of("b", llm(55, 55, "t", {"n": 4}, 30.0, 40.0))]
    sent = [McpCall(60, "weather", "conn-b", "1", "t", {"n": 1}, None, 10.05),
            McpCall(61, "weather", "conn-a", "1", "t", {"n": 1}, None, 10.1),
            McpCall(62, "weather", "conn-a", "2", "t", {"n": 2}, None, 21.0),
            McpCall(63, "weather", "conn-b", "2", "t", {"n": 3}, None, 21.0),
            McpCall(64, "weather", "conn-b", "3", "t", {"n": 4}, None, 31.0),
            McpCall(65, "weather", "conn-a", "3", "t", {"n": 4}, None, 31.2)]
    found = correlate(calls, sent, {"weather"})[0]
    assert {k: v.connection for k, v in found.items()} == {
        50: "conn-a", 51: "conn-b", 52: "conn-a", 53: "conn-b", 54: "conn-a", 55: "conn-b"}


def test_result_comparison():
    text = "Today: 68F\n" + "x" * 1000
    assert compare_result("\n" + text + "\n", text) == "same"
    assert compare_result(text[:500], text) == "truncated"
    assert compare_result(text[:500] + "\n[output truncated]", text) == "truncated"
    assert compare_result("The tool execution failed", text) == "changed"
    assert compare_result(None, text) is None


def _captured_mcp() -> list[dict]:
    """The real MCP traffic of the cline-weather capture: the tools/call and its result."""
    from tests.conftest import CLINE

    return [json.loads(line)["message"] for line in (CLINE / "mcp_stdio.jsonl").read_text().splitlines()]


def test_truncated_result_and_a_call_that_never_reached_the_server(make_tooltap, upstream):
    """The captured MCP exchange recorded by the recorder the wrapper uses; the agent then
    gives the model only the start of the result. A second run of the task, whose MCP call
    the server never got, is flagged as unreached."""
    from proxy.mcp.store import Connection, Recorder, new_id

    tooltap = make_tooltap(upstream.url)
    recorder = Recorder(f"sqlite:///{tooltap.db_path}", tooltap.db_path.parent / "spool")
    recorder.start()
    conn = Connection(new_id(), "stdio", name="weather")
    turns = [cline_turn(n) for n in (1, 2, 3, 4)]
    call, answer = _captured_mcp()
    forecast = answer["result"]["content"][0]["text"]
    request4 = json.loads(turns[3]["request"])
    block = request4["messages"][-1]["content"][0]
    assert block["text"].startswith("[use_mcp_tool for 'weather'] Result:")
    block["text"] = "[use_mcp_tool for 'weather'] Result:\n" + forecast[:400] + "\n(output truncated)"
    schema = {"type": "object", "properties": {"latitude": {"type": "number"}, "longitude": {"type": "number"}},
              "required": ["latitude", "longitude"], "additionalProperties": False}

    def play(session: str, with_mcp: bool, last: bytes):
        upstream.routes["/chat/completions"] = [Reply.sse(t["sse"]) for t in turns[:3]] + [Reply.sse(FINAL_SSE)]
        upstream.received.clear()
        with httpx.Client(base_url=tooltap.url, timeout=30) as client:
            for body in [t["request"] for t in turns[:3]] + [last]:
                if body is last and with_mcp:
                    tooltap.flush()
                    for direction, msg in [("to_server", {"jsonrpc": "2.0", "id": 1, "method": "tools/list"}),
                                           ("from_server", {"jsonrpc": "2.0", "id": 1, "result": {"tools": [
                                               {"name": "get_forecast", "inputSchema": schema}]}}),
                                           ("to_server", call), ("from_server", answer)]:
                        recorder.record(conn, direction, json.dumps(msg, ensure_ascii=False).encode())
                    recorder.flush()
                r = client.post("/chat/completions", content=body, headers={
                    "content-type": "application/json", "x-tooltap-session": session})
                assert r.status_code == 200
        tooltap.flush()

    play("first", True, json.dumps(request4).encode())
    play("second", False, turns[3]["request"])
    recorder.close()

    first = tooltap.api("/sessions/first")["turns"]
    m = tooltap.api(f"/turns/{first[2]['id']}")["tool_calls"][0]["mcp"]
    assert m["result_match"] == "truncated" and m["result_text"] == forecast
    assert m["agent_text"].strip().endswith("(output truncated)")
    assert [f["kind"] for f in m["flags"]] == ["undeclared_arguments", "result_truncated"]
    html = httpx.get(f"{tooltap.url}/_tooltap/sessions/first").text
    assert "result truncated by the agent" in html and "(output truncated)" in html

    second = tooltap.api("/sessions/second")["turns"]
    assert tooltap.api(f"/turns/{second[2]['id']}")["tool_calls"][0]["mcp"] is None
    report = tooltap.api("/mcp/sessions/second")
    assert report["links"] == [] and [(u["tool"], u["turn_id"]) for u in report["unreached"]] == [
        ("get_forecast", second[2]["id"])]
    assert "never reached the server" in httpx.get(f"{tooltap.url}/_tooltap/sessions/second").text


def test_an_agent_that_offers_the_servers_tools_under_their_own_names(make_tooltap, upstream):
    """An agent built on the SDKs gives the model the MCP server's tools as they are named
    (no Cline `<uid>0mcp0` prefix): its call is still tied to the server's, by tool name,
    arguments and time, and the server's page no longer calls it unasked."""
    from proxy.demo import chat_sse
    from tests.mcp_support import WASHINGTON

    tooltap = make_tooltap(upstream.url)
    tool = {"type": "function", "function": {"name": "get_forecast", "parameters": {"type": "object"}}}
    opening = {"model": "m", "stream": True, "tools": [tool],
               "messages": [{"role": "user", "content": "Weather in Washington tomorrow?"}]}
    deltas = [{"tool_calls": [{"index": 0, "id": "call_w", "type": "function",
                               "function": {"name": "get_forecast", "arguments": ""}}]},
              {"tool_calls": [{"index": 0, "function": {"arguments": json.dumps(WASHINGTON)}}]}]
    upstream.routes["/chat/completions"] = [Reply.sse(chat_sse("m", deltas, finish="tool_calls")),
                                            Reply.sse(FINAL_SSE)]

    async def call(session):
        return await session.call_tool("get_forecast", WASHINGTON)

    with httpx.Client(base_url=tooltap.url, timeout=30) as client:
        assert client.post("/chat/completions", json=opening).status_code == 200
        tooltap.flush()
        forecast = sdk_conversation(wrapped(f"sqlite:///{tooltap.db_path}", *WEATHER), call).content[0].text
        assistant = {"role": "assistant", "content": None, "tool_calls": [
            {"id": "call_w", "type": "function", "function": {"name": "get_forecast",
                                                              "arguments": json.dumps(WASHINGTON)}}]}
        follow = {**opening, "messages": [*opening["messages"], assistant,
                                          {"role": "tool", "tool_call_id": "call_w", "content": forecast}]}
        assert client.post("/chat/completions", json=follow).status_code == 200
    tooltap.flush()

    (s,) = tooltap.api("/sessions")["sessions"]
    ids = [t["id"] for t in tooltap.api(f"/sessions/{s['id']}")["turns"]]
    (c,) = tooltap.api(f"/turns/{ids[0]}")["tool_calls"]
    assert c["name"] == "get_forecast" and c["mcp"] is not None
    assert (c["mcp"]["server"], c["mcp"]["matched_by"], c["mcp"]["next_turn_id"], c["mcp"]["result_match"]) == (
        "weather", "arguments", ids[1], "same")
    report = tooltap.api(f"/mcp/sessions/{s['id']}")
    assert len(report["links"]) == 1 and report["unasked"] == [] and report["unreached"] == []
    (recent,) = [x for x in tooltap.api("/mcp/servers/weather")["recent_calls"] if x["tool"] == "get_forecast"]
    assert recent["asked_by"]["turn_id"] == ids[0]
    card = httpx.get(f"{tooltap.url}/_tooltap/turns/{ids[0]}").text
    card = card[card.index('data-testid="tool-call"'):]
    assert 'data-testid="call-name">weather › get_forecast<' in card  # not a built-in: its MCP call says so
    # The stored decoding reads the name alone (builtin): the card keeps its word and says apart what it found.
    assert '<span class="tag">builtin</span>' in card and '>ran as MCP · matched by arguments</span>' in card
    assert with_db(f"sqlite:///{tooltap.db_path}", lambda db: db.execute(text(
        "SELECT kind, server FROM tool_calls_v WHERE turn_id = :t"), {"t": ids[0]}).one()) == ("builtin", None)
    # What the server declared against what this agent offered the model of it, by name.
    out = CliRunner().invoke(main, ["schemas", "diff", "mcp:weather", f"mcp:weather@session:{s['id']}",
                                    "--format", "json", "--db", f"sqlite:///{tooltap.db_path}"])
    status = {t["name"]: t["status"] for t in json.loads(out.output)["tools"]}
    assert status["get_forecast"] != "removed" and status["get_alerts"] == "removed", out.output
