"""Any agent: the documented `<serverUid>__mcp__<toolName>` form (seed 000), and the
builtin fallback for every name that matches no MCP convention."""

from __future__ import annotations

from typing import Any

from .base import Agent, decoded_name

CONVENTION = "uid_mcp"
SEPARATOR = "__mcp__"


class Generic(Agent):
    name = "generic"

    def detect(self, view: Any) -> bool:
        return True  # the last resort

    def decode_name(self, name: str, view: Any, agent: str) -> dict[str, Any] | None:
        uid, sep, tool = name.partition(SEPARATOR)
        if sep and uid and tool:
            # The uid is the server's uid, not its name; a description "<server>: ..."
            # names it the way Cline 3.x does.
            server = view.uids.get(uid)
            return decoded_name("mcp", server or uid, tool, CONVENTION, uid=uid, resolved=server is not None)
        return None


def builtin(name: str) -> dict[str, Any]:
    return decoded_name("builtin", None, name, "builtin")


AGENT = Generic()
