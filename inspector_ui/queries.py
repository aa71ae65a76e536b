"""The inspector's own queries: the sessions list (filters, search, keyset pages) and
the per-session tools view. Read-only; the read API's Reader stays as it is.

Pages are keyset-paginated on (last_at DESC, id): the next page starts strictly after the
last row shown, so page 400 of 10,000 sessions costs what page 1 does (an index range
scan on sessions.last_at), where OFFSET would walk every row before it.
"""

from __future__ import annotations

import json
import logging
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from datetime import datetime, timezone
from types import SimpleNamespace
from typing import Any

from sqlalchemy import and_, bindparam, exists, func, not_, or_, text
from sqlmodel import Session as DB, select

from proxy.agents.registry import decode_name
from proxy.store import search
from proxy.store.models import Session, ToolCallRow, Turn
from proxy.store.read import Reader, session_json

log = logging.getLogger("tooltap")

PAGE_SIZE = 50
WALK_BATCH_MAX = 3200  # sessions looked at by one batch of a walk
HITS_MAX = 20_000  # sessions a search finds index-first, at most
FACETS_SECONDS = 30.0


TURN_STATUSES = ("ok", "upstream_error", "upstream_aborted", "client_aborted", "proxy_error")
STATUS_FILTERS = ("ok", "errors", *TURN_STATUSES[1:])


@dataclass
class Filters:
    q: str = ""
    model: str = ""
    tool: str = ""
    server: str = ""
    status: str = ""  # "" | "ok" (no errors) | "errors" | a turn status (a turn of it)
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
    search_note: str | None = None  # a filter that could not be applied, and why
    matched_by: dict[str, list[str]] = field(default_factory=dict)  # session id -> where q matched


@dataclass
class _Found:
    """A search: per place, SQL saying whether the session `sessions.id` matched there,
    with its parameters; either a condition on `sessions` selecting every match
    (`condition`, with where the index found each: `hits`), or `common`: so many match
    that the sessions are walked instead."""

    where: dict[str, str]
    params: dict[str, Any]
    condition: Any = None
    floors: dict[str, str] = field(default_factory=dict)  # parameters worked out per batch (search.Places)
    hits: dict[str, list[str]] = field(default_factory=dict)  # session id -> places, when found index-first

    @property
    def common(self) -> bool:
        return self.condition is None


_pool: ThreadPoolExecutor | None = None


def _places_pool() -> ThreadPoolExecutor:
    global _pool
    if _pool is None:
        _pool = ThreadPoolExecutor(max_workers=len(search.PLACES), thread_name_prefix="tooltap-search")
    return _pool


def encode_cursor(last_at: float, session_id: str) -> str:
    return f"{last_at!r}~{session_id}"


def decode_cursor(cursor: str) -> tuple[float, str] | None:
    at, sep, sid = (cursor or "").partition("~")
    try:
        return (float(at), sid) if sep else None
    except ValueError:
        return None


def day(value: str, end: bool = False) -> float | None:
    """The start (or `end`) of a YYYY-MM-DD day as a timestamp, None when there is no such day."""
    try:
        d = datetime.strptime(value, "%Y-%m-%d").replace(tzinfo=timezone.utc)
    except ValueError:
        return None
    return d.timestamp() + (86400 if end else 0)


def _like(text: str) -> str:
    return "%" + text.replace("\\", "\\\\").replace("%", "\\%").replace("_", "\\_") + "%"


def _json_strings(text: str) -> set[str]:
    """The JSON string `text`, quotes and all, as stored JSON text holds it: non-ASCII as
    it is (orjson, the writer's) or escaped as \\uXXXX (json.dumps, older rows)."""
    return {json.dumps(text, ensure_ascii=escaped) for escaped in (False, True)}


class Queries:
    def __init__(self, reader: Reader):
        self.reader = reader
        self.engine = reader.engine
        self._facets: tuple[float, dict[str, list[str]]] | None = None
        self._refreshing = threading.Lock()

    # -- sessions list -------------------------------------------------------------------

    def sessions_page(self, f: Filters, cursor: str | None = None, limit: int = PAGE_SIZE) -> Page:
        with DB(self.engine) as db:
            found = self._search(db, f.q) if f.q else None
            if found and found.common:
                rows, matched = self._walk(db, f, cursor, limit, found)
            else:
                rows = db.exec(self.page_statement(f, cursor, limit + 1, found.condition if found else None)).all()
                matched = self._matched_by(db, found, [s.id for s in rows[:limit]]) if found else {}
            more = len(rows) > limit
            rows = rows[:limit]
            nxt = encode_cursor(rows[-1].last_at, rows[-1].id) if more and rows else None
            last = self._last_status(db, [s.id for s in rows])
            notes = []
            if f.status and f.status not in STATUS_FILTERS:
                notes.append(f"no status {f.status!r} (not applied): use {', '.join(STATUS_FILTERS)}")
            for name, value in (("since", f.since), ("until", f.until)):
                if value and day(value) is None:  # _conditions leaves it out
                    notes.append(f"no date {name}={value!r} (not applied): use YYYY-MM-DD, such as 2026-01-31")
            note = "; ".join(notes) or None
            return Page([{**session_json(s), "last_status": last.get(s.id)} for s in rows], nxt, note, matched)

    def page_statement(self, f: Filters, cursor: str | None, limit: int, found=None):
        """`found`: the condition a search puts on sessions (None: no search)."""
        q = select(Session)
        for cond in self._conditions(f):
            q = q.where(cond)
        if found is not None:
            q = q.where(found)
        after = decode_cursor(cursor) if cursor else None
        if after:
            at, sid = after
            # last_at <= at keeps an index range scan; the NOT drops the rows already shown.
            q = q.where(Session.last_at <= at, not_(and_(Session.last_at == at, Session.id <= sid)))
        return q.order_by(Session.last_at.desc(), Session.id).limit(limit)

    def _conditions(self, f: Filters) -> list:
        out = []
        if f.model:
            # Found as a substring, case and all (SQLite's LIKE ignores ASCII case, Postgres's not).
            models = func.cast(Session.models, _text_type())
            find = func.instr if self.engine.dialect.name == "sqlite" else func.strpos
            out.append(or_(*(find(models, s) > 0 for s in _json_strings(f.model))))
        if f.status == "errors":
            out.append(Session.errors > 0)
        elif f.status == "ok":
            out.append(Session.errors == 0)
        elif f.status in TURN_STATUSES:  # a session with a turn of that status
            out.append(exists(select(Turn.id).where(Turn.session_id == Session.id, Turn.status == f.status)))
        if f.since and (t := day(f.since)) is not None:
            out.append(Session.last_at >= t)
        if f.until and (t := day(f.until, end=True)) is not None:
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

    def _search(self, db: DB, needle: str) -> "_Found":
        """Sessions whose title holds every term of `needle` (substrings), or whose
        messages, tool arguments or tool results hold its words (the full-text index,
        proxy/store/search.py)."""
        terms = search.query_terms(needle)
        found = search.places(db.connection(), self.engine.dialect.name, terms)
        words = terms or [needle]
        likes = {f"like{i}": _like(w.lower()) for i, w in enumerate(words)}
        # SQLite's LIKE ignores ASCII case, as its lower() folds ASCII only: the same
        # answer, without lowering 20,000 titles first. Postgres' LIKE minds case.
        title_expr = "title" if self.engine.dialect.name == "sqlite" else "lower(title)"
        title = " AND ".join(f"{title_expr} LIKE :like{i} ESCAPE '\\'" for i in range(len(words)))
        if not found.common:  # few match: each place's matches read once, with the sessions they are in
            hits = self._hits(db, found)
            if hits is not None:
                condition = or_(text(f"({title})").bindparams(**likes), Session.id.in_(list(hits)))
                return _Found({"title": title}, {**found.params, **likes}, condition=condition, hits=hits)
        # most sessions match: each session of a batch is looked up in the index
        search.prepare_walk(db.connection(), self.engine.dialect.name, found)
        return _Found({"title": title, **found.exists}, {**found.params, **likes}, floors=found.floors)

    def _hits(self, db: DB, found: search.Places) -> dict[str, list[str]] | None:
        """Session id -> the places it matched in; None when so many sessions match
        that walking them is better (the planner's estimate was too low). On Postgres
        the places are looked up at once, each an index scan in a backend of its own
        on a connection of its own (20 and 31 ms for a path's tool arguments and
        messages at a million turns). SQLite read its matches already (search.places):
        what is left is quick, and stays on this connection."""
        def sessions_of(place: str, conn) -> list[str]:
            params = {**found.params, **found.place_params.get(place, {})}
            return list(conn.execute(text(f"SELECT DISTINCT session_id FROM ({found.matches[place]}) AS m"),
                                     params).scalars())

        def own_connection(place: str) -> list[str]:
            with self.engine.connect() as conn:
                return sessions_of(place, conn)

        if self.engine.dialect.name == "postgresql":
            found_in = _places_pool().map(own_connection, found.matches)
        else:
            found_in = (sessions_of(place, db.connection()) for place in found.matches)
        hits: dict[str, list[str]] = {}
        for place, sids in zip(found.matches, found_in):
            for sid in sids:
                hits.setdefault(sid, []).append(place)
        return None if len(hits) > HITS_MAX else hits

    def _walk(self, db: DB, f: Filters, cursor: str | None, limit: int, found: "_Found") -> tuple[list, dict]:
        """A page of a search that matches most sessions: the sessions the filters let
        through, newest first, in batches sized by how many have matched so far, with where each
        matched, until limit + 1 have matched or none are left."""
        page: list = []
        matched: dict[str, list[str]] = {}
        batch, walked = limit + 1, 0
        while True:
            rows = db.exec(self.page_statement(f, cursor, batch)).all()
            hits = self._matched_by(db, found, [s.id for s in rows])
            page += [s for s in rows if s.id in hits]
            matched.update(hits)
            walked += len(rows)
            if len(page) > limit or len(rows) < batch:
                page = page[:limit + 1]
                return page, {s.id: matched[s.id] for s in page[:limit]}
            cursor = encode_cursor(rows[-1].last_at, rows[-1].id)
            # Enough for what is missing at the rate they have matched so far, with a margin.
            rate = max(len(page), 1) / walked
            batch = max(8, min(WALK_BATCH_MAX, int((limit + 1 - len(page)) / rate * 1.25) + 1))

    def _matched_by(self, db: DB, found: "_Found", ids: list[str]) -> dict[str, list[str]]:
        """Where each of these sessions matched: one query per place, for these sessions only."""
        matched: dict[str, list[str]] = {}
        if not ids:
            return matched
        params = {**found.params, "ids": ids}
        for name, sql in found.floors.items():
            params[name] = db.execute(text(sql).bindparams(bindparam("ids", expanding=True)), params).scalar()
        for place, condition in found.where.items():
            query = text(f"SELECT id FROM sessions WHERE id IN :ids AND {condition}").bindparams(
                bindparam("ids", expanding=True))
            for sid in db.execute(query, params).scalars():
                matched.setdefault(sid, []).append(place)
        for sid in ids:
            if sid in found.hits:
                matched.setdefault(sid, []).extend(found.hits[sid])
        return matched

    # -- facets for the filter form ------------------------------------------------------

    def facets(self) -> dict[str, list[str]]:
        """The filter form's choices. Each is a DISTINCT over every turn or tool call
        (seconds at a million turns), so they are worked out at most every FACETS_SECONDS,
        on a thread of their own once the first are known: a page never waits for a
        refresh, and a model or tool seen for the first time joins the lists that much later."""
        now = time.monotonic()
        if self._facets is None:
            self._facets = (now, self._facets_now())
        elif now - self._facets[0] > FACETS_SECONDS and not self._refreshing.locked():
            threading.Thread(target=self._refresh_facets, name="tooltap-facets", daemon=True).start()
        return self._facets[1]

    def _refresh_facets(self) -> None:
        with self._refreshing:
            try:
                self._facets = (time.monotonic(), self._facets_now())
            except Exception as exc:  # the database went away: the old lists stand, tried again later
                self._facets = (time.monotonic(), self._facets[1])
                log.warning("the filter form's choices could not be refreshed: %s", exc)

    def _facets_now(self) -> dict[str, list[str]]:
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
            # An offered name is decoded as the agent decoders decode a called one (the session's
            # agent and resolved MCP uids), so its decoding does not depend on it being called.
            session = db.get(Session, session_id)
            agent = (session.agent if session else None) or "generic"
            view = SimpleNamespace(uids=(session.uids if session else None) or {})
            by_name: dict[str, dict[str, Any]] = {}
            for t in turns:
                if t.tools_hash is None:
                    continue
                offered = [p for spec in self.reader.blob(db, t.tools_hash) or [] for p in _tool_parts(spec)]
                for name, desc, schema in offered:
                    if name not in by_name:
                        by_name[name] = {"name": name, "offered_in": [], "calls": 0, "violations": [],
                                         "call_turns": [], "decoded": _mcp_only(decode_name(name, view, agent))}
                    entry = by_name[name]
                    entry.update(description=desc, schema=schema)
                    entry["offered_in"].append(t.id)
            ids = [t.id for t in turns]
            for c in db.exec(select(ToolCallRow).where(ToolCallRow.turn_id.in_(ids))
                             .order_by(ToolCallRow.turn_id, ToolCallRow.index)):
                if c.name not in by_name:
                    by_name[c.name] = {"name": c.name, "offered_in": [], "calls": 0, "violations": [],
                                       "call_turns": [], "decoded": _mcp_only(c.decoded), "description": None,
                                       "schema": None, "not_offered": True}
                entry = by_name[c.name]
                entry["calls"] += 1
                entry["call_turns"].append(c.turn_id)
                for v in c.violations or []:
                    entry["violations"].append({**v, "turn_id": c.turn_id})
        return sorted(by_name.values(), key=lambda e: (-e["calls"], e["name"]))


def _mcp_only(decoded: dict | None) -> dict | None:
    """A decoding worth showing: an MCP tool's server and tool (a built-in's is its name again)."""
    return decoded if isinstance(decoded, dict) and decoded.get("kind") == "mcp" else None


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


def _text_type():
    from sqlalchemy import Text
    return Text()
