"""Load a tool set from wherever it lives: a file in any of the four formats (or a
whole request body, or an MCP `tools/list` result), or the tooltap database."""

from __future__ import annotations

import json
import os
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from .anthropic_tools import from_anthropic, is_anthropic
from .gemini_tools import from_gemini, is_gemini
from .mcp_tools import from_mcp, is_mcp
from .openai_tools import from_openai, is_openai_chat, is_openai_responses
from .spec import ToolSpec

DEFAULT_DB = "sqlite:///tooltap.db"


class SourceError(ValueError):
    pass


@dataclass
class ToolSet:
    source: str  # what the user named
    format: str  # detected format of the tools ("openai", "anthropic", "mixed", ...)
    tools: list[ToolSpec]
    skipped: list[str] = field(default_factory=list)  # entries that are not function tools


def default_db() -> str:
    return os.environ.get("TOOLTAP_DB") or DEFAULT_DB


def detect(entry: Any) -> str | None:
    """The format of one tool entry, or None for something that is not a function tool."""
    if not isinstance(entry, dict):
        return None
    if is_openai_chat(entry):
        return "openai"
    if is_openai_responses(entry):
        return "openai-responses"
    if is_anthropic(entry):
        return "anthropic"
    if is_mcp(entry):
        return "mcp"
    if is_gemini(entry):
        return "gemini"
    if "name" in entry and "type" not in entry and ("parameters" in entry or "description" in entry):
        # legacy OpenAI `functions` entry (or a Gemini declaration with lower-case
        # types, which reads the same way)
        return "openai-function"
    return None


PARSERS = {
    "openai": from_openai, "openai-responses": from_openai, "openai-function": from_openai,
    "anthropic": from_anthropic, "mcp": from_mcp, "gemini": from_gemini,
}


def _entries(doc: Any) -> list:
    """Find the list of tool entries in a parsed document."""
    if isinstance(doc, list):
        out = []
        for item in doc:  # Gemini `tools: [{functionDeclarations: [...]}, ...]`
            if isinstance(item, dict) and isinstance(item.get("functionDeclarations"), list):
                out += item["functionDeclarations"]
            else:
                out.append(item)
        return out
    if not isinstance(doc, dict):
        raise SourceError("expected a JSON list of tools or an object holding one")
    if isinstance(doc.get("result"), dict):  # a JSON-RPC response to tools/list
        return _entries(doc["result"])
    for key in ("tools", "functionDeclarations", "function_declarations", "functions"):
        if isinstance(doc.get(key), list):
            return _entries(doc[key])
    if detect(doc):
        return [doc]  # a single tool
    raise SourceError("no tools found (looked for a list, `tools`, `functionDeclarations`, `functions`, `result.tools`)")


def _from_jsonl(text: str) -> Any:
    """An MCP stdio/HTTP capture, one JSON-RPC message per line: the last tools/list result."""
    found = None
    for line in text.splitlines():
        if not line.strip():
            continue
        msg = json.loads(line)
        msg = msg.get("message", msg) if isinstance(msg, dict) else msg
        if isinstance(msg, dict) and isinstance(msg.get("result"), dict) and "tools" in msg["result"]:
            found = msg["result"]
    if found is None:
        raise SourceError("no tools/list result in this JSON-lines file")
    return found


def from_document(doc: Any, source: str = "<document>") -> ToolSet:
    tools: list[ToolSpec] = []
    formats: set[str] = set()
    skipped: list[str] = []
    for i, entry in enumerate(_entries(doc)):
        fmt = detect(entry)
        if fmt is None:
            kind = entry.get("type") if isinstance(entry, dict) else type(entry).__name__
            skipped.append(f"tools[{i}] ({kind}): not a function tool")
            continue
        spec, _ = PARSERS[fmt](entry)
        tools.append(spec)
        formats.add(fmt)
    if formats == {"gemini", "openai-function"}:
        formats = {"gemini"}  # a declaration without upper-case types (e.g. no parameters)
    fmt = formats.pop() if len(formats) == 1 else ("mixed" if formats else "empty")
    return ToolSet(source, fmt, tools, skipped)


def from_file(path: str | Path) -> ToolSet:
    """A JSON or JSONL file of tools; `-` reads standard input."""
    try:
        if str(path) == "-":
            path, text = "<stdin>", sys.stdin.buffer.read().decode("utf-8")
        else:
            text = Path(path).read_text(encoding="utf-8")
    except OSError as exc:
        raise SourceError(f"cannot read {path}: {exc.strerror or exc}") from exc
    except UnicodeDecodeError as exc:
        raise SourceError(f"{path}: not UTF-8 ({exc.reason} at byte {exc.start})") from exc
    try:
        doc = json.loads(text)
    except json.JSONDecodeError as exc:
        try:
            doc = _from_jsonl(text)
        except json.JSONDecodeError:
            raise SourceError(f"{path}: not JSON ({exc})") from exc
        except SourceError as jsonl_exc:
            raise SourceError(f"{path}: {jsonl_exc}") from exc
    return from_document(doc, str(path))


def from_db(source: str, db_url: str | None = None) -> ToolSet:
    # Imported here so this module works without the store being present.
    from proxy.store import read
    from proxy.store.db import shown_url

    db_url = db_url or default_db()
    kind, _, ident = source.partition(":")
    if kind == "mcp":  # an MCP server's tools/list (proxy/mcp/toolsets.py)
        from proxy.mcp.toolsets import load_source

        return load_source(source, db_url)
    if kind == "turn":
        try:
            turn_id = int(ident)
        except ValueError:
            raise SourceError(f"turn id must be a number: {ident!r}") from None
        if not 0 < turn_id < 2**63:
            raise SourceError(f"{source}: not found in {shown_url(db_url)}")
        tools = read.turn_tools(db_url, turn_id)
    else:
        try:
            tools = read.session_tools(db_url, ident)
        except LookupError as exc:
            raise SourceError(f"{source}: {exc}") from None
    if tools is None:
        raise SourceError(f"{source}: not found in {shown_url(db_url)}")
    return from_document(tools, source)


def load(source: str, db_url: str | None = None) -> ToolSet:
    """A file path, or `turn:<id>` / `session:<id>` / `mcp:<server>` from the tooltap database."""
    if source.startswith(("turn:", "session:", "mcp:")) and not Path(source).exists():
        return from_db(source, db_url)
    return from_file(source)
