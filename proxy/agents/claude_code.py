"""Claude Code: MCP tools named `mcp__<server>__<tool>`."""

from __future__ import annotations

from typing import Any

from .base import Agent, decoded_name

CONVENTION = "claude_code"
PREFIX = "mcp__"


class ClaudeCode(Agent):
    name = "claude_code"

    def detect(self, view: Any) -> bool:
        if "You are Claude Code" in view.system_text:
            return True
        return any(n.startswith(PREFIX) for n in view.tools or {})

    def decode_name(self, name: str, view: Any, agent: str) -> dict[str, Any] | None:
        if not name.startswith(PREFIX):
            return None
        # Server names may hold single underscores; the tool is after the next "__".
        server, sep, tool = name[len(PREFIX):].partition("__")
        if not sep or not server or not tool:
            return None
        return decoded_name("mcp", server, tool, CONVENTION)


AGENT = ClaudeCode()
