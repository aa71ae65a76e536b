"""Reading stored turns back as the JSON the read API serves (DESIGN.md, "Read API")."""

from __future__ import annotations

import base64
import json
import math
from datetime import datetime, timezone
from functools import lru_cache
from typing import Any, Callable

import orjson
from sqlalchemy import func, text
from sqlalchemy.engine import Engine
from sqlmodel import Session as DB, select

from .. import apis
from . import content
from .models import Blob, Session, ToolCallRow, Turn

CHAIN_QUERY = text(
    "WITH RECURSIVE c(hash, parent, message_hash, depth) AS ("
    " SELECT hash, parent, message_hash, depth FROM chain_nodes WHERE hash = :h"
    " UNION ALL SELECT n.hash, n.parent, n.message_hash, n.depth"
    " FROM chain_nodes n JOIN c ON n.hash = c.parent)"
    " SELECT message_hash FROM c ORDER BY depth"
)


MAX_ID = 2**63 - 1  # SQL's largest integer: a bigger id names nothing (and cannot be bound)
PREFIX_MIN = 4  # the shortest start of a session id the CLI takes for the whole


class SeveralSessions(LookupError):
    """A start of a session id that begins more than one, or that is too short to name one."""


def known_id(n: int | None) -> bool:
    """Could `n` be a stored row's id? Ids from a URL can be any size."""
    return n is not None and 0 < n <= MAX_ID


def iso(t: float | None) -> str | None:
    if t is None:
        return None
    return datetime.fromtimestamp(t, timezone.utc).isoformat(timespec="milliseconds").replace("+00:00", "Z")


def shown_time(iso_time: str | None) -> str:
    """An `iso()` time as people read it, in the inspector and the CLI alike:
    `2026-12-02 05:05:59.897` (UTC)."""
    return iso_time.replace("T", " ").removesuffix("Z") if iso_time else ""


class Reader:
    def __init__(self, engine: Engine, *, cache_blobs: bool = False):
        """cache_blobs: read each blob once for this Reader's life. For one-shot readers of
        whole sessions (replay, export), where every request repeats the messages before
        it; never for the server's long-lived reader. Cached values are shared: read them,
        do not change them."""
        self.engine = engine
        self._blobs: dict[str, Any] | None = {} if cache_blobs else None

    def close(self) -> None:
        self.engine.dispose()

    # -- sessions --------------------------------------------------------------------

    def sessions(self, limit: int = 100, offset: int = 0) -> list[dict]:
        with DB(self.engine) as db:
            rows = db.exec(
                select(Session).order_by(Session.last_at.desc(), Session.id).offset(offset).limit(limit)
            ).all()
            return [session_json(s) for s in rows]

    def full_session_id(self, given: str) -> str:
        """`given`, or the one stored session id it begins, as git takes a commit's prefix
        (4 characters or more, in their case); LookupError saying why not."""
        with DB(self.engine) as db:
            if db.get(Session, given) is not None:
                return given
            found = db.exec(select(Session.id).where(func.substr(Session.id, 1, len(given)) == given)
                            .order_by(Session.id).limit(4)).all() if given else []
        if found and len(given) < PREFIX_MIN:
            raise SeveralSessions(f"{given!r} is too short to name a session: give {PREFIX_MIN} characters or "
                                  "more of its id")
        if len(found) == 1:
            return found[0]
        if found:
            shown = ", ".join(found[:3]) + (", ..." if len(found) > 3 else "")
            raise SeveralSessions(f"{given!r} begins more than one session ({shown}): give more of the id")
        raise LookupError(f"no session {given!r} in this database")

    def session(self, session_id: str) -> dict | None:
        with DB(self.engine) as db:
            s = db.get(Session, session_id)
            if s is None:
                return None
            turns = db.exec(select(Turn).where(Turn.session_id == session_id).order_by(Turn.id)).all()
            names = self._call_names(db, [t.id for t in turns])
            return {**session_json(s), "turns": [turn_summary(t, names.get(t.id, [])) for t in turns]}

    # -- turns -----------------------------------------------------------------------

    def turns(self, limit: int = 50, before: int | None = None) -> list[dict]:
        with DB(self.engine) as db:
            q = select(Turn).order_by(Turn.id.desc()).limit(limit)
            if before is not None:
                q = q.where(Turn.id < before)
            turns = db.exec(q).all()
            names = self._call_names(db, [t.id for t in turns])
            return [turn_summary(t, names.get(t.id, [])) for t in turns]

    def turn_id_by_uid(self, uid: str) -> int | None:
        with DB(self.engine) as db:
            return db.exec(select(Turn.id).where(Turn.uid == uid)).first()

    def turn(self, turn_id: int) -> dict | None:
        if not known_id(turn_id):
            return None
        with DB(self.engine) as db:
            t = db.get(Turn, turn_id)
            if t is None:
                return None
            request, encoding = self.request_as_sent(db, t)
            calls = db.exec(
                select(ToolCallRow).where(ToolCallRow.turn_id == turn_id).order_by(ToolCallRow.index)
            ).all()
            links = mcp_links(db, t)
            return {
                **turn_summary(t, [c.name for c in calls]),
                "request": request,
                "request_encoding": encoding,
                "response": content.unpack(t.response),
                "raw_sha256": t.raw_sha256,
                "raw_size": t.raw_size,
                "route": t.route,
                "request_headers": t.request_headers,
                "response_headers": t.response_headers,
                "stream_error": t.stream_error,
                "decoding": t.decoding,
                "tool_calls": [tool_call_json(c, links.get(c.id)) for c in calls]
                + text_calls_json(t.decoding, len(calls)),
            }

    def raw(self, turn_id: int) -> tuple[bytes, str | None, str | None] | None:
        """The exact response bytes, their content type and encoding."""
        if not known_id(turn_id):
            return None
        with DB(self.engine) as db:
            t = db.get(Turn, turn_id)
            if t is None:
                return None
            return content.inflate(t.raw), t.content_type, t.content_encoding

    def timeline(self, turn_id: int) -> list | None:
        if not known_id(turn_id):
            return None
        with DB(self.engine) as db:
            t = db.get(Turn, turn_id)
            return None if t is None else (content.unpack(t.timeline) or [])

    def request(self, db: DB, t: Turn) -> Any:
        return rebuild_request(db, t, lambda h: self.blob(db, h))

    def request_as_sent(self, db: DB, t: Turn) -> tuple[Any, str | None]:
        """The request body and how the API writes it: "json" (the body as sent, rebuilt),
        "text" (a body kept as sent: not JSON, or JSON no database can hold), "base64"
        (bytes that are not UTF-8: binary, compressed), None (no body)."""
        if t.request_raw is None:
            body = self.request(db, t)
            return body, None if body is None else "json"
        data = content.inflate(t.request_raw)
        try:
            return data.decode("utf-8"), "text"
        except UnicodeDecodeError:
            return base64.b64encode(data).decode("ascii"), "base64"

    def blob(self, db: DB, h: str) -> Any:
        if self._blobs is not None and h in self._blobs:
            return self._blobs[h]
        row = db.get(Blob, h)
        value = None if row is None else content.unpack(row.data)
        if self._blobs is not None:
            self._blobs[h] = value
        return value

    def tools_of(self, turn_id: int) -> list | None:
        if not known_id(turn_id):
            return None
        with DB(self.engine) as db:
            t = db.get(Turn, turn_id)
            return None if t is None or t.tools_hash is None else self.blob(db, t.tools_hash)

    def latest_tools_of_session(self, session_id: str) -> list | None:
        with DB(self.engine) as db:
            h = db.exec(
                select(Turn.tools_hash).where(Turn.session_id == session_id, Turn.tools_hash.is_not(None))
                .order_by(Turn.id.desc()).limit(1)
            ).first()
            return None if h is None else self.blob(db, h)

    def tool_sets(self) -> list[dict]:
        """Each distinct tools array per session, with where it was first seen."""
        with DB(self.engine) as db:
            rows = db.exec(
                select(Turn.session_id, Turn.tools_hash, func.min(Turn.id), func.min(Turn.started_at),
                       func.max(Turn.api), func.max(Turn.model))
                .where(Turn.tools_hash.is_not(None))
                .group_by(Turn.session_id, Turn.tools_hash)
                .order_by(func.min(Turn.id))
            ).all()
            out = []
            for session_id, tools_hash, turn_id, seen_at, api, model in rows:
                tools = self.blob(db, tools_hash)
                out.append({"session_id": session_id, "turn_id": turn_id, "api": api, "model": model,
                            "tools_hash": tools_hash, "tool_count": len(tools or []), "seen_at": iso(seen_at)})
            return out

    @staticmethod
    def _call_names(db: DB, turn_ids: list[int]) -> dict[int, list[str]]:
        names: dict[int, list[str]] = {}
        if turn_ids:
            for turn_id, name in db.exec(
                select(ToolCallRow.turn_id, ToolCallRow.name)
                .where(ToolCallRow.turn_id.in_(turn_ids)).order_by(ToolCallRow.turn_id, ToolCallRow.index)
            ):
                names.setdefault(turn_id, []).append(name)
        return names


def request_bytes(turn: dict) -> bytes:
    """The request body of a turn as the API serves it (`request`, `request_encoding`),
    back to the bytes that were sent (JSON bodies re-serialized)."""
    body, encoding = turn.get("request"), turn.get("request_encoding")
    if body is None:
        return b""
    if encoding == "base64":
        return base64.b64decode(body)
    if isinstance(body, str):
        return body.encode("utf-8")
    return json.dumps(body, ensure_ascii=False).encode("utf-8")


def rebuild_request(db: DB, t: Turn, blob: Callable[[str], Any]) -> Any:
    """The request body as sent: its skeleton, with messages (walked up the chain),
    tools and system prompt put back from their blobs."""
    if t.request_raw is not None:
        return content.inflate(t.request_raw).decode("utf-8", "replace")
    body = dict(t.request_skeleton) if isinstance(t.request_skeleton, dict) else t.request_skeleton
    api = apis.by_name(t.api)
    if not isinstance(body, dict) or api is None:
        return body
    given = body.get(api.keys.messages, 0)
    if given is not None and api.short_input(given) is None and not api.continues(body):
        return body  # not a conversation: stored whole
    if given is None:  # the messages walked up the chain (a short form, or what a request
        # continuing an earlier answer sent, stays in the skeleton as sent)
        body[api.keys.messages] = [] if t.chain_hash is None else [
            blob(r[0]) for r in db.exec(CHAIN_QUERY, params={"h": t.chain_hash})]
    if t.system_hash is not None:
        if api.keys.system:
            body[api.keys.system] = blob(t.system_hash)
        else:  # OpenAI Chat: the leading system messages (none if a damaged store lost them)
            body[api.keys.messages] = (blob(t.system_hash) or []) + body[api.keys.messages]
    if t.tools_hash is not None:
        body[api.keys.tools] = blob(t.tools_hash)
    return body


def session_json(s: Session) -> dict:
    return {
        "id": s.id, "title": s.title, "agent": s.agent,
        "started_at": iso(s.started_at), "last_at": iso(s.last_at),
        "turns": s.turns, "tool_calls": s.tool_calls, "models": s.models,
        "input_tokens": s.input_tokens, "output_tokens": s.output_tokens, "errors": s.errors,
    }


def turn_summary(t: Turn, call_names: list[str]) -> dict:
    return {
        "id": t.id, "session_id": t.session_id, "parent_id": t.parent_id, "api": t.api,
        "method": t.method, "path": t.path, "upstream": t.upstream, "model": t.model,
        "http_status": t.http_status, "status": t.status, "stream": t.stream,
        "started_at": iso(t.started_at), "ttft_ms": rounded_ms(t.ttft_ms), "duration_ms": rounded_ms(t.duration_ms),
        "usage": t.usage, "error": t.error, "tool_call_names": call_names,
    }


def tool_call_json(c: ToolCallRow, mcp: dict | None = None) -> dict:
    return {
        "id": c.call_id, "index": c.index, "name": c.name, "choice": c.choice, "source": c.source,
        "decoded": c.decoded, "arguments": c.arguments, "arguments_raw": c.arguments_raw,
        "arguments_error": c.arguments_error, "task_progress": c.task_progress,
        "result": c.result, "violations": c.violations or [],
        "mcp": mcp,  # the MCP request and result this call became (proxy/mcp/correlate.py), or None
    }


def mcp_links(db: DB, t: Turn) -> dict[int, dict]:
    """The MCP exchange behind each of the turn's tool calls, by tool_calls.id."""
    from ..mcp.correlate import links_for_turn

    return links_for_turn(db, t)


def text_calls_json(decoding: Any, first_index: int) -> list[dict]:
    """Tool calls a model wrote as XML in its text (no native tool calling), found by
    the agent decoders; listed after the native ones, marked `source: "text"`."""
    calls = (decoding or {}).get("text_tool_calls") or [] if isinstance(decoding, dict) else []
    return [{
        "id": None, "index": first_index + i, "name": c.get("name"), "choice": 0, "source": "text",
        "decoded": c.get("decoded"), "arguments": c.get("arguments"),
        "arguments_raw": json.dumps(c.get("params") or {}, ensure_ascii=False),
        "arguments_error": c.get("arguments_error"), "task_progress": c.get("task_progress"),
        "result": c.get("result"), "violations": c.get("violations") or [], "partial": c.get("partial", False),
    } for i, c in enumerate(calls)]


def rounded_ms(v: float | None) -> float | None:
    return None if v is None else round(v, 3)


def json_bytes(value: Any) -> bytes:
    """`value` as JSON any client can read, whatever was captured: NaN and Infinity (a
    model may write them in tool arguments) as null, integers beyond 64 bits exactly,
    lone surrogates as `\\ud800` escapes."""
    try:
        return orjson.dumps(value)  # writes NaN and Infinity as null
    except TypeError:  # integers beyond 64 bits, lone surrogates
        return json.dumps(_finite(value), separators=(",", ":")).encode()


def _finite(value: Any) -> Any:
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, dict):
        return {k: _finite(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_finite(v) for v in value]
    return value


# -- module-level helpers for the CLI (one engine per database URL) ----------------------

@lru_cache(maxsize=4)
def _reader(db_url: str) -> Reader:
    from .db import open_database

    return Reader(open_database(db_url, create=False))  # a read never creates a database


def turn_tools(db_url: str, turn_id: int) -> list[dict] | None:
    return _reader(db_url).tools_of(turn_id)


def session_tools(db_url: str, session_id: str) -> list[dict] | None:
    """The newest tools array of a session, named whole or by its start (SeveralSessions when
    that start begins several, or is too short)."""
    reader = _reader(db_url)
    try:
        session_id = reader.full_session_id(session_id)
    except SeveralSessions:
        raise
    except LookupError:
        return None
    return reader.latest_tools_of_session(session_id)


def tool_sets(db_url: str) -> list[dict]:
    return _reader(db_url).tool_sets()
