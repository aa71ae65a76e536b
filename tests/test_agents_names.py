"""MCP tool-name conventions: Cline 3.x, Cline 4.x SDK, Claude Code, `__mcp__`, builtins."""

from __future__ import annotations

import hashlib
import json
import re

from proxy.agents import CallInput, TurnInput, decode_session

CLINE_SYSTEM = "You are Cline, a highly skilled software engineer."


def tool(name, description="", properties=None, required=()):
    return {"type": "function", "function": {"name": name, "description": description, "parameters": {
        "type": "object", "properties": properties or {}, "required": list(required)}}}


def call(index, name, args=None, id=None):
    raw = json.dumps(args or {})
    return CallInput(index, id or f"call_{index}_{name}", name, raw, args or {}, None)


def turn(id, parent, tools, calls, messages=None, system=CLINE_SYSTEM):
    msgs = [{"role": "system", "content": system}] + (messages or [{"role": "user", "content": "<task>\nx\n</task>"}])
    return TurnInput(id, parent, "openai.chat", {"model": "m", "messages": msgs, "tools": tools}, {"choices": []}, calls)


def decoded(turns, turn_id=1, index=0):
    return decode_session(turns).call(turn_id, index)["decoded"]


def test_cline3_uid_resolves_from_description():
    d = decoded([turn(1, None, [tool("c1b2C30mcp0search", "github: Search issues")], [call(0, "c1b2C30mcp0search")])])
    assert d == {"kind": "mcp", "server": "github", "tool": "search", "convention": "cline3",
                 "uid": "c1b2C3", "resolved": True}


def test_cline3_splits_at_first_identifier():
    d = decoded([turn(1, None, [tool("abc0mcp0do0mcp0it", "srv: x")], [call(0, "abc0mcp0do0mcp0it")])])
    assert (d["uid"], d["tool"], d["server"]) == ("abc", "do0mcp0it", "srv")


def test_cline3_unresolved_uid_stays_uid():
    d = decoded([turn(1, None, [tool("deadbeef0mcp0ping", "Ping the host")], [call(0, "deadbeef0mcp0ping")])])
    assert (d["server"], d["tool"], d["resolved"], d["uid"]) == ("deadbeef", "ping", False, "deadbeef")


def test_cline3_uid_resolves_once_across_the_session():
    # Only turn 1 offers the description; turn 2's call of the same uid still resolves.
    t1 = turn(1, None, [tool("cAAAAA0mcp0a", "notes: A")], [call(0, "read_file", {"path": "x"})])
    t2 = turn(2, 1, [tool("cAAAAA0mcp0a", "")], [call(0, "cAAAAA0mcp0a")])
    d = decoded([t1, t2], 2)
    assert (d["server"], d["resolved"]) == ("notes", True)


def test_cline3_different_uids_in_different_sessions_map_to_the_same_server():
    s1 = decoded([turn(1, None, [tool("cAAAAA0mcp0get", "weather: x")], [call(0, "cAAAAA0mcp0get")])])
    s2 = decoded([turn(9, None, [tool("cBBBBB0mcp0get", "weather: x")], [call(0, "cBBBBB0mcp0get")])], 9)
    assert s1["server"] == s2["server"] == "weather"
    assert s1["uid"] != s2["uid"]


def test_cline3_uid_resolved_only_from_a_later_result_header():
    name = "cQQQQQ0mcp0get_forecast"
    t1 = turn(1, None, [tool(name, "Get a forecast")], [call(0, name, {"latitude": 1}, id="c1")])
    t2 = turn(2, 1, [tool(name, "Get a forecast")], [], messages=[
        {"role": "user", "content": "<task>\nx\n</task>"},
        {"role": "assistant", "content": None, "tool_calls": [
            {"id": "c1", "type": "function", "function": {"name": name, "arguments": "{}"}}]},
        {"role": "tool", "tool_call_id": "c1", "content": "result missing"},
        {"role": "user", "content": [{"type": "text", "text": "[use_mcp_tool for 'weather'] Result:\nsunny"}]},
    ])
    out = decode_session([t1, t2])
    d = out.call(1, 0)["decoded"]
    assert (d["server"], d["tool"], d["resolved"], d["uid"]) == ("weather", "get_forecast", True, "cQQQQQ")
    assert out.call(1, 0)["result"]["text"] == "sunny"
    assert out.uids == {"cQQQQQ": "weather"}


def _sdk_name(server: str, tool_name: str) -> str:
    """The Cline 4.x SDK naming rule as DESIGN.md states it."""
    raw = f"{server}__{tool_name}"
    clean = re.sub(r"[^a-zA-Z0-9_-]", "_", raw)
    if clean != raw or len(clean) > 64:
        return clean[:55] + "_" + hashlib.sha1(raw.encode()).hexdigest()[:8]
    return clean


def test_cline4_plain_name():
    d = decoded([turn(1, None, [tool("github__create_issue")], [call(0, "github__create_issue")])])
    assert d == {"kind": "mcp", "server": "github", "tool": "create_issue", "convention": "cline4"}


def test_cline4_hashed_long_name():
    name = _sdk_name("my-company-internal-knowledge-base", "search_documents_by_semantic_similarity")
    assert len(name) == 64
    d = decoded([turn(1, None, [tool(name)], [call(0, name)])])
    assert d["kind"] == "mcp" and d["convention"] == "cline4"
    assert d["server"] == "my-company-internal-knowledge-base"
    assert "search_documents_by_semantic_similarity".startswith(d["tool"]) and d["tool"]
    assert d["resolved"] is False
    assert "name_problems" not in d  # the hashed form is a valid provider name


def test_cline4_hashed_short_name_after_sanitizing():
    name = _sdk_name("my.server", "get")
    assert name.startswith("my_server__get_")
    d = decoded([turn(1, None, [tool(name)], [call(0, name)])])
    assert (d["server"], d["tool"], d["resolved"]) == ("my_server", "get", False)


def test_cline4_shape_is_not_mcp_for_a_non_cline_agent():
    d = decoded([turn(1, None, [tool("foo__bar")], [call(0, "foo__bar")], system="You are a helpful assistant.",
                      messages=[{"role": "user", "content": "hi"}])])
    assert d == {"kind": "builtin", "server": None, "tool": "foo__bar", "convention": "builtin"}


def test_claude_code_name():
    t = turn(1, None, [tool("mcp__my_server__do__thing")], [call(0, "mcp__my_server__do__thing")],
             system="You are Claude Code, Anthropic's official CLI for Claude.", messages=[{"role": "user", "content": "hi"}])
    out = decode_session([t])
    assert out.call(1, 0)["decoded"] == {"kind": "mcp", "server": "my_server", "tool": "do__thing",
                                         "convention": "claude_code"}
    assert out.turn(1)["agent"] == "claude_code"


def test_uid_mcp_form_from_seed_000():
    t = turn(1, None, [tool("srv42__mcp__lookup", "Look things up")], [call(0, "srv42__mcp__lookup")],
             system="You are a helpful assistant.", messages=[{"role": "user", "content": "hi"}])
    d = decoded([t])
    assert (d["kind"], d["server"], d["tool"], d["convention"], d["uid"], d["resolved"]) == (
        "mcp", "srv42", "lookup", "uid_mcp", "srv42", False)


def test_builtin_and_name_problems():
    long_name = "c1234a0mcp0" + "x" * 60
    t = turn(1, None, [tool("read_file"), tool(long_name, "srv: y"), tool("bad name.v2")],
             [call(0, "read_file"), call(1, long_name), call(2, "bad name.v2")])
    out = decode_session([t])
    assert out.call(1, 0)["decoded"] == {"kind": "builtin", "server": None, "tool": "read_file", "convention": "builtin"}
    long_d = out.call(1, 1)["decoded"]
    assert long_d["kind"] == "mcp" and long_d["server"] == "srv"
    assert len(long_d["name_problems"]) == 1 and "71 characters" in long_d["name_problems"][0]
    bad = out.call(1, 2)["decoded"]["name_problems"]
    assert len(bad) == 1 and "' '" in bad[0] and "'.'" in bad[0]
