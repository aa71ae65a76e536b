"""Converters per provider, their loss reports, and the cline profile."""

import copy
import json
from pathlib import Path

import pytest

from proxy.schemas.anthropic_tools import from_anthropic, to_anthropic
from proxy.schemas.convert import UnsupportedTarget, convert_tool, convert_tools
from proxy.schemas.gemini_tools import from_gemini, schema_to_gemini, to_gemini
from proxy.schemas.mcp_tools import from_mcp, to_mcp
from proxy.schemas.openai_tools import from_openai, to_openai_chat, to_openai_responses
from proxy.schemas.spec import ToolSpec

FIXTURE = Path(__file__).parent / "fixtures" / "cline-weather" / "turn1" / "request.json"


def weather_tools() -> list[dict]:
    return json.loads(FIXTURE.read_text())["tools"]


def weather_specs() -> list[ToolSpec]:
    return [from_openai(t)[0] for t in weather_tools()]


def by_path(losses):
    return {l.path: l for l in losses}


FORECAST = {"type": "object", "properties": {"latitude": {"type": "number"}}, "required": ["latitude"]}


def test_openai_chat_and_responses_shapes():
    spec = ToolSpec("f", "d", FORECAST, {"strict": False})
    chat, _ = to_openai_chat(spec)
    resp, _ = to_openai_responses(spec)
    assert chat == {"type": "function", "function": {"name": "f", "description": "d", "parameters": FORECAST, "strict": False}}
    assert resp == {"type": "function", "name": "f", "description": "d", "parameters": FORECAST, "strict": False}
    assert from_openai(chat)[0] == from_openai(resp)[0] == spec


def test_openai_strict_reports_what_strict_mode_refuses():
    spec = ToolSpec("f", None, {"type": "object", "properties": {"a": {"type": "string"}, "b": {"type": "string"}},
                                "required": ["a"]}, {"strict": True})
    _, losses = to_openai_chat(spec)
    paths = by_path(losses)
    assert paths["$.function.parameters.additionalProperties"].kind == "rejected"
    assert "b" in paths["$.function.parameters.required"].reason


def test_anthropic_round_trip_and_rejected_top_level_anyof():
    spec = ToolSpec("t", "d", {"anyOf": [{"type": "object"}, {"type": "object", "properties": {}}]})
    tool, losses = to_anthropic(spec)
    assert tool["input_schema"] is spec.parameters and "description" in tool
    assert [(l.path, l.kind) for l in losses] == [("$.input_schema.anyOf", "rejected")]
    assert from_anthropic(tool)[0] == spec


def test_mcp_keeps_its_own_fields_and_others_report_them():
    tool = {"name": "search", "title": "Search", "description": "d", "inputSchema": FORECAST,
            "annotations": {"readOnlyHint": True}}
    spec, _ = from_mcp(tool)
    assert to_mcp(spec) == (tool, [])
    _, losses = to_openai_chat(spec)
    assert {l.path for l in losses} == {"$.title", "$.annotations"}


def test_renamed_for_provider_with_loss():
    spec = ToolSpec("weather.get forecast", "d", FORECAST)
    tool, losses = to_openai_chat(spec)
    assert tool["function"]["name"] == "weather_get_forecast"
    assert losses[0].path == "$.function.name" and losses[0].kind == "renamed"
    tool, losses = to_gemini(spec)
    assert tool["name"] == "weather.get_forecast"
    assert "weather.get_forecast" in losses[0].reason


def test_gemini_types_and_reported_losses():
    schema = {
        "type": "object",
        "additionalProperties": False,
        "properties": {
            "mode": {"const": "fast"},
            "count": {"type": ["integer", "null"], "format": "int32", "exclusiveMinimum": 0},
            "when": {"type": "string", "format": "date-time"},
            "mail": {"type": "string", "format": "email"},
            "level": {"type": "integer", "enum": [1, 2]},
            "pick": {"oneOf": [{"type": "string"}, {"type": "number"}]},
            "tags": {"type": "array", "items": {"type": "string"}, "uniqueItems": True},
        },
        "required": ["mode"],
    }
    out, losses = schema_to_gemini(schema)
    props = out["properties"]
    assert out["type"] == "OBJECT" and "additionalProperties" not in out
    assert props["mode"] == {"enum": ["fast"], "type": "STRING"}
    assert props["count"] == {"type": "INTEGER", "nullable": True, "format": "int32", "minimum": 0}
    assert props["when"]["format"] == "date-time" and "format" not in props["mail"]
    assert props["level"]["enum"] == ["1", "2"]
    assert props["pick"] == {"anyOf": [{"type": "STRING"}, {"type": "NUMBER"}]}
    assert props["tags"] == {"type": "ARRAY", "items": {"type": "STRING"}}
    got = {(l.path, l.kind) for l in losses}
    assert got == {
        ("$.parameters.additionalProperties", "dropped"),
        ("$.parameters.properties.mode.const", "changed"),
        ("$.parameters.properties.count.type", "changed"),
        ("$.parameters.properties.count.exclusiveMinimum", "changed"),
        ("$.parameters.properties.mail.format", "dropped"),
        ("$.parameters.properties.level.enum", "changed"),
        ("$.parameters.properties.pick.oneOf", "changed"),
        ("$.parameters.properties.tags.uniqueItems", "dropped"),
    }


def test_gemini_inlines_refs_and_reports_cycles():
    schema = {
        "type": "object",
        "$defs": {
            "Point": {"type": "object", "properties": {"x": {"type": "number"}}},
            "Node": {"type": "object", "properties": {"child": {"$ref": "#/$defs/Node"}}},
        },
        "properties": {"at": {"$ref": "#/$defs/Point"}, "tree": {"$ref": "#/$defs/Node"}},
    }
    out, losses = schema_to_gemini(schema)
    assert out["properties"]["at"] == {"type": "OBJECT", "properties": {"x": {"type": "NUMBER"}}}
    assert out["properties"]["tree"]["properties"]["child"] == {"type": "OBJECT"}
    reasons = {l.path: l.reason for l in losses}
    assert "inlined #/$defs/Point" in reasons["$.parameters.properties.at.$ref"]
    assert "recursive" in reasons["$.parameters.properties.tree.properties.child.$ref"]
    assert "$.parameters.$defs" in reasons
    assert "$defs" not in json.dumps(out)


def test_gemini_no_argument_tool_has_no_parameters():
    tool, losses = to_gemini(ToolSpec("ping", "p", {"type": "object", "properties": {}}))
    assert tool == {"name": "ping", "description": "p"}
    assert losses == []


def test_gemini_json_schema_field_and_back():
    spec = ToolSpec("t", "d", {"type": "object", "properties": {"a": {"const": 1}}})
    tool, losses = convert_tool(spec, "gemini-jsonschema")
    assert tool["parametersJsonSchema"] == spec.parameters and losses == []
    assert from_gemini(tool)[0] == spec


def test_from_gemini_reads_the_openapi_subset():
    decl = {"name": "t", "parameters": {"type": "OBJECT", "properties": {
        "a": {"type": "STRING", "nullable": True, "format": "enum", "enum": ["x"]}}, "propertyOrdering": ["a"]}}
    spec, _ = from_gemini(decl)
    assert spec.parameters == {"type": "object", "properties": {"a": {"type": ["string", "null"], "enum": ["x"]}}}


def test_weather_tools_to_every_provider():
    specs = weather_specs()
    for target in ("openai", "openai-responses", "anthropic", "gemini", "mcp"):
        tools, losses = convert_tools(specs, target)
        assert len(tools) == 15
        # strict:false is the default everywhere, so only Gemini loses anything here
        assert bool(losses) == (target == "gemini")
    tools, losses = convert_tools(specs, "gemini")
    forecast = next(t for t in tools if t["name"] == "cIya4J0mcp0get_forecast")
    assert forecast["parameters"]["properties"]["latitude"] == {"type": "NUMBER", "title": "Latitude", "description": ""}
    assert {l.tool for l in losses} == {t["function"]["name"] for t in weather_tools()}
    assert all(l.path == "$.parameters.additionalProperties" for l in losses)


# --- the cline profile -------------------------------------------------------------

def test_cline_profile_reproduces_what_cline_sent_to_deepseek():
    tools, losses = convert_tools(weather_specs(), "openai", "cline")
    assert tools == weather_tools()
    assert losses == []


def test_cline_openai_from_an_mcp_schema():
    spec = ToolSpec("cX0mcp0t", "srv: t", {"type": "object", "properties": {
        "n": {"type": "integer", "minimum": 1, "description": "count"},
        "o": {"type": "object", "properties": {"k": {"type": "string"}}, "required": ["k"]},
        "s": {}}, "required": ["n"]})
    tool, losses = convert_tool(spec, "openai", "cline")
    params = tool["function"]["parameters"]
    assert tool["function"]["strict"] is False and params["additionalProperties"] is False
    assert params["properties"]["n"] == {"type": "integer", "description": "count", "minimum": 1}
    assert params["properties"]["o"] == {"type": "object", "description": "", "properties": {"k": {"type": "string"}}}
    assert params["properties"]["s"] == {"type": "string", "description": ""}
    # Cline copies a nested object's `required` list over the parameter's flag: truthy
    assert params["required"] == ["n", "o"]
    paths = by_path(losses)
    assert "$.function.parameters.properties.o.required" in paths
    assert paths["$.function.parameters.properties.s.type"].kind == "changed"


def test_cline_gemini_mapping():
    spec = ToolSpec("t", "d", {"type": "object", "properties": {
        "n": {"type": "integer", "description": "count"},
        "tags": {"type": "array", "items": {"type": "string"}},
        "mode": {"type": "string", "enum": ["a", "b"]},
        "opts": {"type": "object", "description": "options",
                 "properties": {"level": {"type": "string", "enum": ["lo", "hi"]}, "deep": {"type": "integer"}}},
    }, "required": ["n"]})
    tool, losses = convert_tool(spec, "gemini", "cline")
    props = tool["parameters"]["properties"]
    assert tool["parameters"]["type"] == "OBJECT" and tool["parameters"]["required"] == ["n"]
    assert props["n"] == {"type": "NUMBER"}
    assert props["tags"] == {"type": "STRING"}  # array sent as STRING, items dropped
    assert props["mode"] == {"type": "STRING"}  # top-level enum dropped
    assert props["opts"]["properties"] == {
        "level": {"type": "STRING", "description": "options", "enum": ["lo", "hi"]},
        "deep": {"type": "NUMBER", "description": "options"},
    }
    paths = by_path(losses)
    assert "integer to NUMBER" in paths["$.parameters.properties.n.type"].reason
    assert "$.parameters.properties.tags.items" in paths
    assert "$.parameters.properties.mode.enum" in paths
    assert "$.parameters.properties.n.description" in paths


def test_cline_leaves_out_long_names_and_empty_descriptions():
    long = ToolSpec("u" * 30 + "0mcp0" + "t" * 30, "s: d", FORECAST)
    empty = ToolSpec("t", "", FORECAST)
    tools, losses = convert_tools([long, empty, ToolSpec("ok", "d", FORECAST)], "anthropic", "cline")
    assert [t["name"] for t in tools] == ["ok"]
    assert [(l.tool, l.kind) for l in losses if l.kind == "omitted"] == [(long.name, "omitted"), ("t", "omitted")]


def test_cline_has_no_mcp_converter():
    with pytest.raises(UnsupportedTarget):
        convert_tool(ToolSpec("t", "d"), "mcp", "cline")


def test_conversion_does_not_mutate_the_source():
    specs = weather_specs()
    before = copy.deepcopy([s.to_dict() for s in specs])
    for target in ("openai", "anthropic", "gemini", "mcp"):
        convert_tools(specs, target)
    convert_tools(specs, "gemini", "cline")
    assert [s.to_dict() for s in specs] == before
