"""The neutral tool spec every converter goes through, and input normalization.

Normalization follows what the Cline SDK does to tool schemas before sending them:
drop `$schema`, add `type: object` where object keywords imply it, and refuse a
top-level composition a provider cannot take as an object.
"""

from __future__ import annotations

import copy
import json
from dataclasses import dataclass, field
from typing import Any


class SchemaError(ValueError):
    """A tool definition that cannot be normalized (message says which tool and why)."""


@dataclass
class ToolSpec:
    name: str
    description: str | None = None
    parameters: dict = field(default_factory=lambda: {"type": "object", "properties": {}})
    # Format-specific fields with no neutral meaning (OpenAI `strict`, MCP `title`,
    # `annotations`, `outputSchema`, Anthropic `cache_control`...): kept so a
    # same-format round trip is exact and a cross-format one can report them as lost.
    meta: dict = field(default_factory=dict)

    def to_dict(self) -> dict:
        out: dict[str, Any] = {"name": self.name}
        if self.description is not None:
            out["description"] = self.description
        out["parameters"] = self.parameters
        if self.meta:
            out["meta"] = self.meta
        return out


OBJECT_HINTS = ("properties", "required", "additionalProperties")
# keywords whose value is one sub-schema / a map of them / a list of them
SUB_SCHEMA = ("items", "additionalProperties", "not", "contains", "propertyNames", "if", "then", "else")
SUB_SCHEMA_MAPS = ("properties", "patternProperties", "$defs", "definitions")
SUB_SCHEMA_LISTS = ("anyOf", "oneOf", "allOf", "prefixItems")


def walk_children(schema: dict):
    """Yield (key path tuple, sub-schema) for every direct sub-schema of `schema`."""
    for key in SUB_SCHEMA:
        sub = schema.get(key)
        if isinstance(sub, dict):
            yield (key,), sub
        elif key == "items" and isinstance(sub, list):  # draft-4 tuple form
            for i, s in enumerate(sub):
                if isinstance(s, dict):
                    yield (key, i), s
    for key in SUB_SCHEMA_MAPS:
        subs = schema.get(key)
        if isinstance(subs, dict):
            for name, s in subs.items():
                if isinstance(s, dict):
                    yield (key, name), s
    for key in SUB_SCHEMA_LISTS:
        subs = schema.get(key)
        if isinstance(subs, list):
            for i, s in enumerate(subs):
                if isinstance(s, dict):
                    yield (key, i), s


def _infer_object_types(schema: dict) -> None:
    if "type" not in schema and any(k in schema for k in OBJECT_HINTS):
        schema["type"] = "object"
    for _, sub in walk_children(schema):
        _infer_object_types(sub)


def _is_object_branch(branch: Any) -> bool:
    if not isinstance(branch, dict):
        return False
    t = branch.get("type")
    if t is None:
        return any(k in branch for k in OBJECT_HINTS) or "$ref" in branch
    return t == "object" or (isinstance(t, list) and "object" in t)


def normalize_parameters(schema: Any, tool: str = "?") -> dict:
    """Return a normalized copy of a tool's parameters schema, or raise SchemaError."""
    if schema is None:
        return {"type": "object", "properties": {}}
    if not isinstance(schema, dict):
        raise SchemaError(f"tool {tool!r}: parameters must be a JSON object, got {type(schema).__name__}")
    out = copy.deepcopy(schema)
    out.pop("$schema", None)
    _infer_object_types(out)
    for key in ("anyOf", "oneOf"):
        if key in out:
            bad = [i for i, b in enumerate(out[key] or []) if not _is_object_branch(b)]
            if bad or not out[key]:
                raise SchemaError(
                    f"tool {tool!r}: top-level {key} must have only object branches "
                    f"(non-object branch at index {bad[0] if bad else 'none: empty list'})"
                )
    if "allOf" in out and not any(_is_object_branch(b) for b in out["allOf"] or []):
        raise SchemaError(f"tool {tool!r}: top-level allOf needs at least one object branch")
    t = out.get("type")
    if t is not None and t != "object" and not (isinstance(t, list) and "object" in t):
        raise SchemaError(f"tool {tool!r}: parameters must describe an object, got type {t!r}")
    if not any(k in out for k in ("type", "anyOf", "oneOf", "allOf", "$ref")):
        out["type"] = "object"  # `{}` or description-only: an object taking anything
    return out


def normalize(spec: ToolSpec) -> ToolSpec:
    return ToolSpec(spec.name, spec.description, normalize_parameters(spec.parameters, spec.name), dict(spec.meta))


def canonical(value: Any) -> str:
    """A stable text form for comparing schemas (key order does not matter)."""
    return json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
