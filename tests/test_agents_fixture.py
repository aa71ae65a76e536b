"""The done-criterion of issue 3: the cline-weather fixture decodes as its README says."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from proxy.agents import CallInput, TurnInput, decode_session
from proxy.apis.base import ToolCall

FIXTURE = Path(__file__).parent / "fixtures" / "cline-weather"


def _turns() -> list[TurnInput]:
    turns = []
    for n in range(1, 5):
        request = json.loads((FIXTURE / f"turn{n}" / "request.json").read_text())
        path = FIXTURE / f"turn{n}" / "expected_completion.json"
        response = json.loads(path.read_text()) if path.exists() else None
        calls = []
        for i, tc in enumerate(((response or {}).get("choices") or [{}])[0].get("message", {}).get("tool_calls") or []):
            c = ToolCall.from_raw(i, tc["id"], tc["function"]["name"], tc["function"]["arguments"])
            calls.append(CallInput(c.index, c.id, c.name, c.arguments_raw, c.arguments, c.arguments_error))
        turns.append(TurnInput(n, n - 1 if n > 1 else None, "openai.chat", request, response, calls))
    return turns


@pytest.fixture(scope="module")
def decoding():
    return decode_session(_turns())


def test_turn4_has_no_calls_and_three_calls_decode(decoding):
    assert sorted(decoding.calls) == [(1, 0), (2, 0), (3, 0)]
    assert [decoding.call(t, 0)["decoded"]["tool"] for t in (1, 2, 3)] == ["list_files", "read_file", "get_forecast"]


def test_mcp_call_is_weather_get_forecast(decoding):
    d = decoding.call(3, 0)["decoded"]
    assert d == {"kind": "mcp", "server": "weather", "tool": "get_forecast", "convention": "cline3",
                 "uid": "cIya4J", "resolved": True}
    assert decoding.uids == {"cIya4J": "weather"}
    assert decoding.call(1, 0)["decoded"]["kind"] == "builtin"


def test_task_progress_goes_0_1_2_of_4(decoding):
    tps = [decoding.call(t, 0)["task_progress"] for t in (1, 2, 3)]
    assert [(tp["done"], tp["total"]) for tp in tps] == [(0, 4), (1, 4), (2, 4)]
    assert "change" not in tps[0]
    assert tps[1]["change"] == {"added": [], "removed": [], "checked": ["分析项目结构和可用工具"], "unchecked": []}
    assert tps[2]["change"]["checked"] == ["确定华盛顿的地理位置坐标"]


def test_each_placeholder_pairs_with_the_next_requests_text(decoding):
    r1, r2, r3 = (decoding.call(t, 0)["result"] for t in (1, 2, 3))
    for r in (r1, r2, r3):
        assert r["placeholder"] == "result missing"
        assert r["source"] == "user_text_block"
        assert r["status"] == "ok"
    assert r1["text"].startswith(".python-version\nllm_logger.py") and r1["text"].endswith(".venv/")
    assert r2["text"].startswith("from typing import Any") and 'mcp.run(transport="stdio")' in r2["text"]
    assert "Temperature: 68°F" in r3["text"] and "Monday:" in r3["text"]
    assert "environment_details" not in r3["text"]


def test_leaked_task_progress_is_flagged_only_on_the_mcp_call(decoding):
    violations = decoding.call(3, 0)["violations"]
    assert [(v["kind"], v["path"]) for v in violations] == [("undeclared_parameter", "$.task_progress")]
    assert "get_forecast" in violations[0]["message"]
    assert decoding.call(1, 0)["violations"] == []
    assert decoding.call(2, 0)["violations"] == []


def test_turn_structure(decoding):
    t1, t2, t4 = decoding.turn(1), decoding.turn(2), decoding.turn(4)
    assert t1["agent"] == "cline"
    assert t1["task"] == "华盛顿明天天气如何？"
    assert [r["kind"] for r in t1["reminders"]] == ["task_progress_recommended"]
    assert t1["environment"]["mode"] == "ACT"
    assert t2["environment"]["context_usage"] == {"used": 13905, "limit": 128000, "percent": 11.0,
                                                  "raw": "13,905 / 128K tokens used (11%)"}
    assert t2["environment"]["time"].startswith("2026/3/7")
    assert [(b["tool"], b["arg"]) for b in t4["tool_result_blocks"]] == [("use_mcp_tool", "weather")]
    assert all(decoding.turn(t)["errors"] == [] for t in (1, 2, 3, 4))
    assert not any(decoding.turn(t)["no_tool_error"] for t in (1, 2, 3, 4))


def test_decoding_is_deterministic_and_json_able():
    a, b = decode_session(_turns()), decode_session(_turns())
    assert json.dumps(a.to_json(), sort_keys=True) == json.dumps(b.to_json(), sort_keys=True)
