"""MCP tools as a server lists them: {name, title?, description, inputSchema, ...}."""

from __future__ import annotations

from .common import description_of, meta_losses
from .losses import Loss
from .spec import ToolSpec

OWN_META = ("title", "outputSchema", "annotations", "icons", "_meta")


def to_mcp(spec: ToolSpec) -> tuple[dict, list[Loss]]:
    # MCP puts no hard limit a client enforces on names, so nothing is renamed here.
    out: dict = {"name": spec.name}
    if "title" in spec.meta:
        out["title"] = spec.meta["title"]
    if spec.description is not None:
        out["description"] = spec.description
    out["inputSchema"] = spec.parameters
    for key in OWN_META[1:]:
        if key in spec.meta:
            out[key] = spec.meta[key]
    return out, meta_losses(spec, "MCP", OWN_META)


def is_mcp(obj: dict) -> bool:
    return "name" in obj and "inputSchema" in obj


def from_mcp(obj: dict) -> tuple[ToolSpec, list[Loss]]:
    meta = {k: obj[k] for k in OWN_META if k in obj}
    return ToolSpec(obj["name"], description_of(obj), obj.get("inputSchema"), meta), []
