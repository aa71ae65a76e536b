"""Cline's message structure and text-path (XML) tool calls, and decoder robustness."""

from __future__ import annotations

import json

from proxy.agents import CallInput, TurnInput, decode_session
from proxy.agents import cline_messages, session

SYSTEM = {"role": "system", "content": "You are Cline, a highly skilled software engineer."}
ENV_PLAN = ("<environment_details>\n# Current Time\n1/2/2026, 9:00:00 AM (UTC)\n\n# Context Window Usage\n"
            "1,234 / 200K tokens used (1%)\n\n# Current Mode\nPLAN MODE\n</environment_details>")
TODO = "\n# TODO LIST UPDATE REQUIRED - You MUST include the task_progress parameter in your NEXT tool call.\n\n- [ ] a"


def test_environment_details_plan_mode():
    env = cline_messages.environment(["hello", ENV_PLAN])
    assert env["mode"] == "PLAN"
    assert env["time"] == "1/2/2026, 9:00:00 AM (UTC)"
    assert env["context_usage"] == {"used": 1234, "limit": 200000, "percent": 1.0, "raw": "1,234 / 200K tokens used (1%)"}
    assert cline_messages.environment(["no env here"]) is None


def test_reminders_and_no_tool_error_on_the_turn():
    msgs = [SYSTEM, {"role": "user", "content": "<task>\nfix the bug\n</task>"},
            {"role": "assistant", "content": "I think it is fine."},
            {"role": "user", "content": [
                {"type": "text", "text": "[ERROR] You did not use a tool in your previous response! Please retry with a tool use."},
                {"type": "text", "text": TODO}, {"type": "text", "text": ENV_PLAN}]}]
    t1 = TurnInput(1, None, "openai.chat", {"messages": msgs[:2]}, {"choices": [{"message": {"content": "I think it is fine."}}]}, [])
    t2 = TurnInput(2, 1, "openai.chat", {"messages": msgs}, None, [])
    out = decode_session([t1, t2])
    t = out.turn(2)
    assert t["agent"] == "cline" and t["task"] == "fix the bug"
    assert t["no_tool_error"] is True and out.turn(1)["no_tool_error"] is False
    assert out.turn(1)["answered_without_tool"] is True
    assert [r["kind"] for r in t["reminders"]] == ["todo_list_update_required"]
    assert t["environment"]["mode"] == "PLAN"


def test_text_path_calls_are_extracted_and_paired():
    reply = ("Let me look.\n<read_file>\n<path>src/app.py</path>\n<task_progress>\n- [x] look\n- [ ] fix\n</task_progress>\n</read_file>\n"
             "<use_mcp_tool>\n<server_name>weather</server_name>\n<tool_name>get_forecast</tool_name>\n"
             "<arguments>\n{\"latitude\": 1, \"longitude\": 2}\n</arguments>\n</use_mcp_tool>\n<write_to_file><path>b</path><content>half")
    base = [SYSTEM, {"role": "user", "content": "<task>\nx\n</task>"}]
    t1 = TurnInput(1, None, "openai.chat", {"messages": base}, {"choices": [{"message": {"role": "assistant", "content": reply}}]}, [])
    t2 = TurnInput(2, 1, "openai.chat", {"messages": base + [
        {"role": "assistant", "content": reply},
        {"role": "user", "content": [{"type": "text", "text": "[read_file for 'src/app.py'] Result:\nprint(1)"},
                                     {"type": "text", "text": "[use_mcp_tool for 'weather'] Result:\nsunny"}]}]}, None, [])
    calls = decode_session([t1, t2]).turn(1)["text_tool_calls"]
    assert [c["name"] for c in calls] == ["read_file", "use_mcp_tool", "write_to_file"]
    read, mcp, write = calls
    assert read["params"]["path"] == "src/app.py" and read["partial"] is False
    assert (read["task_progress"]["done"], read["task_progress"]["total"]) == (1, 2)
    assert read["result"]["text"] == "print(1)"
    assert mcp["decoded"] == {"kind": "mcp", "server": "weather", "tool": "get_forecast", "convention": "cline_xml"}
    assert mcp["arguments"] == {"latitude": 1, "longitude": 2}
    assert mcp["result"]["text"] == "sunny"
    assert write["partial"] is True and write["params"]["content"] == "half"
    assert write["result"]["status"] == "missing"


def _turns():
    args = {"path": "a"}
    tools = [{"type": "function", "function": {"name": "read_file", "parameters": {"type": "object", "properties": {"path": {"type": "string"}}}}}]
    msgs = [SYSTEM, {"role": "user", "content": ["<task>\nx\n</task>", ENV_PLAN]}]
    return [TurnInput(1, None, "openai.chat", {"messages": msgs, "tools": tools}, None,
                      [CallInput(0, "c", "read_file", json.dumps(args), args)])]


def test_a_raising_decoder_is_recorded_and_the_rest_decodes(monkeypatch):
    def boom(*a, **k):
        raise RuntimeError("decoder bug")
    monkeypatch.setattr(session.validate, "validate_call", boom)
    out = decode_session(_turns())
    t = out.turn(1)
    assert len(t["errors"]) == 1 and t["errors"][0].startswith("validation: RuntimeError: decoder bug")
    call = out.call(1, 0)
    assert call["decoded"]["tool"] == "read_file" and call["violations"] == []
    assert call["result"]["status"] == "missing"
    assert t["environment"]["mode"] == "PLAN"


def test_a_raising_name_decoder_falls_back_to_builtin(monkeypatch):
    monkeypatch.setattr(session.registry, "decode_name", lambda *a: 1 / 0)
    out = decode_session(_turns())
    assert out.call(1, 0)["decoded"] == {"kind": "builtin", "server": None, "tool": "read_file", "convention": "builtin"}
    assert out.turn(1)["errors"][0].startswith("names: ZeroDivisionError")


def test_garbage_never_raises():
    weird = [
        TurnInput(1, None, "openai.chat", None, None, [CallInput(0, None, "", "{", None, "invalid JSON")]),
        TurnInput(2, 1, "anthropic.messages", {"messages": "nope", "tools": "nope"}, {"content": 5}, []),
        TurnInput(3, 2, "gemini", {"contents": [None, {"parts": [None, {"functionCall": 3}]}]}, None, []),
        TurnInput(4, 99, "other", {"weird": True}, None, [CallInput(0, "x", "t", "[]", [], None)]),
    ]
    out = decode_session(weird)
    assert set(out.turns) == {1, 2, 3, 4}
    assert out.call(1, 0)["violations"][0]["kind"] == "invalid_json"
    assert out.call(1, 0)["decoded"]["name_problems"] == ["the name is empty"]
    json.dumps(out.to_json())
