"""Anthropic Messages client tools: {name, description, input_schema}."""

from __future__ import annotations

from .common import description_of, meta_losses, top_level_composition_losses
from .losses import Loss
from .names import fix_name
from .spec import ToolSpec

OWN_META = ("cache_control", "input_examples")


def to_anthropic(spec: ToolSpec) -> tuple[dict, list[Loss]]:
    name, renamed = fix_name(spec.name, "anthropic")
    losses = [renamed] if renamed else []
    out: dict = {"name": name}
    if spec.description is not None:
        out["description"] = spec.description
    out["input_schema"] = spec.parameters
    for key in OWN_META:
        if key in spec.meta:
            out[key] = spec.meta[key]
    losses += top_level_composition_losses(spec.parameters, "$.input_schema", "Anthropic")
    losses += meta_losses(spec, "Anthropic", OWN_META)
    return out, losses


def is_anthropic(obj: dict) -> bool:
    return "name" in obj and "input_schema" in obj


def from_anthropic(obj: dict) -> tuple[ToolSpec, list[Loss]]:
    meta = {k: obj[k] for k in OWN_META if k in obj}
    return ToolSpec(obj["name"], description_of(obj), obj.get("input_schema"), meta), []
