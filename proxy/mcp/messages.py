"""MCP messages as they cross the wire: lines cut from a byte stream, then classified.

stdio MCP is newline-delimited JSON-RPC: one message per line, no newline inside one
(JSON escapes it). A pipe read can end anywhere, so `Lines` keeps the start of a line
until its end arrives. `classify` reads one line (or HTTP body, or SSE event): a request,
response, notification or batch, or something that is not JSON-RPC, kept and flagged.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

import orjson

TO_SERVER = "to_server"
FROM_SERVER = "from_server"


class Lines:
    """Bytes in, complete lines out (without their LF; a CR before it is kept, as sent)."""

    def __init__(self) -> None:
        self._parts: list[bytes] = []

    def feed(self, data: bytes) -> list[bytes]:
        if b"\n" not in data:
            if data:  # a long line arriving in many reads: parked, joined once at its end
                self._parts.append(data)
            return []
        if self._parts:
            self._parts.append(data)
            data = b"".join(self._parts)
            self._parts = []
        lines = data.split(b"\n")
        rest = lines.pop()
        if rest:
            self._parts.append(rest)
        return [line for line in lines if line.strip()]  # blank lines carry no message

    def rest(self) -> bytes:
        """What arrived after the last newline (at the end of the stream: a last line
        without one)."""
        data = b"".join(self._parts)
        self._parts = []
        return data if data.strip() else b""


@dataclass
class Parsed:
    kind: str  # "request" | "response" | "notification" | "batch" | "invalid"
    json: Any  # the parsed value, or None when the line is not JSON
    method: str | None = None
    jsonrpc_id: str | None = None  # the id as JSON text, so 5 and "5" stay apart
    tool: str | None = None  # a tools/call request: the tool's name
    is_error: bool = False  # a JSON-RPC error, or a tool result with isError
    note: str | None = None  # why the message is flagged


def classify(raw: bytes) -> Parsed:
    try:
        value = orjson.loads(raw)
    except orjson.JSONDecodeError:
        try:  # orjson refuses what the stdlib reads (NaN, integers beyond 64 bits)
            value = json.loads(raw)
        except (ValueError, RecursionError):
            return Parsed("invalid", None, note="not JSON")
    if isinstance(value, list):
        if not value:
            return Parsed("batch", value, note="an empty batch")
        parts = [_one(v) for v in value]
        notes = sorted({p.note for p in parts if p.note})
        return Parsed("batch", value, is_error=any(p.is_error for p in parts), note="; ".join(notes) or None)
    return _one(value)


def _one(msg: Any) -> Parsed:
    if not isinstance(msg, dict):
        return Parsed("invalid", msg, note="JSON but not a JSON-RPC message")
    note = None if msg.get("jsonrpc") == "2.0" else "no \"jsonrpc\": \"2.0\""
    ident = json_id(msg["id"]) if "id" in msg else None
    method = msg.get("method")
    if isinstance(method, str):
        params = msg.get("params")
        tool = params.get("name") if method == "tools/call" and isinstance(params, dict) else None
        kind = "request" if "id" in msg else "notification"
        return Parsed(kind, msg, method, ident, tool if isinstance(tool, str) else None, note=note)
    if "result" in msg or "error" in msg:
        result = msg.get("result")
        failed = "error" in msg or (isinstance(result, dict) and result.get("isError") is True)
        return Parsed("response", msg, None, ident, is_error=failed, note=note)
    return Parsed("invalid", msg, note="JSON but not a JSON-RPC message")


def json_id(value: Any) -> str:
    return json.dumps(value, ensure_ascii=False)


def elements(value: Any) -> list[dict]:
    """The JSON-RPC messages in a parsed line: itself, or a batch's members."""
    if isinstance(value, list):
        return [v for v in value if isinstance(v, dict)]
    return [value] if isinstance(value, dict) else []


def result_text(result: Any) -> str | None:
    """A tool result's text as an agent shows it to a model: its text content items,
    joined by blank lines (Cline's way), or None when it holds no text."""
    if not isinstance(result, dict) or not isinstance(result.get("content"), list):
        return None
    texts = [c.get("text") for c in result["content"]
             if isinstance(c, dict) and c.get("type") == "text" and isinstance(c.get("text"), str)]
    return "\n\n".join(texts) if texts else None
