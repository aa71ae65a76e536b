"""The tools a request offered, by name, whatever the wire API's tool shape.

Each entry: {"name", "description", "schema"}: `schema` is a JSON Schema for the
arguments (Gemini's OpenAPI-subset schemas are mapped to it), or None when the tool
carries none (a provider's server-side tool, say).
"""

from __future__ import annotations

from typing import Any

_GEMINI_TYPES = {"STRING": "string", "NUMBER": "number", "INTEGER": "integer",
                 "BOOLEAN": "boolean", "ARRAY": "array", "OBJECT": "object", "NULL": "null"}


def gemini_to_json_schema(schema: Any) -> Any:
    """Gemini's schema dialect to JSON Schema: upper-case types, `nullable`."""
    if isinstance(schema, list):
        return [gemini_to_json_schema(s) for s in schema]
    if not isinstance(schema, dict):
        return schema
    out = {}
    for key, value in schema.items():
        if key == "type" and isinstance(value, str):
            out["type"] = _GEMINI_TYPES.get(value.upper(), value.lower())
        elif key in ("properties",) and isinstance(value, dict):
            out[key] = {k: gemini_to_json_schema(v) for k, v in value.items()}
        elif key in ("items", "anyOf", "oneOf", "allOf"):
            out[key] = gemini_to_json_schema(value)
        elif key == "nullable":
            continue
        else:
            out[key] = value
    if schema.get("nullable") and isinstance(out.get("type"), str):
        out["type"] = [out["type"], "null"]
    return out


def _entry(name: Any, description: Any, schema: Any) -> tuple[str, dict[str, Any]] | None:
    if not isinstance(name, str):
        return None
    return name, {"name": name, "description": description if isinstance(description, str) else "",
                  "schema": schema if isinstance(schema, dict) else None}


def _one(tool: Any) -> list[tuple[str, dict[str, Any]] | None]:
    if not isinstance(tool, dict):
        return []
    if isinstance(tool.get("function"), dict):  # OpenAI chat
        fn = tool["function"]
        return [_entry(fn.get("name"), fn.get("description"), fn.get("parameters", {"type": "object"}))]
    if "input_schema" in tool:  # Anthropic
        return [_entry(tool.get("name"), tool.get("description"), tool.get("input_schema"))]
    decls = tool.get("functionDeclarations") or tool.get("function_declarations")
    if isinstance(decls, list):  # Gemini
        out = []
        for d in decls:
            if not isinstance(d, dict):
                continue
            if "parametersJsonSchema" in d:
                schema = d["parametersJsonSchema"]
            elif "parameters" in d:
                schema = gemini_to_json_schema(d["parameters"])
            else:
                schema = {"type": "object", "properties": {}}
            out.append(_entry(d.get("name"), d.get("description"), schema))
        return out
    if tool.get("type") == "function" and "name" in tool:  # Responses
        return [_entry(tool.get("name"), tool.get("description"), tool.get("parameters", {"type": "object"}))]
    if "name" in tool and "parameters" in tool:  # legacy OpenAI `functions`
        return [_entry(tool.get("name"), tool.get("description"), tool.get("parameters"))]
    if "name" in tool:  # a server tool (web_search_..., computer_...): no schema to check
        return [_entry(tool.get("name"), tool.get("description"), None)]
    return []


def offered_tools(request: dict | None) -> dict[str, dict[str, Any]] | None:
    """Name -> tool, or None when the request offered no tool list at all."""
    if not isinstance(request, dict):
        return None
    tools = request.get("tools")
    functions = request.get("functions")
    if tools is None and functions is None:
        return None
    out: dict[str, dict[str, Any]] = {}
    for tool in list(tools or []) + list(functions or []):
        for entry in _one(tool):
            if entry and entry[0] not in out:
                out[entry[0]] = entry[1]
    return out
