"""OpenAI function tools: Chat Completions and Responses shapes, both directions."""

from __future__ import annotations

from .common import description_of, meta_losses
from .losses import Loss
from .names import fix_name
from .spec import ToolSpec

OWN_META = ("strict",)


def _strict_losses(schema: dict, path: str) -> list[Loss]:
    """What OpenAI's strict mode will refuse: every object closed, every property required."""
    losses: list[Loss] = []
    if not isinstance(schema, dict):
        return losses
    if schema.get("type") == "object" or "properties" in schema:
        props = schema.get("properties") or {}
        if schema.get("additionalProperties") is not False:
            losses.append(Loss(f"{path}.additionalProperties", "strict mode requires additionalProperties: false", "rejected"))
        missing = [p for p in props if p not in (schema.get("required") or [])]
        if missing:
            losses.append(Loss(f"{path}.required", f"strict mode requires every property to be required (missing: {', '.join(missing)})", "rejected"))
        for name, sub in props.items():
            losses += _strict_losses(sub, f"{path}.properties.{name}")
    if isinstance(schema.get("items"), dict):
        losses += _strict_losses(schema["items"], f"{path}.items")
    for key in ("anyOf", "$defs", "definitions"):
        subs = schema.get(key)
        for k, sub in (enumerate(subs) if isinstance(subs, list) else (subs or {}).items()):
            losses += _strict_losses(sub, f"{path}.{key}[{k}]" if isinstance(k, int) else f"{path}.{key}.{k}")
    return losses


def _function_body(spec: ToolSpec, name_path: str, params_path: str) -> tuple[dict, list[Loss]]:
    name, renamed = fix_name(spec.name, "openai")
    losses = [Loss(name_path, renamed.reason, "renamed")] if renamed else []
    body: dict = {"name": name}
    if spec.description is not None:
        body["description"] = spec.description
    body["parameters"] = spec.parameters
    if "strict" in spec.meta:
        body["strict"] = spec.meta["strict"]
        if spec.meta["strict"] is True:
            losses += _strict_losses(spec.parameters, params_path)
    losses += meta_losses(spec, "OpenAI", OWN_META)
    return body, losses


def to_openai_chat(spec: ToolSpec) -> tuple[dict, list[Loss]]:
    body, losses = _function_body(spec, "$.function.name", "$.function.parameters")
    return {"type": "function", "function": body}, losses


def to_openai_responses(spec: ToolSpec) -> tuple[dict, list[Loss]]:
    body, losses = _function_body(spec, "$.name", "$.parameters")
    return {"type": "function", **body}, losses


def is_openai_chat(obj: dict) -> bool:
    return obj.get("type") == "function" and isinstance(obj.get("function"), dict)


def is_openai_responses(obj: dict) -> bool:
    return obj.get("type") == "function" and "name" in obj and "function" not in obj


def from_openai(obj: dict) -> tuple[ToolSpec, list[Loss]]:
    """Either shape, or a legacy `functions` entry ({name, description, parameters})."""
    body = obj["function"] if is_openai_chat(obj) else obj
    meta = {"strict": body["strict"]} if "strict" in body else {}
    return ToolSpec(body["name"], description_of(body), body.get("parameters"), meta), []
