"""Cline 4.x (the SDK): MCP tools named `<server>__<tool>`.

Characters outside `[a-zA-Z0-9_-]` become `_`; when that changed the name, or it is over
64 characters, the name is the first 55 characters + `_` + 8 hex of sha1(raw name). Such
a name cannot be turned back into the exact server and tool: the parts are the sanitized,
possibly truncated ones, and `resolved` is False.

The bare `a__b` shape is common in other agents' builtin names too, so this convention
applies only to turns detected as Cline.
"""

from __future__ import annotations

import re
from typing import Any

from .base import Agent, decoded_name

CONVENTION = "cline4"
_HASHED = re.compile(r"^(.+)_([0-9a-f]{8})$")


def _is_hashed(name: str) -> re.Match[str] | None:
    m = _HASHED.match(name)
    if not m:
        return None
    if len(name) == 64:
        return m
    # A shorter name is hashed only when sanitizing changed it; 8 hex with both a digit
    # and a letter tells a hash from a tool that just ends in a number or a word.
    suffix = m.group(2)
    return m if re.search(r"\d", suffix) and re.search(r"[a-f]", suffix) else None


class ClineSdk(Agent):
    name = "cline_sdk"

    def decode_name(self, name: str, view: Any, agent: str) -> dict[str, Any] | None:
        if agent not in ("cline", "cline_sdk") or "__" not in name:
            return None
        hashed = _is_hashed(name)
        body = hashed.group(1) if hashed else name
        server, _, tool = body.partition("__")
        if not server or not tool:
            return None
        return decoded_name("mcp", server, tool, CONVENTION, resolved=False if hashed else None)


AGENT = ClineSdk()
