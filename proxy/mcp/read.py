"""Reading the MCP tap back: servers, messages, tool sets, and tools/call exchanges."""

from __future__ import annotations

import json
import signal
import zlib
from dataclasses import dataclass, field
from typing import Any

from sqlalchemy import func, or_
from sqlmodel import Session as DB, select

from ..store import content
from ..store.models import McpConnection, McpMessage, McpToolSet
from ..store.read import iso
from .messages import classify, elements, json_id, result_text


def servers(db: DB) -> list[dict]:
    """Every server seen, with its message, call and error counts."""
    is_call = (McpMessage.method == "tools/call") & (McpMessage.kind == "request")
    rows = db.exec(
        select(McpMessage.server, func.count(), func.count().filter(is_call),
               func.count().filter(McpMessage.is_error), func.max(McpMessage.at))
        .group_by(McpMessage.server).order_by(McpMessage.server)).all()
    conns = dict(db.exec(select(McpConnection.server, func.count()).group_by(McpConnection.server)).all())
    batched: dict[str, int] = {}  # the calls inside batches (MCP before 2025-06-18): read from their bodies
    for name, raw in db.exec(select(McpMessage.server, McpMessage.raw).where(
            McpMessage.kind == "batch", McpMessage.direction == "to_server")).all():
        batched[name] = batched.get(name, 0) + sum(
            1 for msg in elements(classify(zlib.decompress(raw)).json) if msg.get("method") == "tools/call")
    return [{"name": name, "messages": n, "calls": n_calls + batched.get(name, 0), "errors": errors,
             "connections": conns.get(name, 0), "last_at": iso(last)}
            for name, n, n_calls, errors, last in rows]


def message_json(m: McpMessage, raw: bool = True) -> dict:
    """raw: with the message's exact text beside its parsed `json` (the body twice). A
    message `json` cannot hold (not JSON) has its `raw` either way: its only content."""
    body = zlib.decompress(m.raw)
    parsed = classify(body)
    out = {
        "id": m.id, "server": m.server, "connection": m.connection, "direction": m.direction,
        "at": iso(m.at), "kind": m.kind, "method": m.method,
        "jsonrpc_id": json.loads(m.jsonrpc_id) if m.jsonrpc_id is not None else None,
        "tool": m.tool, "is_error": m.is_error, "note": m.note, "size": m.size,
        "json": parsed.json,
    }
    if raw or parsed.json is None:
        out["raw"] = body.decode("utf-8", "replace")
    return out


def messages(db: DB, server: str | None = None, limit: int = 100, before: int | None = None,
             connection: str | None = None, raw: bool = True) -> list[dict]:
    """Newest first. raw: see message_json."""
    q = select(McpMessage).order_by(McpMessage.id.desc()).limit(limit)
    if server is not None:
        q = q.where(McpMessage.server == server)
    if connection is not None:
        q = q.where(McpMessage.connection == connection)
    if before is not None:
        q = q.where(McpMessage.id < before)
    return [message_json(m, raw) for m in db.exec(q).all()]


def message(db: DB, message_id: int) -> dict | None:
    m = db.get(McpMessage, message_id)
    return None if m is None else message_json(m)


def connections(db: DB, server: str, limit: int = 50) -> list[dict]:
    rows = db.exec(select(McpConnection).where(McpConnection.server == server)
                   .order_by(McpConnection.started_at.desc()).limit(limit)).all()
    return [{"id": c.id, "server": c.server, "transport": c.transport, "command": c.command, "url": c.url,
             "started_at": iso(c.started_at), "ended_at": iso(c.ended_at), "exit_code": c.exit_code,
             "exit": exit_words(c.exit_code), "stderr_tail": c.stderr_tail} for c in rows]


def exit_words(code: int | None) -> str | None:
    """A run's exit as people read it: `1`, or `killed (SIGKILL)` for -9."""
    if code is None or code >= 0:
        return None if code is None else str(code)
    try:
        return f"killed ({signal.Signals(-code).name})"
    except ValueError:
        return f"killed (signal {-code})"


def _why_unanswered(conn: McpConnection | None, asked_at: float, until: float | None) -> str | None:
    """Why a call has no answer, when its connection ended after it was asked (and within
    the window read: an answer after `until` would not have been seen)."""
    if conn is None or conn.ended_at is None or conn.ended_at < asked_at:
        return None
    if until is not None and conn.ended_at > until:
        return None
    if conn.exit_code is None:
        return "the connection ended before an answer came"
    if conn.exit_code < 0:
        return f"the server was {exit_words(conn.exit_code)} before answering"
    return f"the server exited with code {conn.exit_code} before answering"


# -- tool sets -------------------------------------------------------------------------------

def tool_sets(db: DB, server: str | None = None, with_tools: bool = True) -> list[dict]:
    """Each distinct tools/list answer, oldest first."""
    q = select(McpToolSet).order_by(McpToolSet.first_seen, McpToolSet.id)
    if server is not None:
        q = q.where(McpToolSet.server == server)
    out = []
    for t in db.exec(q).all():
        row = {"id": t.id, "server": t.server, "tools_hash": t.tools_hash, "tool_count": t.tool_count,
               "first_seen": iso(t.first_seen), "last_seen": iso(t.last_seen), "seen": t.seen,
               "first_seen_ts": t.first_seen}
        if with_tools:
            row["tools"] = content.unpack(t.tools)
        out.append(row)
    return out


def declared(sets: list[dict], tool: str, at: float) -> dict | None:
    """The inputSchema `tool` had in the newest tool set seen by `at` (else the first one
    seen after), or None when no tools/list named it."""
    before = [s for s in sets if s["first_seen_ts"] <= at]
    for s in [*reversed(before), *[s for s in sets if s["first_seen_ts"] > at]]:
        for t in s.get("tools") or []:
            if isinstance(t, dict) and t.get("name") == tool:
                return t.get("inputSchema") if isinstance(t.get("inputSchema"), dict) else {}
    return None


# -- tools/call exchanges --------------------------------------------------------------------

@dataclass
class McpCall:
    """One tools/call and its answer, as the server saw them."""

    message_id: int
    server: str
    connection: str
    jsonrpc_id: str
    tool: str
    arguments: Any
    meta: Any
    request_at: float
    result_message_id: int | None = None
    result_at: float | None = None
    result: Any = None  # the JSON-RPC result
    error: Any = None  # the JSON-RPC error
    undeclared: list[str] = field(default_factory=list)
    schema_known: bool = False
    unanswered: str | None = None  # why there is no answer, when the connection says

    @property
    def is_error(self) -> bool:
        return self.error is not None or (isinstance(self.result, dict) and self.result.get("isError") is True)

    @property
    def result_text(self) -> str | None:
        return answer_text(self.result, self.error)

    @property
    def latency_ms(self) -> float | None:
        return None if self.result_at is None else round((self.result_at - self.request_at) * 1000, 3)

    def to_json(self) -> dict:
        return {"message_id": self.message_id, "result_message_id": self.result_message_id,
                "server": self.server, "connection": self.connection, "tool": self.tool,
                "arguments": self.arguments, "request_at": iso(self.request_at), "result_at": iso(self.result_at),
                "latency_ms": self.latency_ms, "is_error": self.is_error, "result_text": self.result_text,
                "error": self.error, "undeclared_arguments": self.undeclared, "schema_known": self.schema_known,
                "unanswered": self.unanswered}


def answer_text(result, error) -> str | None:
    """An answer to a tools/call as the pages show it: the error's message, else the result's text."""
    if error is not None:
        message = error.get("message") if isinstance(error, dict) else None
        return message if isinstance(message, str) else json.dumps(error, ensure_ascii=False)
    return result_text(result)


def calls(db: DB, *, server: str | None = None, since: float | None = None, until: float | None = None,
          limit: int | None = None, newest_first: bool = False) -> list[McpCall]:
    """tools/call requests (batches included) in a time range, each with its answer."""
    q = select(McpMessage).where(or_(McpMessage.method.in_(("tools/call", "notifications/cancelled")),
                                     McpMessage.kind == "batch"))
    if server is not None:
        q = q.where(McpMessage.server == server)
    if since is not None:
        q = q.where(McpMessage.at >= since)
    if until is not None:
        q = q.where(McpMessage.at <= until)
    q = q.order_by(McpMessage.at.desc() if newest_first else McpMessage.at, McpMessage.id)
    rows = db.exec(q).all()
    found: list[McpCall] = []
    open_: dict[tuple[str, str], McpCall] = {}
    answers: dict[tuple[str, str], tuple[McpMessage, dict]] = {}
    cancelled: set[tuple[str, str]] = set()  # a call the client cancelled gets no answer, by the spec
    for m in sorted(rows, key=lambda r: (r.at, r.id)):
        for msg in elements(classify(zlib.decompress(m.raw)).json):
            if msg.get("method") == "tools/call" and "id" in msg and m.direction == "to_server":
                params = msg.get("params") if isinstance(msg.get("params"), dict) else {}
                call = McpCall(m.id, m.server, m.connection, json_id(msg["id"]), str(params.get("name")),
                               params.get("arguments"), params.get("_meta"), m.at)
                found.append(call)
                open_[(m.connection, call.jsonrpc_id)] = call
            elif "id" in msg and m.direction == "from_server" and ("result" in msg or "error" in msg):
                answers[(m.connection, json_id(msg["id"]))] = (m, msg)
            elif msg.get("method") == "notifications/cancelled" and m.direction == "to_server":
                params = msg.get("params") if isinstance(msg.get("params"), dict) else {}
                if "requestId" in params:
                    cancelled.add((m.connection, json_id(params["requestId"])))
    for key, call in open_.items():
        if key in answers:
            m, msg = answers[key]
            call.result_message_id, call.result_at = m.id, m.at
            call.result, call.error = msg.get("result"), msg.get("error")
    waiting = [c for c in found if c.result_message_id is None]
    if waiting:
        ended = {c.id: c for c in db.exec(select(McpConnection).where(
            McpConnection.id.in_({c.connection for c in waiting}), McpConnection.ended_at.is_not(None))).all()}
        for call in waiting:
            if (call.connection, call.jsonrpc_id) in cancelled:
                call.unanswered = "cancelled by the client"
            else:
                call.unanswered = _why_unanswered(ended.get(call.connection), call.request_at, until)
    _undeclared(db, found)
    if newest_first:
        found.reverse()
    return found[:limit] if limit else found


def _undeclared(db: DB, found: list[McpCall]) -> None:
    """Arguments each server received that its tools/list never declared."""
    sets: dict[str, list[dict]] = {}
    for call in found:
        if call.server not in sets:
            sets[call.server] = tool_sets(db, call.server)
        schema = declared(sets[call.server], call.tool, call.request_at)
        call.schema_known = schema is not None
        props = (schema or {}).get("properties")
        if schema is not None and isinstance(call.arguments, dict):
            names = props if isinstance(props, dict) else {}
            call.undeclared = [k for k in call.arguments if k not in names]
