"""The agents package's data: what the decoder is given, what it gives back, and the
small interface every agent module implements.

Decoding is a pure function of stored data (a session's turns, in arrival order), so
`tooltap redecode` gives the same answer as the live path. Everything returned is plain
JSON-able dicts and lists.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any


@dataclass
class CallInput:
    """One stored tool call of a turn (the proxy's `ToolCall`, as stored)."""

    index: int
    id: str | None
    name: str
    arguments_raw: str
    arguments: Any = None
    arguments_error: str | None = None


@dataclass
class TurnInput:
    id: int
    # The earlier turn of the same session whose request this turn's request extends
    # (None for the first). Retries and edits make branches: two turns may share a parent.
    parent_id: int | None
    api: str  # "openai.chat" | "anthropic.messages" | "openai.responses" | "gemini" | "other"
    request: dict | None
    response: dict | None
    tool_calls: list[CallInput] = field(default_factory=list)
    # What the views read from the request, worked out once per turn (view.py): a turn is
    # decoded again as the parent and grandparent of the turns after it. Not part of the
    # turn's value, and never carried over by dataclasses.replace.
    memo: dict[str, Any] = field(default_factory=dict, init=False, compare=False, repr=False)


@dataclass
class SessionDecoding:
    """Per tool call: {decoded, task_progress, result, violations}; per turn: the agent,
    Cline's message structure, text-path calls and decoder errors."""

    calls: dict[tuple[int, int], dict[str, Any]] = field(default_factory=dict)
    turns: dict[int, dict[str, Any]] = field(default_factory=dict)
    # uid -> server name, for Cline 3.x uids resolved in this session (for inspection).
    uids: dict[str, str] = field(default_factory=dict)

    def call(self, turn_id: int, index: int) -> dict[str, Any]:
        return self.calls[(turn_id, index)]

    def turn(self, turn_id: int) -> dict[str, Any]:
        return self.turns[turn_id]

    def to_json(self) -> dict[str, Any]:
        """The whole decoding as one JSON-able value (call keys become "turn:index")."""
        return {
            "calls": {f"{t}:{i}": v for (t, i), v in self.calls.items()},
            "turns": {str(t): v for t, v in self.turns.items()},
            "uids": dict(self.uids),
        }


def decoded_name(kind: str, server: str | None, tool: str, convention: str, **extra: Any) -> dict[str, Any]:
    """The `decoded` dict of a tool call; extra keys (uid, resolved) only when given."""
    out: dict[str, Any] = {"kind": kind, "server": server, "tool": tool, "convention": convention}
    out.update({k: v for k, v in extra.items() if v is not None})
    return out


class Agent:
    """One agent family. Subclasses override what their agent does differently; the
    defaults mean "nothing special". Adding an agent is adding one module with one
    subclass and listing it in `registry.AGENTS`."""

    name = "generic"

    def detect(self, view: "Any") -> bool:
        """Does this turn's request look like it came from this agent?"""
        return False

    def decode_name(self, name: str, view: "Any", agent: str) -> dict[str, Any] | None:
        """`decoded` for a tool name in this agent's MCP convention, or None when the
        name is not in it. `agent` is the detected agent of the turn."""
        return None
