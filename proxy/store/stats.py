"""`tooltap stats`: how much the store holds and how fast it grows (UTC days)."""

from __future__ import annotations

import time
from dataclasses import asdict, dataclass, field
from datetime import datetime, timezone

from sqlalchemy import text
from sqlalchemy.engine import Engine

from .db import sqlite_path
from .read import iso

DAY = 86400
# What a turn stores in its own row (blobs are shared between turns, so not counted per day).
TURN_BYTES = ("coalesce(length(raw), 0) + coalesce(length(response), 0)"
              " + coalesce(length(request_raw), 0) + coalesce(length(timeline), 0)")


@dataclass
class Day:
    day: str  # YYYY-MM-DD, UTC
    turns: int = 0
    errors: int = 0  # status other than ok
    wire_bytes: int = 0  # request and response bodies as they crossed
    stored_bytes: int = 0  # the turns' own compressed columns
    mcp_messages: int = 0


@dataclass
class Stats:
    turns: int
    errors: int
    sessions: int
    blobs: int
    blob_bytes: int
    database_bytes: int
    first_at: str | None
    last_at: str | None
    pruned_at: str | None
    mcp_messages: int = 0
    mcp_bytes: int = 0  # as recorded: decoded when the server compressed them (stored compressed)
    mcp_servers: int = 0
    mcp_connections: int = 0
    days: list[Day] = field(default_factory=list)  # oldest first, today last

    def to_json(self) -> dict:
        return asdict(self)


def database_size(engine: Engine) -> int:
    """SQLite: the file's pages in use or free (the WAL apart); Postgres: tooltap's
    tables with their indexes and TOAST, in the schema it uses."""
    with engine.connect() as conn:
        if engine.dialect.name == "sqlite":
            if sqlite_path(str(engine.url)) is None:
                return 0
            pages = conn.exec_driver_sql("PRAGMA page_count").scalar()
            return pages * conn.exec_driver_sql("PRAGMA page_size").scalar()
        return int(conn.execute(text(
            "SELECT coalesce(sum(pg_total_relation_size(c.oid)), 0) FROM pg_class c"
            " JOIN pg_namespace n ON n.oid = c.relnamespace"
            " WHERE c.relkind = 'r' AND n.nspname = current_schema()")).scalar())


def store_stats(engine: Engine, days: int = 7, now: float | None = None) -> Stats:
    """Totals, and per UTC day over the last `days` days (today included)."""
    now = time.time() if now is None else now
    today = int(now // DAY)
    since = (today - days + 1) * DAY

    def day_of(column: str) -> str:  # the UTC day number of a unix-seconds column
        if engine.dialect.name == "sqlite":
            return f"CAST({column} / 86400 AS INTEGER)"
        return f"CAST(floor({column} / 86400) AS BIGINT)"
    with engine.connect() as conn:
        turns, errors, first, last = conn.execute(text(
            "SELECT count(*), coalesce(sum(CASE WHEN status <> 'ok' THEN 1 ELSE 0 END), 0),"
            " min(started_at), max(started_at) FROM turns")).one()
        sessions = conn.execute(text("SELECT count(*) FROM sessions")).scalar()
        blobs, blob_bytes = conn.execute(text("SELECT count(*), coalesce(sum(length(data)), 0) FROM blobs")).one()
        pruned = conn.execute(text("SELECT pruned_at FROM store_epoch WHERE id = 1")).scalar()
        rows = conn.execute(text(
            f"SELECT {day_of('started_at')} AS d, count(*),"
            " coalesce(sum(CASE WHEN status <> 'ok' THEN 1 ELSE 0 END), 0),"
            f" coalesce(sum(request_size + raw_size), 0), coalesce(sum({TURN_BYTES}), 0)"
            " FROM turns WHERE started_at >= :since GROUP BY d"), {"since": since}).all()
        mcp, mcp_bytes, servers = conn.execute(text(
            "SELECT count(*), coalesce(sum(size), 0), count(DISTINCT server) FROM mcp_messages")).one()
        mcp_conns = conn.execute(text("SELECT count(*) FROM mcp_connections")).scalar()
        mcp_days = {int(d): n for d, n in conn.execute(text(
            f"SELECT {day_of('at')} AS d, count(*) FROM mcp_messages WHERE at >= :since GROUP BY d"),
            {"since": since})}
    by_day = {int(d): (n, e, w, s) for d, n, e, w, s in rows}
    out = []
    for d in range(today - days + 1, today + 1):
        n, e, w, s = by_day.get(d, (0, 0, 0, 0))
        label = datetime.fromtimestamp(d * DAY, timezone.utc).strftime("%Y-%m-%d")
        out.append(Day(label, int(n), int(e), int(w), int(s), int(mcp_days.get(d, 0))))
    return Stats(turns=turns, errors=int(errors), sessions=sessions, blobs=blobs, blob_bytes=int(blob_bytes),
                 database_bytes=database_size(engine), first_at=iso(first), last_at=iso(last),
                 pruned_at=iso(pruned), mcp_messages=mcp, mcp_bytes=int(mcp_bytes), mcp_servers=servers,
                 mcp_connections=mcp_conns, days=out)
