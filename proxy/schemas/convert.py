"""One entry point for converting tool sets between formats, per profile."""

from __future__ import annotations

from typing import Callable

from . import cline
from .anthropic_tools import to_anthropic
from .gemini_tools import to_gemini
from .losses import Loss
from .mcp_tools import to_mcp
from .openai_tools import to_openai_chat, to_openai_responses
from .spec import ToolSpec, normalize

Converter = Callable[[ToolSpec], "tuple[dict | None, list[Loss]]"]

FAITHFUL: dict[str, Converter] = {
    "openai": to_openai_chat,
    "openai-responses": to_openai_responses,
    "anthropic": to_anthropic,
    "gemini": to_gemini,
    "gemini-jsonschema": lambda spec: to_gemini(spec, json_schema=True),
    "mcp": to_mcp,
}
CLINE: dict[str, Converter] = {
    "openai": cline.cline_openai,
    "anthropic": cline.cline_anthropic,
    "gemini": cline.cline_gemini,
}
PROFILES = {"faithful": FAITHFUL, "cline": CLINE}
TARGETS = tuple(FAITHFUL)


class UnsupportedTarget(ValueError):
    pass


def convert_tool(spec: ToolSpec, target: str, profile: str = "faithful") -> tuple[dict | None, list[Loss]]:
    table = PROFILES[profile]
    if target not in table:
        raise UnsupportedTarget(f"profile {profile!r} has no converter to {target!r} (has: {', '.join(table)})")
    return table[target](normalize(spec))


def convert_tools(specs: list[ToolSpec], target: str, profile: str = "faithful") -> tuple[list[dict], list[Loss]]:
    """Convert a tool set; each loss is tagged with the source tool's name.

    A converter may return None for a tool (the cline profile leaves some tools out).
    """
    tools: list[dict] = []
    losses: list[Loss] = []
    for spec in specs:
        tool, tool_losses = convert_tool(spec, target, profile)
        if tool is not None:
            tools.append(tool)
        losses += [loss.with_tool(spec.name) for loss in tool_losses]
    return tools, losses
