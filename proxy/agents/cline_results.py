"""Cline's tool results as text: `[<tool> for '<arg>'] Result:` blocks.

Cline holds results as plain text in the next user message, each headed by a description
of the call it answers. This module finds those headers, computes the header a given call
should get, and classifies a result's text (ok, denied, error, empty).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

# One header at a line start. The argument may hold quotes and newlines (commands do), so
# it runs to the first `'] Result:` rather than the first quote.
HEADER = re.compile(r"^\[([^\s\]]+)(?: for '(.*?)')?\] Result:", re.M | re.S)

PLACEHOLDER = "result missing"
EMPTY_RESULT = "(tool did not return anything)"
DENIED = "The user denied this operation."
TOOL_ERROR = "The tool execution failed with the following error:"

# Where each builtin puts the argument its header shows.
_ARG_PARAM = {
    "read_file": "path", "write_to_file": "path", "replace_in_file": "path",
    "list_files": "path", "list_code_definition_names": "path", "new_rule": "path",
    "execute_command": "command", "use_mcp_tool": "server_name", "access_mcp_resource": "server_name",
    "ask_followup_question": "question", "browser_action": "action", "web_fetch": "url",
    "web_search": "query", "use_skill": "skill_name",
}
_NO_ARG = {"attempt_completion", "plan_mode_respond", "act_mode_respond", "load_mcp_documentation",
           "condense", "summarize_task", "report_bug", "focus_chain", "generate_explanation"}


@dataclass
class Segment:
    """One result block: the header's tool and argument and the text under it."""

    tool: str
    arg: str | None
    text: str
    header: str
    used: bool = False


def segments(blocks: list[str]) -> list[Segment]:
    """Result segments of a user message's text blocks, in order. A header with nothing
    under it takes the following blocks up to the next header or Cline's own blocks
    (Cline sometimes sends the header and the result as separate blocks)."""
    out: list[Segment] = []
    open_seg: Segment | None = None
    for block in blocks:
        matches = list(HEADER.finditer(block))
        if not matches:
            if open_seg is not None and not _is_cline_block(block):
                open_seg.text = f"{open_seg.text}\n{block}" if open_seg.text else block
                continue
            open_seg = None
            continue
        # Text before the first header belongs to the open segment, if any.
        lead = block[: matches[0].start()].strip("\n")
        if lead and open_seg is not None:
            open_seg.text = f"{open_seg.text}\n{lead}" if open_seg.text else lead
        for i, m in enumerate(matches):
            end = matches[i + 1].start() if i + 1 < len(matches) else len(block)
            text = block[m.end():end]
            text = text[1:] if text.startswith("\n") else text
            seg = Segment(tool=m.group(1), arg=m.group(2), text=text.rstrip("\n"), header=m.group(0))
            out.append(seg)
            open_seg = seg if not seg.text.strip() else None
    return out


def _is_cline_block(text: str) -> bool:
    t = text.lstrip()
    return t.startswith(("<environment_details>", "<task>", "# task_progress", "# TODO LIST", "[ERROR]",
                         "<feedback>", "<user_message>"))


def header_key(tool: str, args: Any, decoded: dict[str, Any]) -> tuple[str, str | None]:
    """(header tool, header argument) the result of this call would carry. The argument
    is None when it cannot be known (then only the tool and order pair it)."""
    args = args if isinstance(args, dict) else {}
    if tool not in _ARG_PARAM and tool not in _NO_ARG and decoded.get("kind") == "mcp":
        # Native MCP calls are answered as use_mcp_tool for the server.
        return "use_mcp_tool", decoded.get("server") if decoded.get("resolved", True) else None
    if tool == "search_files":
        regex = args.get("regex")
        if not isinstance(regex, str):
            return tool, None
        pattern = args.get("file_pattern")
        return tool, regex + (f"' in '{pattern}" if pattern else "")
    if tool in _NO_ARG:
        return tool, ""
    param = _ARG_PARAM.get(tool)
    if param and isinstance(args.get(param), str):
        return tool, args[param]
    return tool, None


def status_of(text: str | None, is_error: bool = False) -> str:
    """ok | denied | error | empty, from a result's text as Cline words it."""
    if text is None:
        return "missing"
    t = text.strip()
    if t.startswith(DENIED) or t.startswith("Skipping tool") or "user rejecting a previous tool" in t[:200]:
        return "denied"
    if is_error or t.startswith(TOOL_ERROR) or t.startswith("Error executing MCP tool"):
        return "error"
    if not t or t == EMPTY_RESULT:
        return "empty"
    return "ok"


def is_placeholder(text: str | None) -> bool:
    return text is None or text.strip() in ("", PLACEHOLDER)
