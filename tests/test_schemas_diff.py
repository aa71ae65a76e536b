"""Semantic diff: verdicts, renames, and the cline-weather tools across providers."""

import copy
import json
from pathlib import Path

import pytest

from proxy.schemas.convert import convert_tools
from proxy.schemas.diff import compare_schemas, diff_toolsets
from proxy.schemas.sources import from_document
from proxy.schemas.spec import ToolSpec

FIXTURE = Path(__file__).parent / "fixtures" / "cline-weather" / "turn1" / "request.json"


def weather() -> list[ToolSpec]:
    return from_document(json.loads(FIXTURE.read_text())).tools


def obj(props, required=()):
    return {"type": "object", "properties": props, "required": list(required)}


def kinds(changes):
    return [(c["kind"], c["breaking"]) for c in changes]


@pytest.mark.parametrize("old,new,expected", [
    (obj({}), obj({"a": {"type": "string"}}, ["a"]), [("param_added", True)]),
    (obj({}), obj({"a": {"type": "string"}}), [("param_added", False)]),
    (obj({"a": {"type": "string"}}), obj({}), [("param_removed", True)]),
    (obj({"a": {"type": "string"}}), obj({"a": {"type": "string"}}, ["a"]), [("required_added", True)]),
    (obj({"a": {"type": "string"}}, ["a"]), obj({"a": {"type": "string"}}), [("required_removed", False)]),
    (obj({"a": {"type": "string", "enum": ["x", "y"]}}), obj({"a": {"type": "string", "enum": ["x"]}}), [("enum_values_removed", True)]),
    (obj({"a": {"type": "string", "enum": ["x"]}}), obj({"a": {"type": "string", "enum": ["x", "y"]}}), [("enum_values_added", False)]),
    (obj({"a": {"type": "string"}}), obj({"a": {"type": "string", "enum": ["x"]}}), [("enum_added", True)]),
    (obj({"a": {"type": "string", "enum": ["x"]}}), obj({"a": {"type": "string"}}), [("enum_removed", False)]),
    (obj({"a": {"type": "string"}}), obj({"a": {"type": "integer"}}), [("type_changed", True)]),
    (obj({"a": {"type": "integer"}}), obj({"a": {"type": "number"}}), [("type_changed", False)]),
    (obj({"a": {"type": "string"}}), obj({"a": {"type": ["string", "null"]}}), [("type_changed", False)]),
    (obj({"a": {"type": "string", "maxLength": 10}}), obj({"a": {"type": "string", "maxLength": 5}}), [("constraint_changed", True)]),
    (obj({"a": {"type": "string", "maxLength": 5}}), obj({"a": {"type": "string", "maxLength": 10}}), [("constraint_changed", False)]),
    (obj({"a": {"type": "number"}}), obj({"a": {"type": "number", "minimum": 0}}), [("constraint_changed", True)]),
    (obj({"a": {"type": "string", "pattern": "^a"}}), obj({"a": {"type": "string"}}), [("constraint_changed", False)]),
    (obj({"a": {"type": "string", "description": "x"}}), obj({"a": {"type": "string", "description": "y"}}), [("description_changed", False)]),
    (obj({}), {**obj({}), "additionalProperties": False}, [("additional_properties_changed", True)]),
    ({**obj({}), "additionalProperties": False}, obj({}), [("additional_properties_changed", False)]),
    (obj({"a": {"type": "array", "items": {"type": "string", "enum": ["x", "y"]}}}),
     obj({"a": {"type": "array", "items": {"type": "string", "enum": ["y"]}}}), [("enum_values_removed", True)]),
    (obj({"a": obj({"b": {"type": "string"}})}), obj({"a": obj({"b": {"type": "string"}}, ["b"])}), [("required_added", True)]),
    (obj({"a": {"anyOf": [{"type": "string"}]}}), obj({"a": {"anyOf": [{"type": "number"}]}}), [("schema_changed", True)]),
    (obj({"a": {"type": "string", "title": "A"}}), obj({"a": {"type": "string", "title": "B"}}), [("annotation_changed", False)]),
])
def test_verdicts(old, new, expected):
    assert kinds(compare_schemas(old, new)) == expected


def test_a_keyword_taken_away_is_said_removed_not_null():
    closed = {**obj({"a": {"type": "string", "maxLength": 5, "pattern": "^a"}}), "additionalProperties": False}
    opened = obj({"a": {"type": "string"}})
    messages = {c["path"]: c["message"] for c in compare_schemas(closed, opened)}
    assert messages == {"$.additionalProperties": "additionalProperties false removed",
                        "$.properties.a.maxLength": "maxLength 5 removed",
                        "$.properties.a.pattern": 'pattern "^a" removed'}
    back = {c["path"]: c["message"] for c in compare_schemas(opened, closed)}
    assert back["$.additionalProperties"] == "additionalProperties false added"
    assert back["$.properties.a.maxLength"] == "maxLength 5 added"
    changed = compare_schemas(obj({"a": {"type": "string", "maxLength": 5}}),
                              obj({"a": {"type": "string", "maxLength": 9}}))
    assert [c["message"] for c in changed] == ["maxLength 5 -> 9"]


def test_change_paths_point_at_the_parameter():
    changes = compare_schemas(obj({"a": obj({"b": {"type": "string"}})}), obj({"a": obj({"b": {"type": "number"}})}))
    assert [c["path"] for c in changes] == ["$.properties.a.properties.b.type"]
    assert changes[0]["before"] == "string" and changes[0]["after"] == "number"


def test_identical_sets_have_no_changes():
    result = diff_toolsets(weather(), weather())
    assert result["breaking"] is False
    assert result["summary"]["unchanged"] == 15 and result["changes"] == []


def test_renamed_mcp_uid_is_a_rename():
    before = weather()
    after = copy.deepcopy(before)
    for spec in after:
        spec.name = spec.name.replace("cIya4J", "cAbCdE")
    result = diff_toolsets(before, after)
    renamed = [t for t in result["tools"] if t["status"] == "renamed"]
    assert {(t["from"], t["name"]) for t in renamed} == {
        ("cIya4J0mcp0get_forecast", "cAbCdE0mcp0get_forecast"),
        ("cIya4J0mcp0get_alerts", "cAbCdE0mcp0get_alerts"),
    }
    assert result["summary"]["added"] == result["summary"]["removed"] == 0
    assert "under a new uid" in renamed[0]["changes"][0]["message"]
    json.dumps(result)  # plain data a page can render


def test_renamed_mcp_uid_with_a_schema_change_keeps_both_facts():
    before = weather()
    after = copy.deepcopy(before)
    forecast = next(s for s in after if s.name.endswith("get_forecast"))
    forecast.name = "cZZZZZ0mcp0get_forecast"
    forecast.parameters["properties"]["days"] = {"type": "integer"}
    result = diff_toolsets(before, after)
    tool = next(t for t in result["tools"] if t["name"] == "cZZZZZ0mcp0get_forecast")
    assert tool["status"] == "renamed"
    assert ("param_added", False) in kinds(tool["changes"])


def test_same_schema_under_a_new_name_is_a_rename():
    a = [ToolSpec("old_name", "d", obj({"x": {"type": "string"}}))]
    b = [ToolSpec("new_name", "d", obj({"x": {"type": "string"}}))]
    result = diff_toolsets(a, b)
    assert result["tools"][0]["status"] == "renamed" and result["breaking"]


def test_added_and_removed_tools():
    a = [ToolSpec("keep", "d"), ToolSpec("gone", "d", obj({"x": {"type": "string"}}))]
    b = [ToolSpec("keep", "d"), ToolSpec("fresh", "d", obj({"y": {"type": "number"}}))]
    result = diff_toolsets(a, b)
    status = {t["name"]: (t["status"], t["breaking"]) for t in result["tools"]}
    assert status == {"keep": ("unchanged", False), "gone": ("removed", True), "fresh": ("added", False)}
    assert result["breaking"] is True


def test_only_compatible_changes_are_not_breaking():
    a = [ToolSpec("t", "d", obj({"a": {"type": "string", "enum": ["x"]}}, ["a"]))]
    b = [ToolSpec("t", "d2", obj({"a": {"type": "string", "enum": ["x", "y"]}, "b": {"type": "string"}}))]
    result = diff_toolsets(a, b)
    assert result["breaking"] is False
    assert sorted(c["kind"] for c in result["changes"]) == ["description_changed", "enum_values_added", "param_added", "required_removed"]


def test_normalization_before_diff():
    a = [ToolSpec("t", None, {"$schema": "x", "properties": {"a": {"type": "string"}}})]
    b = [ToolSpec("t", None, {"type": "object", "properties": {"a": {"type": "string"}}})]
    assert diff_toolsets(a, b)["changes"] == []


# --- what each provider receives, diffed against what Cline sent -------------------

def _back(target, profile="faithful"):
    tools, _ = convert_tools(weather(), target, profile)
    return from_document(tools).tools


@pytest.mark.parametrize("target", ["openai", "openai-responses", "anthropic", "mcp", "gemini-jsonschema"])
def test_lossless_targets_diff_clean(target):
    result = diff_toolsets(weather(), _back(target))
    assert result["changes"] == [], result["changes"][:3]


def test_faithful_gemini_differs_only_by_additional_properties():
    result = diff_toolsets(weather(), _back("gemini"))
    assert {c["kind"] for c in result["changes"]} == {"additional_properties_changed"}
    assert result["breaking"] is False  # the provider got a more permissive schema


def test_cline_gemini_shows_what_cline_really_sends():
    result = diff_toolsets(weather(), _back("gemini", "cline"))
    by_kind = {}
    for c in result["changes"]:
        by_kind.setdefault(c["kind"], []).append(c)
    assert "description_changed" in by_kind  # parameter descriptions are not sent
    assert {c["path"] for c in by_kind["annotation_changed"]} >= {"$.parameters.properties.latitude.title"}
    assert result["summary"]["renamed"] == result["summary"]["added"] == result["summary"]["removed"] == 0


def test_cline_anthropic_vs_cline_openai():
    result = diff_toolsets(_back("openai", "cline"), _back("anthropic", "cline"))
    assert {c["kind"] for c in result["changes"]} == {"additional_properties_changed"}
    assert result["summary"]["changed"] == 15
