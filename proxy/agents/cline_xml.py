"""Cline's text-path tool calls: XML in the assistant's text.

Models without native tool calling answer Cline with `<read_file><path>a.py</path>
</read_file>`, `<use_mcp_tool><server_name>..</server_name><tool_name>..</tool_name>
<arguments>{json}</arguments></use_mcp_tool>`. Like Cline's own parser, `content` and
`diff` run to their last closing tag (file contents may hold anything), and a block cut
off by the end of the text is kept, marked partial.
"""

from __future__ import annotations

import json
import re
from typing import Any

from .base import decoded_name
from .cline import BUILTIN_TOOLS

_OPEN = re.compile(r"<([a-z_]+)>")
_GREEDY_PARAMS = {"content", "diff"}


def _params(body: str) -> tuple[dict[str, str], bool]:
    params: dict[str, str] = {}
    partial = False
    pos = 0
    while True:
        m = _OPEN.search(body, pos)
        if not m:
            break
        name = m.group(1)
        close_tag = f"</{name}>"
        close = body.rfind(close_tag) if name in _GREEDY_PARAMS else body.find(close_tag, m.end())
        if close < m.end():
            params[name] = body[m.end():].strip()
            partial = True
            break
        params[name] = body[m.end():close].strip()
        pos = close + len(close_tag)
    return params, partial


def extract(text: str, tools: frozenset[str] = BUILTIN_TOOLS) -> list[dict[str, Any]]:
    """Text-path calls of an assistant text, in order."""
    calls = []
    pos = 0
    while True:
        m = _OPEN.search(text, pos)
        if not m:
            break
        name = m.group(1)
        if name not in tools:
            pos = m.end()
            continue
        close_tag = f"</{name}>"
        # write_to_file's content may itself mention the closing tag: take the last one.
        close = text.rfind(close_tag) if name in ("write_to_file", "replace_in_file") else text.find(close_tag, m.end())
        body = text[m.end():] if close < m.end() else text[m.end():close]
        params, partial = _params(body)
        calls.append(_call(len(calls), name, params, partial or close < m.end()))
        if close < m.end():
            break
        pos = close + len(close_tag)
    return calls


def _call(index: int, name: str, params: dict[str, str], partial: bool) -> dict[str, Any]:
    arguments: Any = dict(params)
    arguments_error = None
    if name == "use_mcp_tool":
        decoded = decoded_name("mcp", params.get("server_name"), params.get("tool_name") or "", "cline_xml")
        raw = params.get("arguments", "")
        try:
            arguments = json.loads(raw) if raw.strip() else {}
        except ValueError as exc:
            arguments, arguments_error = None, f"invalid JSON: {exc}"
    elif name == "access_mcp_resource":
        decoded = decoded_name("mcp", params.get("server_name"), params.get("uri") or "", "cline_xml")
    else:
        decoded = decoded_name("builtin", None, name, "cline_xml")
    return {"index": index, "name": name, "params": params, "arguments": arguments,
            "arguments_error": arguments_error, "partial": partial, "decoded": decoded}
