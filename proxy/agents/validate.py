"""Argument validation: a tool call's arguments against the schema of the tool as
offered in the same request. Each problem is a violation {kind, path, message}: `path` is
a JSON path into the arguments ("$", "$.task_progress", "$.items[2].name")."""

from __future__ import annotations

import json
import re
from typing import Any

import jsonschema
from jsonschema import validators

TASK_PROGRESS = "task_progress"


def violation(kind: str, path: str, message: str) -> dict[str, str]:
    return {"kind": kind, "path": path, "message": message}


def json_path(parts: Any) -> str:
    out = "$"
    for p in parts:
        out += f"[{p}]" if isinstance(p, int) else (f".{p}" if str(p).isidentifier() else f"[{json.dumps(p)}]")
    return out


_TYPE_NAMES = {dict: "an object", list: "an array", str: "a string", bool: "a boolean",
               int: "an integer", float: "a number", type(None): "null"}


def _show(value: Any) -> str:
    text = json.dumps(value, ensure_ascii=False)
    return text if len(text) <= 60 else text[:57] + "..."


def _from_error(err: jsonschema.ValidationError) -> list[dict[str, str]]:
    path = list(err.absolute_path)
    where = json_path(path)
    if err.validator == "required":
        missing = [p for p in err.validator_value if isinstance(err.instance, dict) and p not in err.instance]
        return [violation("missing_required", json_path(path + [p]), f"the required property {p!r} is missing")
                for p in missing]
    if err.validator == "additionalProperties" and err.validator_value is False and isinstance(err.instance, dict):
        declared = set((err.schema.get("properties") or {}).keys())
        patterns = list((err.schema.get("patternProperties") or {}).keys())
        extras = [k for k in err.instance if k not in declared and not any(re.search(p, k) for p in patterns)]
        return [violation("additional_property", json_path(path + [k]),
                          f"{k!r} is not a property this tool declares, and its schema allows no others")
                for k in extras]
    if err.validator == "type":
        wanted = err.validator_value if isinstance(err.validator_value, str) else " or ".join(err.validator_value)
        got = _TYPE_NAMES.get(type(err.instance), type(err.instance).__name__)
        return [violation("wrong_type", where, f"should be {wanted}, got {got} ({_show(err.instance)})")]
    if err.validator == "enum":
        allowed = ", ".join(_show(v) for v in err.validator_value)
        return [violation("enum", where, f"{_show(err.instance)} is not one of the allowed values: {allowed}")]
    return [violation(str(err.validator), where, err.message)]


def validate_call(name: str, arguments: Any, arguments_error: str | None,
                  tools: dict[str, dict[str, Any]] | None) -> list[dict[str, str]]:
    """Violations of one call against the tools offered in its request."""
    out: list[dict[str, str]] = []
    if arguments_error:
        out.append(violation("invalid_json", "$", f"the arguments are not valid JSON ({arguments_error})"))
    if tools is None or name not in tools:
        out.append(violation("unknown_tool", "$", f"the model called {name!r}, which this request did not offer"))
        return out
    schema = tools[name].get("schema")
    if arguments_error or schema is None:
        return out
    out.extend(_task_progress(name, arguments, schema))
    leaked = {v["path"] for v in out}
    try:
        cls = validators.validator_for(schema, default=validators.Draft202012Validator)
        errors = sorted(cls(schema).iter_errors(arguments), key=lambda e: (list(map(str, e.absolute_path)), str(e.validator)))
        for err in errors:
            for v in _from_error(err):
                # The leaked task_progress is already reported, as what it is.
                if not (v["kind"] == "additional_property" and v["path"] in leaked):
                    out.append(v)
    except Exception as exc:  # SchemaError, unresolvable $ref, bad regex...
        # A schema jsonschema cannot use is a fact about the tool, not a decoder failure.
        out.append(violation("unusable_schema", "$", f"the tool's schema cannot be checked: {exc}"))
    return _dedupe(out)


def _task_progress(name: str, arguments: Any, schema: dict[str, Any]) -> list[dict[str, str]]:
    """task_progress sent to a tool whose schema does not declare it: Cline passes it on
    untouched, so an MCP server receives a parameter it never asked for."""
    if not isinstance(arguments, dict) or TASK_PROGRESS not in arguments:
        return []
    if TASK_PROGRESS in (schema.get("properties") or {}):
        return []
    closed = schema.get("additionalProperties") is False
    return [violation("undeclared_parameter", "$." + TASK_PROGRESS,
                      f"task_progress was sent to {name!r}, whose schema does not declare it"
                      + (" and allows no other properties" if closed else "")
                      + "; the tool receives it as an argument")]


def _dedupe(items: list[dict[str, str]]) -> list[dict[str, str]]:
    seen, out = set(), []
    for v in items:
        key = (v["kind"], v["path"], v["message"])
        if key not in seen:
            seen.add(key)
            out.append(v)
    return out
