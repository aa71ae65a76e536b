"""Argument validation against the tool as offered, and task_progress parsing/diffs."""

from __future__ import annotations

import json

from proxy.agents import CallInput, TurnInput, decode_session
from proxy.agents import progress
from proxy.agents.validate import validate_call
from proxy.agents.offered import offered_tools

SCHEMA = {"type": "object", "properties": {
    "path": {"type": "string"}, "mode": {"type": "string", "enum": ["r", "w"]},
    "lines": {"type": "array", "items": {"type": "integer"}}, "task_progress": {"type": "string"}},
    "required": ["path"], "additionalProperties": False}
OPENAI = {"tools": [{"type": "function", "function": {"name": "open", "parameters": SCHEMA}}]}


def kinds(violations):
    return [(v["kind"], v["path"]) for v in violations]


def test_valid_call_has_no_violations():
    assert validate_call("open", {"path": "a", "mode": "r", "lines": [1]}, None, offered_tools(OPENAI)) == []


def test_each_violation_kind_with_its_path():
    tools = offered_tools(OPENAI)
    assert kinds(validate_call("open", None, "invalid JSON: Expecting value", tools)) == [("invalid_json", "$")]
    assert kinds(validate_call("close", {}, None, tools)) == [("unknown_tool", "$")]
    assert kinds(validate_call("open", {"mode": "r"}, None, tools)) == [("missing_required", "$.path")]
    assert kinds(validate_call("open", {"path": 3}, None, tools)) == [("wrong_type", "$.path")]
    assert kinds(validate_call("open", {"path": "a", "lines": [1, "two"]}, None, tools)) == [("wrong_type", "$.lines[1]")]
    assert kinds(validate_call("open", {"path": "a", "mode": "x"}, None, tools)) == [("enum", "$.mode")]
    assert kinds(validate_call("open", {"path": "a", "extra": 1}, None, tools)) == [("additional_property", "$.extra")]
    msg = validate_call("open", {"path": 3}, None, tools)[0]["message"]
    assert "string" in msg and "integer" in msg


def test_no_tools_offered_means_unknown_tool():
    assert kinds(validate_call("open", {}, None, offered_tools({"messages": []}))) == [("unknown_tool", "$")]


def test_anthropic_and_gemini_tool_shapes():
    anth = offered_tools({"tools": [{"name": "open", "input_schema": SCHEMA}]})
    assert kinds(validate_call("open", {}, None, anth)) == [("missing_required", "$.path")]
    gem = offered_tools({"tools": [{"functionDeclarations": [{"name": "open", "parameters": {
        "type": "OBJECT", "properties": {"n": {"type": "INTEGER"}, "s": {"type": "STRING", "nullable": True}}, "required": ["n"]}}]}]})
    assert kinds(validate_call("open", {"n": "1", "s": None}, None, gem)) == [("wrong_type", "$.n")]


def test_task_progress_undeclared_without_closed_schema():
    tools = offered_tools({"tools": [{"type": "function", "function": {"name": "mcp_tool", "parameters": {
        "type": "object", "properties": {"q": {"type": "string"}}}}}]})
    v = validate_call("mcp_tool", {"q": "x", "task_progress": "- [ ] a"}, None, tools)
    assert kinds(v) == [("undeclared_parameter", "$.task_progress")]
    # Declared: fine.
    assert validate_call("open", {"path": "a", "task_progress": "- [ ] a"}, None, offered_tools(OPENAI)) == []


def test_progress_parse_and_change():
    a = progress.parse("- [ ] one\n- [x] two\nnot an item\n  - [X] three\n-[ ]four")
    assert [(i["text"], i["done"]) for i in a["items"]] == [("one", False), ("two", True), ("three", True), ("four", False)]
    assert (a["done"], a["total"]) == (2, 4)
    b = progress.parse("- [x] one\n- [ ] two\n- [ ] five")
    assert progress.change(a, b) == {"added": ["five"], "removed": ["three", "four"], "checked": ["one"], "unchecked": ["two"]}
    assert progress.parse(None) is None
    assert progress.parse("no list")["total"] == 0


def _tp_turn(id, parent, checklist):
    args = {"path": "a", "task_progress": checklist}
    return TurnInput(id, parent, "openai.chat", {"messages": [{"role": "user", "content": "x"}], **OPENAI}, None,
                     [CallInput(0, f"c{id}", "open", json.dumps(args), args)])


def test_progress_change_follows_the_branch_not_arrival_order():
    turns = [_tp_turn(1, None, "- [ ] a\n- [ ] b"), _tp_turn(2, 1, "- [x] a\n- [ ] b"),
             _tp_turn(3, 1, "- [ ] a\n- [x] b")]  # a retry of turn 2: compares with turn 1
    out = decode_session(turns)
    assert out.call(2, 0)["task_progress"]["change"]["checked"] == ["a"]
    assert out.call(3, 0)["task_progress"]["change"] == {"added": [], "removed": [], "checked": ["b"], "unchecked": []}
