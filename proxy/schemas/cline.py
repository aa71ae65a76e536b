"""The `cline` profile: what Cline 3.x's own converters (spec.ts) emit for a tool.

Cline first flattens a tool into a list of top-level parameters
({name, instruction, type, required, items?, properties?, ...other keys}), then:
- OpenAI-compatible: each parameter becomes {type, description, items (arrays),
  properties (objects), other keys except `required`...}; the tool gets `strict: false`
  and `additionalProperties: false`.
- Anthropic: the same parameters, `input_schema: {type: object, properties, required}`.
- Gemini: only a type per parameter, mapped integer -> NUMBER and array -> STRING (unknown
  -> OBJECT); parameter descriptions, enums and array items are not sent; an object's
  sub-properties keep type and enum but get the *parent's* description.
It also leaves out tools whose name is over 64 characters or whose description is empty.
Replicating that lets a user put what their agent really sent next to a faithful conversion.
"""

from __future__ import annotations

import json
from typing import Any

from .losses import Loss, join
from .spec import ToolSpec

GEMINI_TYPE = {"string": "STRING", "number": "NUMBER", "integer": "NUMBER", "boolean": "BOOLEAN",
               "object": "OBJECT", "array": "STRING"}
# keys Cline's OpenAI/Anthropic converters do not copy from a parameter
RESERVED = {"name", "required", "instruction", "usage", "dependencies", "description",
            "contextRequirements", "type", "items", "properties"}
TOP_KEYS = {"type", "properties", "required"}


def _params(spec: ToolSpec) -> list[dict]:
    """Cline's mcpToolToClineToolSpec: the schema's top-level properties as parameters."""
    schema = spec.parameters or {}
    if "properties" not in schema:
        return []
    required = set(schema.get("required") or [])
    params = []
    for name, prop in (schema["properties"] or {}).items():
        prop = prop if isinstance(prop, dict) else {}
        param: dict[str, Any] = {"name": name, "instruction": prop.get("description") or "",
                                 "type": prop.get("type") or "string", "required": name in required}
        if prop.get("items"):
            param["items"] = prop["items"]
        if prop.get("properties"):
            param["properties"] = prop["properties"]
        for key, value in prop.items():
            # Cline copies every other key over the parameter, so a nested object's
            # own `required` list overwrites the boolean (and, being truthy, marks it required).
            if key not in ("type", "description", "items", "properties"):
                param[key] = value
        params.append(param)
    return params


def _top_level_losses(spec: ToolSpec, base: str) -> list[Loss]:
    schema = spec.parameters or {}
    return [Loss(join(base, key), f"Cline rebuilds the schema from its top-level properties; `{key}` is not sent")
            for key in schema if key not in TOP_KEYS and key != "additionalProperties"]


def skipped(spec: ToolSpec) -> Loss | None:
    if len(spec.name) > 64:
        return Loss("$", f"Cline leaves out tools whose name is over 64 characters ({len(spec.name)})", "omitted")
    if not (spec.description or "").strip():
        return Loss("$", "Cline leaves out tools with an empty description", "omitted")
    return None


def _openai_param(param: dict, path: str, losses: list[Loss], prop: dict) -> dict:
    ptype = param["type"]
    out: dict = {"type": ptype, "description": param["instruction"]}
    if "type" not in prop:
        losses.append(Loss(join(path, "type"), "no type: Cline sends type \"string\"", "changed"))
    if ptype == "array" and param.get("items"):
        out["items"] = param["items"]
    elif "items" in prop:
        losses.append(Loss(join(path, "items"), "items kept only for type \"array\""))
    if ptype == "object" and param.get("properties"):
        out["properties"] = param["properties"]
    elif "properties" in prop:
        losses.append(Loss(join(path, "properties"), "properties kept only for type \"object\""))
    for key, value in param.items():
        if key not in RESERVED:  # JSON has no `undefined`: Cline copies nulls too
            out[key] = value
    if isinstance(prop.get("required"), list):
        losses.append(Loss(join(path, "required"), "a nested object's required list is not sent (and marks the parameter itself required)"))
    return out


def _shared(spec: ToolSpec, base: str) -> tuple[dict, list[str], list[Loss]]:
    losses = _top_level_losses(spec, base)
    properties: dict = {}
    required: list[str] = []
    props = (spec.parameters or {}).get("properties") or {}
    for param in _params(spec):
        if param["required"]:
            required.append(param["name"])
        path = join(base, "properties", param["name"])
        prop = props.get(param["name"]) if isinstance(props.get(param["name"]), dict) else {}
        properties[param["name"]] = _openai_param(param, path, losses, prop)
    return properties, required, losses


def cline_openai(spec: ToolSpec) -> tuple[dict | None, list[Loss]]:
    if (omit := skipped(spec)) is not None:
        return None, [omit]
    properties, required, losses = _shared(spec, "$.function.parameters")
    if spec.parameters.get("additionalProperties") is not False:
        losses.append(Loss("$.function.parameters.additionalProperties", "Cline always sends additionalProperties: false", "changed"))
    if spec.meta.get("strict") is True:
        losses.append(Loss("$.function.strict", "Cline always sends strict: false", "changed"))
    fn = {"name": spec.name, "description": spec.description or "", "strict": False,
          "parameters": {"type": "object", "properties": properties, "required": required, "additionalProperties": False}}
    return {"type": "function", "function": fn}, losses


def cline_anthropic(spec: ToolSpec) -> tuple[dict | None, list[Loss]]:
    if (omit := skipped(spec)) is not None:
        return None, [omit]
    properties, required, losses = _shared(spec, "$.input_schema")
    if "additionalProperties" in spec.parameters:
        losses.append(Loss("$.input_schema.additionalProperties", "Cline's Anthropic converter does not send additionalProperties"))
    tool = {"name": spec.name, "description": spec.description or "",
            "input_schema": {"type": "object", "properties": properties, "required": required}}
    return tool, losses


def _gemini_type(t: Any, path: str, losses: list[Loss]) -> str:
    gt = GEMINI_TYPE.get(t) if isinstance(t, str) else None
    if gt is None:
        losses.append(Loss(path, f"type {json.dumps(t)} is not in Cline's map: sent as OBJECT", "changed"))
        return "OBJECT"
    if t in ("integer", "array"):
        losses.append(Loss(path, f"Cline maps {t} to {gt}", "changed"))
    return gt


def cline_gemini(spec: ToolSpec) -> tuple[dict | None, list[Loss]]:
    if (omit := skipped(spec)) is not None:
        return None, [omit]
    base = "$.parameters"
    losses = _top_level_losses(spec, base)
    if "additionalProperties" in spec.parameters:
        losses.append(Loss(join(base, "additionalProperties"), "not sent to Gemini"))
    properties: dict = {}
    required: list[str] = []
    for param in _params(spec):
        if param["required"]:
            required.append(param["name"])
        path = join(base, "properties", param["name"])
        out = {"type": _gemini_type(param["type"], join(path, "type"), losses)}
        for key in param:
            if key not in ("name", "type", "required", "properties", "instruction"):
                losses.append(Loss(join(path, key), f"Cline's Gemini converter does not send a parameter's `{key}`"))
        if param["instruction"]:
            losses.append(Loss(join(path, "description"), "Cline's Gemini converter does not send parameter descriptions"))
        if param.get("properties"):
            out["properties"] = {}
            for key, sub in param["properties"].items():
                if key == "$schema":
                    continue
                sub = sub if isinstance(sub, dict) else {}
                sub_path = join(path, "properties", key)
                out["properties"][key] = {"type": _gemini_type(sub.get("type") or "string", join(sub_path, "type"), losses),
                                          "description": param["instruction"]}
                losses.append(Loss(join(sub_path, "description"), "Cline sends the parent parameter's description here", "changed"))
                if sub.get("enum"):
                    out["properties"][key]["enum"] = sub["enum"]
                for k in sub:
                    if k not in ("type", "description", "enum"):
                        losses.append(Loss(join(sub_path, k), f"Cline's Gemini converter does not send `{k}` below a parameter"))
        properties[param["name"]] = out
    tool = {"name": spec.name, "description": spec.description or "",
            "parameters": {"type": "OBJECT", "properties": properties, "required": required}}
    return tool, losses
