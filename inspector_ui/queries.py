"""The inspector's own queries: the sessions list (filters, search, keyset pages) and
the per-session tools view. Read-only; the read API's Reader stays as it is.

Pages are keyset-paginated on (last_at DESC, id): the next page starts strictly after the
last row shown, so page 400 of 10,000 sessions costs what page 1 does (an index range
scan on sessions.last_at), where OFFSET would walk every row before it.
"""

from __future__ import annotations

import json
import time
from collections import OrderedDict
from dataclasses import dataclass, field
from datetime import datetime, timezone
from typing import Any

from sqlalchemy import and_, exists, func, not_, or_
from sqlmodel import Session as DB, select

from proxy.schemas.names import mcp_identity
from proxy.store import content
from proxy.store.models import Blob, ChainNode, Session, ToolCallRow, Turn
from proxy.store.read import Reader, session_json

PAGE_SIZE = 50
# Message text lives zlib-compressed in blobs, so searching it means inflating them. Blobs
# are content-addressed (never change), so their text is cached; a search inflates at most
# this many new ones and says so when it stopped early.
SCAN_BUDGET = 20_000
_TEXT_CACHE_MAX = 50_000


@dataclass
class Filters:
    q: str = ""
    model: str = ""
    tool: str = ""
    server: str = ""
    status: str = ""  # "" | "ok" | "errors"
    since: str = ""  # YYYY-MM-DD, inclusive, UTC
    until: str = ""  # YYYY-MM-DD, inclusive, UTC

    def active(self) -> bool:
        return any(vars(self).values())

    def as_query(self) -> dict[str, str]:
        return {k: v for k, v in vars(self).items() if v}


@dataclass
class Page:
    sessions: list[dict]
    next_cursor: str | None
    search_note: str | None = None
    matched_by: dict[str, list[str]] = field(default_factory=dict)  # session id -> where q matched


def encode_cursor(last_at: float, session_id: str) -> str:
    return f"{last_at!r}~{session_id}"


def decode_cursor(cursor: str) -> tuple[float, str] | None:
    at, sep, sid = (cursor or "").partition("~")
    try:
        return (float(at), sid) if sep else None
    except ValueError:
        return None


def _day(value: str, end: bool = False) -> float | None:
    try:
        d = datetime.strptime(value, "%Y-%m-%d").replace(tzinfo=timezone.utc)
    except ValueError:
        return None
    return d.timestamp() + (86400 if end else 0)


def _like(text: str) -> str:
    return "%" + text.replace("\\", "\\\\").replace("%", "\\%").replace("_", "\\_") + "%"


def _json_like(text: str) -> str:
    """The pattern as it appears inside stored JSON text (non-ASCII escaped as \\uXXXX)."""
    return _like(json.dumps(text)[1:-1])


class Queries:
    def __init__(self, reader: Reader):
        self.reader = reader
        self.engine = reader.engine
        self._texts: OrderedDict[str, str] = OrderedDict()

    # -- sessions list -------------------------------------------------------------------

    def sessions_page(self, f: Filters, cursor: str | None = None, limit: int = PAGE_SIZE) -> Page:
        with DB(self.engine) as db:
            note, matched, ids = None, {}, None
            if f.q:
                ids, note, matched = self._search_ids(db, f.q)
            rows = db.exec(self.page_statement(f, cursor, limit + 1, ids)).all()
            more = len(rows) > limit
            rows = rows[:limit]
            nxt = encode_cursor(rows[-1].last_at, rows[-1].id) if more and rows else None
            last = self._last_status(db, [s.id for s in rows])
            return Page([{**session_json(s), "last_status": last.get(s.id)} for s in rows], nxt, note,
                        {s.id: matched[s.id] for s in rows if s.id in matched})

    def page_statement(self, f: Filters, cursor: str | None, limit: int, ids: list[str] | None = None):
        q = select(Session)
        for cond in self._conditions(f):
            q = q.where(cond)
        if ids is not None:
            q = q.where(Session.id.in_(ids) if ids else False)
        after = decode_cursor(cursor) if cursor else None
        if after:
            at, sid = after
            # last_at <= at keeps an index range scan; the NOT drops the rows already shown.
            q = q.where(Session.last_at <= at, not_(and_(Session.last_at == at, Session.id <= sid)))
        return q.order_by(Session.last_at.desc(), Session.id).limit(limit)

    def _conditions(self, f: Filters) -> list:
        out = []
        if f.model:
            out.append(func.cast(Session.models, _text_type()).like(_json_like(f.model), escape="\\"))
        if f.status == "errors":
            out.append(Session.errors > 0)
        elif f.status == "ok":
            out.append(Session.errors == 0)
        if f.since and (t := _day(f.since)) is not None:
            out.append(Session.last_at >= t)
        if f.until and (t := _day(f.until, end=True)) is not None:
            out.append(Session.started_at < t)
        if f.tool or f.server:
            call = select(ToolCallRow.id).join(Turn, Turn.id == ToolCallRow.turn_id).where(
                Turn.session_id == Session.id)
            if f.tool:
                call = call.where(or_(ToolCallRow.name == f.tool,
                                      ToolCallRow.decoded["tool"].as_string() == f.tool))
            if f.server:
                call = call.where(ToolCallRow.decoded["server"].as_string() == f.server)
            out.append(exists(call))
        return out

    def _search_ids(self, db: DB, needle: str) -> tuple[list[str], str | None, dict[str, list[str]]]:
        """Sessions whose title, tool arguments, tool results or messages contain `needle`."""
        matched: dict[str, list[str]] = {}

        def hit(sid: str, where: str) -> None:
            places = matched.setdefault(sid, [])
            if where not in places:
                places.append(where)

        plain, esc = _like(needle), _json_like(needle)
        for sid in db.exec(select(Session.id).where(Session.title.like(plain, escape="\\"))):
            hit(sid, "title")
        args = select(Turn.session_id).join(ToolCallRow, ToolCallRow.turn_id == Turn.id).where(
            or_(ToolCallRow.arguments_raw.like(plain, escape="\\"),
                ToolCallRow.arguments_raw.like(esc, escape="\\"))).distinct()
        for sid in db.exec(args):
            hit(sid, "tool arguments")
        res = select(Turn.session_id).join(ToolCallRow, ToolCallRow.turn_id == Turn.id).where(
            func.cast(ToolCallRow.result, _text_type()).like(esc, escape="\\")).distinct()
        for sid in db.exec(res):
            hit(sid, "tool results")
        note = self._search_messages(db, needle.casefold(), hit)
        return list(matched), note, matched

    def _search_messages(self, db: DB, needle: str, hit) -> str | None:
        # Newest sessions first, so a budget cut drops the oldest.
        rows = db.exec(
            select(ChainNode.session_id, ChainNode.message_hash)
            .join(Session, Session.id == ChainNode.session_id)
            .order_by(Session.last_at.desc())
        )
        inflated = 0
        started = time.monotonic()
        for sid, h in rows:
            text = self._texts.get(h)
            if text is None:
                if inflated >= SCAN_BUDGET:
                    return (f"message search stopped after {SCAN_BUDGET} new messages "
                            f"({time.monotonic() - started:.1f} s); older sessions matched on titles "
                            "and tool calls only")
                blob = db.get(Blob, h)
                raw = "" if blob is None else content.inflate(blob.data).decode("utf-8", "replace")
                text = _unescape_json_text(raw).casefold()
                self._remember(h, text)
                inflated += 1
            if needle in text:
                hit(sid, "messages")
        return None

    def _remember(self, h: str, text: str) -> None:
        self._texts[h] = text
        if len(self._texts) > _TEXT_CACHE_MAX:
            self._texts.popitem(last=False)

    # -- facets for the filter form ------------------------------------------------------

    def facets(self) -> dict[str, list[str]]:
        with DB(self.engine) as db:
            models = [m for m in db.exec(select(Turn.model).where(Turn.model.is_not(None)).distinct())]
            servers = sorted({s for s in db.exec(
                select(ToolCallRow.decoded["server"].as_string()).distinct()) if s})
            tools = sorted({t for t in db.exec(
                select(ToolCallRow.decoded["tool"].as_string()).distinct()) if t})
        return {"models": sorted(models), "servers": servers, "tools": tools}

    def session_summary(self, session_id: str) -> dict | None:
        """One row of the sessions list (no turns)."""
        with DB(self.engine) as db:
            s = db.get(Session, session_id)
            return None if s is None else {**session_json(s), "last_status": self._last_status(db, [s.id]).get(s.id)}

    @staticmethod
    def _last_status(db: DB, session_ids: list[str]) -> dict[str, str]:
        """The status of each session's newest turn: is it working now, or failing?"""
        if not session_ids:
            return {}
        newest = select(func.max(Turn.id)).where(Turn.session_id.in_(session_ids)).group_by(Turn.session_id)
        return dict(db.exec(select(Turn.session_id, Turn.status).where(Turn.id.in_(newest))).all())

    def session_count(self) -> int:
        with DB(self.engine) as db:
            return db.exec(select(func.count()).select_from(Session)).one()

    # -- tools view ----------------------------------------------------------------------

    def session_tools(self, session_id: str) -> list[dict] | None:
        """Every tool offered in a session: its schema and description (newest), the turns
        that offered it, how often it was called, and the violations of its calls."""
        with DB(self.engine) as db:
            turns = db.exec(select(Turn).where(Turn.session_id == session_id).order_by(Turn.id)).all()
            if not turns:
                return None
            by_name: dict[str, dict[str, Any]] = {}
            for t in turns:
                if t.tools_hash is None:
                    continue
                offered = [p for spec in self.reader.blob(db, t.tools_hash) or [] for p in _tool_parts(spec)]
                for name, desc, schema in offered:
                    entry = by_name.setdefault(name, {"name": name, "offered_in": [], "calls": 0,
                                                      "violations": [], "decoded": None, "call_turns": []})
                    entry.update(description=desc, schema=schema)
                    entry["offered_in"].append(t.id)
            ids = [t.id for t in turns]
            for c in db.exec(select(ToolCallRow).where(ToolCallRow.turn_id.in_(ids))
                             .order_by(ToolCallRow.turn_id, ToolCallRow.index)):
                entry = by_name.setdefault(c.name, {"name": c.name, "offered_in": [], "calls": 0,
                                                    "violations": [], "decoded": None, "call_turns": [],
                                                    "description": None, "schema": None, "not_offered": True})
                entry["calls"] += 1
                entry["decoded"] = entry["decoded"] or c.decoded
                entry["call_turns"].append(c.turn_id)
                for v in c.violations or []:
                    entry["violations"].append({**v, "turn_id": c.turn_id})
        for entry in by_name.values():  # tools never called: decode the name from what was offered
            if entry["decoded"] is None and (found := mcp_identity(entry["name"], entry.get("description"))):
                entry["decoded"] = {"kind": "mcp", "server": found[0] or None, "tool": found[1]}
        return sorted(by_name.values(), key=lambda e: (-e["calls"], e["name"]))


def _tool_parts(spec: Any) -> list[tuple[str, str | None, Any]]:
    """(name, description, parameter schema) of each tool in one entry of a tools array,
    whatever the API (a Gemini entry groups several declarations)."""
    if not isinstance(spec, dict):
        return []
    if isinstance(spec.get("function"), dict):  # OpenAI chat
        fn = spec["function"]
        found = [(fn.get("name"), fn.get("description"), fn.get("parameters"))]
    elif "input_schema" in spec:  # Anthropic
        found = [(spec.get("name"), spec.get("description"), spec.get("input_schema"))]
    elif "functionDeclarations" in spec or "function_declarations" in spec:  # Gemini
        decls = spec.get("functionDeclarations") or spec.get("function_declarations") or []
        found = [(d.get("name"), d.get("description"), d.get("parameters", d.get("parametersJsonSchema")))
                 for d in decls if isinstance(d, dict)]
    else:  # OpenAI Responses, MCP
        found = [(spec.get("name"), spec.get("description"), spec.get("parameters", spec.get("inputSchema")))]
    return [(n, d, s) for n, d, s in found if isinstance(n, str)]


def _unescape_json_text(text: str) -> str:
    """Stored message JSON is compact with ensure_ascii off, so only quotes, backslashes
    and control characters are escaped; undo those so a search for a line of code hits."""
    return text.replace("\\n", "\n").replace("\\t", "\t").replace('\\"', '"').replace("\\\\", "\\")


def _text_type():
    from sqlalchemy import Text
    return Text()
