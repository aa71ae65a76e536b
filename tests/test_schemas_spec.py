"""Normalization and name rules."""

import pytest

from proxy.schemas.names import fix_name, mcp_identity, valid_name
from proxy.schemas.spec import SchemaError, ToolSpec, normalize, normalize_parameters


def test_drops_schema_and_infers_object_type():
    out = normalize_parameters({"$schema": "http://json-schema.org/draft-07/schema#",
                                "properties": {"a": {"properties": {"b": {"type": "string"}}}}})
    assert "$schema" not in out
    assert out["type"] == "object"
    assert out["properties"]["a"]["type"] == "object"  # nested object inferred too


@pytest.mark.parametrize("schema", [{"required": ["x"]}, {"additionalProperties": False}, {}])
def test_object_type_added(schema):
    assert normalize_parameters(schema)["type"] == "object"


def test_missing_parameters_mean_no_arguments():
    assert normalize_parameters(None) == {"type": "object", "properties": {}}


def test_input_is_not_mutated():
    schema = {"$schema": "x", "properties": {}}
    normalize_parameters(schema)
    assert schema == {"$schema": "x", "properties": {}}


def test_top_level_anyof_with_non_object_branch_is_an_error():
    with pytest.raises(SchemaError, match="anyOf must have only object branches"):
        normalize_parameters({"anyOf": [{"type": "object"}, {"type": "string"}]}, "t")


def test_top_level_oneof_of_objects_is_fine():
    out = normalize_parameters({"oneOf": [{"properties": {"a": {}}}, {"type": "object"}]})
    assert out["oneOf"][0]["type"] == "object"
    assert "type" not in out  # a composition root keeps no invented type


def test_top_level_allof_needs_an_object_branch():
    with pytest.raises(SchemaError, match="allOf needs at least one object branch"):
        normalize_parameters({"allOf": [{"type": "string"}, {"minLength": 1}]})
    assert normalize_parameters({"allOf": [{"type": "string"}, {"type": "object"}]})["allOf"]


def test_non_object_root_is_an_error_naming_the_tool():
    with pytest.raises(SchemaError, match="'my_tool'"):
        normalize(ToolSpec("my_tool", None, {"type": "string"}))


@pytest.mark.parametrize("name,provider,expected", [
    ("ok-name_1", "openai", "ok-name_1"),
    ("server.tool", "openai", "server_tool"),
    ("server.tool", "gemini", "server.tool"),
    ("ns:tool", "gemini", "ns:tool"),
    ("9lives", "gemini", "_9lives"),
    ("a b", "anthropic", "a_b"),
])
def test_fix_name(name, provider, expected):
    new, loss = fix_name(name, provider)
    assert new == expected
    assert valid_name(new, provider)
    assert (loss is None) == (name == expected)
    if loss:
        assert loss.kind == "renamed" and expected in loss.reason


def test_long_names_are_shortened_with_a_hash():
    long = "x" * 70
    new, loss = fix_name(long, "openai")
    assert len(new) == 64 and valid_name(new, "openai")
    assert new != fix_name("x" * 71, "openai")[0]  # the hash keeps them apart
    assert "longer than 64" in loss.reason
    assert fix_name("y" * 128, "gemini") == ("y" * 128, None)
    assert len(fix_name("y" * 129, "gemini")[0]) == 128


def test_mcp_identity():
    assert mcp_identity("cIya4J0mcp0get_forecast", "weather: Get forecast") == ("weather", "get_forecast")
    assert mcp_identity("abc__mcp__search", "docs: x") == ("docs", "search")
    assert mcp_identity("read_file", "Read a file") is None
