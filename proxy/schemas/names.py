"""Tool-name rules per provider, and the rename a converter applies when a name breaks them."""

from __future__ import annotations

import hashlib
import re

from .losses import Loss

# OpenAI and Anthropic: ^[a-zA-Z0-9_-]{1,64}$
OPENAI_NAME = re.compile(r"^[a-zA-Z0-9_-]{1,64}$")
# Gemini: starts with a letter or underscore; letters, digits, _ . : - ; at most 128
GEMINI_NAME = re.compile(r"^[a-zA-Z_][a-zA-Z0-9_.:-]{0,127}$")

RULES = {
    "openai": (OPENAI_NAME, re.compile(r"[^a-zA-Z0-9_-]"), 64),
    "anthropic": (OPENAI_NAME, re.compile(r"[^a-zA-Z0-9_-]"), 64),
    "gemini": (GEMINI_NAME, re.compile(r"[^a-zA-Z0-9_.:-]"), 128),
}


def _shorten(raw: str, cleaned: str, limit: int) -> str:
    # Same scheme as the Cline 4.x SDK for MCP names: keep a readable prefix and make
    # it unique with a hash of the raw name.
    digest = hashlib.sha1(raw.encode("utf-8")).hexdigest()[:8]
    return cleaned[: limit - 9] + "_" + digest


def valid_name(name: str, provider: str) -> bool:
    rule = RULES.get(provider)
    return True if rule is None else bool(rule[0].match(name))


def fix_name(name: str, provider: str) -> tuple[str, Loss | None]:
    """Return (name the provider accepts, a 'renamed' Loss or None)."""
    rule = RULES.get(provider)
    if rule is None or rule[0].match(name):
        return name, None
    _, bad_chars, limit = rule
    cleaned = bad_chars.sub("_", name) or "_"
    if provider == "gemini" and not re.match(r"[a-zA-Z_]", cleaned):
        cleaned = "_" + cleaned
    new = cleaned if len(cleaned) <= limit else _shorten(name, cleaned, limit)
    why = []
    if len(name) > limit:
        why.append(f"longer than {limit} characters ({len(name)})")
    if bad_chars.search(name):
        why.append("characters outside " + bad_chars.pattern.replace("[^", "[", 1))
    if provider == "gemini" and not re.match(r"[a-zA-Z_]", name):
        why.append("must start with a letter or underscore")
    if not name:
        why.append("empty")
    reason = f"{provider} rejects the name {name!r} ({'; '.join(why)}); renamed to {new!r}"
    return new, Loss("$.name", reason, "renamed")


CLINE_MCP = "0mcp0"


def mcp_identity(name: str, description: str | None) -> tuple[str, str] | None:
    """(server, tool) for an MCP tool name whose prefix is a per-run uid, else None.

    Cline 3.x names MCP tools `<uid>0mcp0<tool>` with a uid that changes on restart and
    writes the server name into the description (`"<server>: ..."`); the documented
    `serverUid__mcp__toolName` form carries a uid the same way. The pair (server, tool)
    is what stays stable, so two names with the same identity are one tool renamed.
    """
    for marker in (CLINE_MCP, "__mcp__"):
        uid, sep, tool = name.partition(marker)
        if sep and uid and tool:
            server = (description or "").split(": ", 1)[0] if ": " in (description or "") else ""
            return server, tool
    return None
