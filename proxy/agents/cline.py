"""Cline 3.x: MCP tools named `<uid>0mcp0<tool>`, the uid mapped to a server name.

Cline names each MCP tool `<server uid>0mcp0<tool>` (CLINE_MCP_TOOL_IDENTIFIER). The uid
is random per Cline run, so it is resolved to the server's name: from the tool's
description in the same session (Cline writes `"<server name>: <description>"`), else from
a `[use_mcp_tool for '<server>'] Result:` header that answered a call of that uid (see
`session.py`), else it stays the uid, marked unresolved.
"""

from __future__ import annotations

import re
from typing import Any

from .base import Agent, decoded_name

MCP_IDENTIFIER = "0mcp0"
CONVENTION = "cline3"

# Tools Cline offers (native or in the system prompt's text path), across 3.x releases.
BUILTIN_TOOLS = frozenset({
    "execute_command", "read_file", "write_to_file", "replace_in_file", "search_files",
    "list_files", "list_code_definition_names", "browser_action", "use_mcp_tool",
    "access_mcp_resource", "ask_followup_question", "attempt_completion", "plan_mode_respond",
    "act_mode_respond", "new_task", "load_mcp_documentation", "web_fetch", "web_search",
    "focus_chain", "condense", "summarize_task", "report_bug", "new_rule",
    "generate_explanation", "apply_patch", "use_skill", "use_subagents",
})

_SERVER_PREFIX = re.compile(r"^([^\n:]{1,100}):\s")


def split_name(name: str) -> tuple[str, str] | None:
    """(uid, tool) of a Cline 3.x MCP name, split at the first `0mcp0`."""
    uid, sep, tool = name.partition(MCP_IDENTIFIER)
    if not sep or not uid or not tool:
        return None
    return uid, tool


def server_from_description(description: str) -> str | None:
    """The server name Cline puts before an MCP tool's description ("weather: Get ...")."""
    m = _SERVER_PREFIX.match(description or "")
    return m.group(1).strip() or None if m else None


class Cline(Agent):
    name = "cline"

    def detect(self, view: Any) -> bool:
        if "You are Cline" in view.system_text:
            return True
        tools = view.tools or {}
        if any(MCP_IDENTIFIER in n for n in tools):
            return True
        if any("task_progress" in ((t.get("schema") or {}).get("properties") or {}) for t in tools.values()):
            return True
        user = view.first_user
        return bool(user and any(t.lstrip().startswith("<task>") for t in user.texts()))

    def decode_name(self, name: str, view: Any, agent: str) -> dict[str, Any] | None:
        parts = split_name(name)
        if parts is None:
            return None
        uid, tool = parts
        server = view.uids.get(uid)
        return decoded_name("mcp", server or uid, tool, CONVENTION, uid=uid, resolved=server is not None)


AGENT = Cline()
