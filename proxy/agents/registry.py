"""The agent modules, in the order they are tried, and tool-name decoding over them."""

from __future__ import annotations

import re
from typing import Any

from . import claude_code, cline, cline_sdk, generic
from .base import Agent

# Detection order: the first agent whose detect() is true names the turn's agent.
AGENTS: list[Agent] = [cline.AGENT, claude_code.AGENT, cline_sdk.AGENT, generic.AGENT]
# Name decoding order: the distinctive separators first, the bare `a__b` of Cline 4.x last.
NAMING: list[Agent] = [cline.AGENT, claude_code.AGENT, generic.AGENT, cline_sdk.AGENT]

_PROVIDER_NAME = re.compile(r"^[a-zA-Z0-9_-]+$")
MAX_NAME = 64


def detect_agent(view: Any) -> str:
    return next(a.name for a in AGENTS if a.detect(view))


def name_problems(name: str) -> list[str]:
    """Why OpenAI / Anthropic would reject this tool name (`^[a-zA-Z0-9_-]{1,64}$`)."""
    problems = []
    if not name:
        problems.append("the name is empty")
    if len(name) > MAX_NAME:
        problems.append(f"the name is {len(name)} characters long; providers accept at most {MAX_NAME}"
                        " (and Cline silently drops such MCP tools)")
    if name and not _PROVIDER_NAME.match(name):
        bad = sorted({ch for ch in name if not re.match(r"[a-zA-Z0-9_-]", ch)})
        problems.append("the name has characters outside [a-zA-Z0-9_-]: " + " ".join(repr(c) for c in bad))
    return problems


def decode_name(name: str, view: Any, agent: str) -> dict[str, Any]:
    decoded = None
    for module in NAMING:
        decoded = module.decode_name(name, view, agent)
        if decoded is not None:
            break
    if decoded is None:
        decoded = generic.builtin(name)
    problems = name_problems(name)
    if problems:
        decoded["name_problems"] = problems
    return decoded


def uid_of(name: str) -> str | None:
    """The server uid of an MCP name in a uid-based convention (Cline 3.x, `__mcp__`)."""
    parts = cline.split_name(name)
    if parts:
        return parts[0]
    uid, sep, tool = name.partition(generic.SEPARATOR)
    return uid if sep and uid and tool else None
