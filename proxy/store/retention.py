"""`tooltap prune`: delete the turns older than a cutoff, and what only they used.

A turn owns its tool_calls rows. It shares its session (counts, first and last time),
its chain nodes (the path of its message list: later turns run through the same nodes)
and blobs (messages, system prompts, tools arrays), which turns (system_hash,
tools_hash) and chain nodes (message_hash) name by hash. For each batch of turns:

- their tool calls go; a remaining turn whose parent goes gets parent_id NULL: it now
  starts its branch (the reader and the decoders load a parent by id, and an id that
  names no turn is worse than none);
- a chain node goes when no remaining turn's path runs through it (no remaining turn at
  it, no node below it that stays); a blob goes when no remaining turn or node names it;
- a session left without turns goes, with its replay runs; the others get their counts,
  models, started_at and last_at worked out again from the turns they keep.
MCP traffic older than the cutoff goes too (it is matched to turns when read, by time),
a call whole: its request stays while its answer does (newer, or an error --keep-errors
keeps); and so do connections that ended before it once they hold no message. Tool sets
stay: one row per distinct tools list, small, and what a server offers.

Safe while tooltap runs. Each batch is one short transaction that no writer's batch
overlaps: on SQLite both begin with BEGIN IMMEDIATE (one writer at a time); on Postgres
the prune holds PRUNE_LOCK alone, which every writer's batch holds shared. So a blob the
batch finds unreferenced stays so until it commits: a writer's turn naming it either
committed before (the batch sees it and keeps the blob) or begins after (its upsert
stores the blob again). A writer skips that upsert for the blobs and nodes it remembers
storing, so the batch also raises store_epoch, and a writer that sees it moved forgets
them (ingest.Ingestor.check_epoch). Batches are small, so a writer waits a fraction of a
second, well inside its busy timeout (SQLite) or lock_timeout (Postgres).

Giving the space back. SQLite: a file created by this version has auto_vacuum
INCREMENTAL (db.py), and freed pages go back in steps of VACUUM_STEP pages, each its own
short write transaction, so the writer is never shut out for long. It returns whole
free pages only: pages the prune left half full stay (they fill up again). An older file
is converted once by a full VACUUM, which holds the write lock while it rewrites and
repacks the file (the writer spools meanwhile); vacuum="full" asks for that repacking
any time, "none" for no vacuum. Postgres: plain VACUUM (ANALYZE), which makes the space
reusable without blocking writers (VACUUM FULL would).
"""

from __future__ import annotations

import contextlib
import json
import re
import time
import zlib
from dataclasses import asdict, dataclass, field
from typing import Callable, Iterator

from sqlalchemy import bindparam, text
from sqlalchemy.engine import Connection, Engine

from .db import PRUNE_LOCK
from .ingest import usage_tokens
from .stats import database_size

BATCH = 1000  # turns per transaction: ~0.2-0.4 s of the write lock (writer busy timeout: 2 s)
CHUNK = 500  # hashes per IN list
VACUUM_STEP = 2048  # pages per incremental vacuum step (8 MB at 4 KB pages)
TABLES = ("turns", "tool_calls", "chain_nodes", "blobs", "sessions", "replay_runs", "mcp_messages",
          "mcp_connections")

_UNITS = {"m": 60, "h": 3600, "d": 86400, "w": 7 * 86400}


def parse_duration(value: str) -> float:
    """'90m', '12h', '30d', '2w' -> seconds; ValueError with a message for anything else."""
    m = re.fullmatch(r"\s*(\d+)\s*([mhdw])\s*", value or "")
    if not m or int(m.group(1)) == 0:
        raise ValueError(f"{value!r} is not an age: write a positive whole number and a unit, "
                         "m (minutes), h (hours), d (days) or w (weeks), e.g. 30d")
    return int(m.group(1)) * _UNITS[m.group(2)]


@dataclass
class PruneResult:
    cutoff: float
    keep_errors: bool
    dry_run: bool
    turns: int = 0
    sessions: int = 0  # deleted (left without turns)
    sessions_updated: int = 0  # kept, counts worked out again
    chain_nodes: int = 0
    blobs: int = 0
    blob_bytes: int = 0
    turn_bytes: int = 0  # the turns' own stored bytes (responses, raw bodies, timelines)
    tool_calls: int = 0
    replay_runs: int = 0
    mcp_messages: int = 0
    mcp_connections: int = 0
    size_before: int = 0
    size_after: int = 0
    vacuum: str = "none"  # "incremental", "full" (SQLite), "vacuum" (Postgres), "none"
    seconds: float = 0.0

    @property
    def reclaimed(self) -> int:
        return max(0, self.size_before - self.size_after)

    def to_json(self) -> dict:
        return {**asdict(self), "reclaimed": self.reclaimed}

    def what(self) -> str:
        """`5 turns, 1 session, 6 blobs, 5 chain nodes, 0 MCP messages`: what went, or would
        go, in the same words for a dry run and a real one."""
        counts = ((self.turns, "turn"), (self.sessions, "session"), (self.blobs, "blob"),
                  (self.chain_nodes, "chain node"), (self.mcp_messages, "MCP message"))
        return ", ".join(f"{n} {what}{'' if n == 1 else 's'}" for n, what in counts)


@dataclass
class _Batch:
    """What deleting one set of turns takes with it."""

    turns: int = 0
    turn_bytes: int = 0
    tool_calls: int = 0
    touched: list[str] = field(default_factory=list)  # sessions with turns in the set
    empty: list[str] = field(default_factory=list)  # ...left with none
    nodes: list[str] = field(default_factory=list)
    blobs: dict[str, int] = field(default_factory=dict)  # hash -> bytes


def _doomed(alias: str, keep_errors: bool, upto: bool) -> str:
    """The SQL condition on turns row `alias` for "deleted by this prune (batch)"."""
    cond = f"{alias}.started_at < :cutoff"
    if keep_errors:
        cond += f" AND {alias}.status = 'ok'"
    if upto:  # batches go by id: the oldest-stored first
        cond += f" AND {alias}.id <= :upto"
    return cond


def prune(engine: Engine, older_than: float, *, keep_errors: bool = False, dry_run: bool = False,
          vacuum: str = "auto", batch: int = BATCH, now: float | None = None,
          progress: Callable[[PruneResult, int], None] | None = None) -> PruneResult:
    """Delete turns started more than `older_than` seconds before `now`, and everything
    only they used (see the module's docstring). `progress(result, total)` is called
    after each batch. With dry_run, nothing changes: the result says what would go."""
    started = time.monotonic()
    cutoff = (now or time.time()) - older_than
    res = PruneResult(cutoff=cutoff, keep_errors=keep_errors, dry_run=dry_run, size_before=database_size(engine))
    params = {"cutoff": cutoff}
    if dry_run:
        with engine.connect() as conn:  # one snapshot, all at once
            b = _effects(conn, lambda a: _doomed(a, keep_errors, False), params)
            _add(res, b)
            res.sessions_updated = len(b.touched) - len(b.empty)
            res.replay_runs = _count_in(conn, "replay_runs", "session_id", b.empty)
            res.mcp_messages, res.mcp_connections = _mcp(conn, params, keep_errors, delete=False)
        res.size_after = res.size_before
        res.seconds = time.monotonic() - started
        return res
    with engine.connect() as conn:
        total = conn.execute(text(f"SELECT count(*) FROM turns t WHERE {_doomed('t', keep_errors, False)}"),
                             params).scalar()
    while True:
        with _transaction(engine) as conn:
            upto = conn.execute(text(f"SELECT max(id) FROM (SELECT t.id FROM turns t WHERE "
                                     f"{_doomed('t', keep_errors, False)} ORDER BY t.id LIMIT :n) AS b"),
                                {**params, "n": batch}).scalar()
            if upto is None:
                break
            _delete_batch(conn, res, keep_errors, {**params, "upto": upto})
        if progress:
            progress(res, total)
    with _transaction(engine) as conn:
        res.mcp_messages, res.mcp_connections = _mcp(conn, params, keep_errors, delete=True)
    if vacuum != "none":
        res.vacuum = _reclaim(engine, full=vacuum == "full")
    res.size_after = database_size(engine)
    res.seconds = time.monotonic() - started
    return res


def _add(res: PruneResult, b: _Batch) -> None:
    res.turns += b.turns
    res.turn_bytes += b.turn_bytes
    res.tool_calls += b.tool_calls
    res.sessions += len(b.empty)
    res.chain_nodes += len(b.nodes)
    res.blobs += len(b.blobs)
    res.blob_bytes += sum(b.blobs.values())


def _delete_batch(conn: Connection, res: PruneResult, keep_errors: bool, params: dict) -> None:
    b = _effects(conn, lambda a: _doomed(a, keep_errors, True), params)
    doomed = _doomed("turns", keep_errors, True)
    ids = f"SELECT turns.id FROM turns WHERE {doomed}"
    conn.execute(text(f"DELETE FROM tool_calls WHERE turn_id IN ({ids})"), params)
    conn.execute(text(f"UPDATE turns SET parent_id = NULL WHERE parent_id IN ({ids})"), params)
    conn.execute(text(f"DELETE FROM turns WHERE {doomed}"), params)
    _delete_in(conn, "chain_nodes", "hash", b.nodes)
    _delete_in(conn, "blobs", "hash", list(b.blobs))
    res.replay_runs += _delete_in(conn, "replay_runs", "session_id", b.empty)
    _delete_in(conn, "sessions", "id", b.empty)
    empty = set(b.empty)
    kept = [s for s in b.touched if s not in empty]
    _recount(conn, kept)
    res.sessions_updated += len(kept)
    bump = ", epoch = epoch + 1" if b.nodes or b.blobs else ""
    conn.execute(text(f"UPDATE store_epoch SET pruned_at = :now{bump} WHERE id = 1"), {"now": time.time()})
    _add(res, b)


def _effects(conn: Connection, doomed: Callable[[str], str], params: dict) -> _Batch:
    """What deleting the turns `doomed` selects takes with it (nothing is changed)."""
    b = _Batch()
    b.turns, b.turn_bytes = conn.execute(text(
        "SELECT count(*), coalesce(sum(coalesce(length(t.raw), 0) + coalesce(length(t.response), 0)"
        " + coalesce(length(t.request_raw), 0) + coalesce(length(t.timeline), 0)), 0)"
        f" FROM turns t WHERE {doomed('t')}"), params).one()
    if not b.turns:
        return b
    b.tool_calls = conn.execute(text(
        f"SELECT count(*) FROM tool_calls c WHERE c.turn_id IN (SELECT t.id FROM turns t WHERE {doomed('t')})"),
        params).scalar()
    b.touched = sorted(conn.execute(text(f"SELECT DISTINCT t.session_id FROM turns t WHERE {doomed('t')}"),
                                    params).scalars())
    b.empty = sorted(conn.execute(text(
        f"SELECT DISTINCT t.session_id FROM turns t WHERE {doomed('t')} AND NOT EXISTS"
        f" (SELECT 1 FROM turns r WHERE r.session_id = t.session_id AND NOT ({doomed('r')}))"), params).scalars())
    # The nodes on the doomed turns' paths; one stays if a remaining turn sits on it or a
    # node off these paths hangs below it, and then so do the nodes above it.
    rows = conn.execute(text(
        "WITH RECURSIVE up(hash, parent, message_hash) AS ("
        " SELECT n.hash, n.parent, n.message_hash FROM chain_nodes n"
        f"  WHERE n.hash IN (SELECT t.chain_hash FROM turns t WHERE {doomed('t')})"
        " UNION SELECT n.hash, n.parent, n.message_hash FROM chain_nodes n JOIN up ON n.hash = up.parent)"
        " SELECT up.hash, up.parent, up.message_hash,"
        f"  EXISTS (SELECT 1 FROM turns r WHERE r.chain_hash = up.hash AND NOT ({doomed('r')}))"
        "  OR EXISTS (SELECT 1 FROM chain_nodes c WHERE c.parent = up.hash AND c.hash NOT IN (SELECT hash FROM up))"
        " FROM up"), params).all()
    parent = {h: p for h, p, _m, _u in rows}
    keep: set[str] = set()
    for h, _p, _m, used in rows:
        while used and h in parent and h not in keep:
            keep.add(h)
            h = parent[h]
    b.nodes = sorted(h for h in parent if h not in keep)
    gone = set(b.nodes)
    candidates = {m for h, _p, m, _u in rows if h in gone}
    for col in ("system_hash", "tools_hash"):
        candidates |= set(conn.execute(text(
            f"SELECT DISTINCT t.{col} FROM turns t WHERE {doomed('t')} AND t.{col} IS NOT NULL"), params).scalars())
    used: set[str] = set()
    for chunk in _chunks(sorted(candidates)):
        for col in ("system_hash", "tools_hash"):
            used |= set(conn.execute(text(
                f"SELECT DISTINCT r.{col} FROM turns r WHERE r.{col} IN :hs AND NOT ({doomed('r')})"
            ).bindparams(bindparam("hs", expanding=True)), {**params, "hs": chunk}).scalars())
        used |= {m for m, h in conn.execute(text("SELECT message_hash, hash FROM chain_nodes WHERE message_hash IN :hs")
                                            .bindparams(bindparam("hs", expanding=True)), {"hs": chunk})
                 if h not in gone}
    for chunk in _chunks(sorted(candidates - used)):
        b.blobs.update(conn.execute(text("SELECT hash, length(data) FROM blobs WHERE hash IN :hs")
                                    .bindparams(bindparam("hs", expanding=True)), {"hs": chunk}).all())
    return b


def _recount(conn: Connection, session_ids: list[str]) -> None:
    """Sessions' counts, models and times from the turns they hold now (as ingest adds them up)."""
    rows: dict[str, dict] = {}
    for chunk in _chunks(session_ids):
        for sid, started_at, status, calls, model, usage in conn.execute(text(
                "SELECT session_id, started_at, status, tool_call_count, model, usage FROM turns"
                " WHERE session_id IN :ids ORDER BY id").bindparams(bindparam("ids", expanding=True)), {"ids": chunk}):
            r = rows.setdefault(sid, {"sid": sid, "turns": 0, "tool_calls": 0, "errors": 0, "input_tokens": 0,
                                      "output_tokens": 0, "models": [], "started_at": started_at,
                                      "last_at": started_at})
            tokens_in, tokens_out = usage_tokens(json.loads(usage) if isinstance(usage, str) else usage)
            r["turns"] += 1
            r["tool_calls"] += calls
            r["errors"] += status != "ok"
            r["input_tokens"] += tokens_in
            r["output_tokens"] += tokens_out
            r["started_at"], r["last_at"] = min(r["started_at"], started_at), max(r["last_at"], started_at)
            if model and model not in r["models"]:
                r["models"].append(model)
    if rows:
        models = ":models" if conn.dialect.name == "sqlite" else "CAST(:models AS json)"
        conn.execute(text(
            "UPDATE sessions SET turns = :turns, tool_calls = :tool_calls, errors = :errors,"
            f" input_tokens = :input_tokens, output_tokens = :output_tokens, models = {models},"
            " started_at = :started_at, last_at = :last_at WHERE id = :sid"),
            [{**r, "models": json.dumps(r["models"])} for r in rows.values()])


def _mcp(conn: Connection, params: dict, keep_errors: bool, *, delete: bool) -> tuple[int, int]:
    """MCP messages older than the cutoff, and connections that hold no message any more
    and ended before it, or, over HTTP, started before it without saying they ended (an
    HTTP session is rarely closed; one still open but quiet for the whole cutoff loses
    its row, its later messages are stored and shown all the same): (messages,
    connections) deleted, or that would be. A stdio run not ended stays: its end (exit
    code, stderr) may yet come, and is written to its row.

    A call goes or stays whole, its request with its answer (paired as the MCP pages pair
    them: connection and JSON-RPC id). An answer stays for its own sake (newer than the
    cutoff, or an error kept by keep_errors); a request older than the cutoff stays while
    its answer does, so a kept error still says which tool got which arguments."""
    p = {**params, "no": False}
    msgs = "mcp_messages.at < :cutoff" + (" AND mcp_messages.is_error = :no" if keep_errors else "")
    kept = _mcp_kept(conn, p, keep_errors)
    conns = ("(mcp_connections.ended_at < :cutoff OR mcp_connections.ended_at IS NULL"
             " AND mcp_connections.transport = 'http' AND mcp_connections.started_at < :cutoff) AND NOT EXISTS"
             " (SELECT 1 FROM mcp_messages m WHERE m.connection = mcp_connections.id{})")
    if not delete:
        n = conn.execute(text(f"SELECT count(*) FROM mcp_messages WHERE {msgs}"), p).scalar() - len(kept)
        left = f" AND NOT (m.at < :cutoff{' AND m.is_error = :no' if keep_errors else ''})"
        ended = conn.execute(text(f"SELECT id FROM mcp_connections WHERE {conns.format(left)}"), p).scalars()
        return n, len(set(ended) - set(kept.values()))
    if not kept:
        n = conn.execute(text(f"DELETE FROM mcp_messages WHERE {msgs}"), p).rowcount
    elif len(kept) <= CHUNK:
        n = conn.execute(text(f"DELETE FROM mcp_messages WHERE {msgs} AND id NOT IN :kept")
                         .bindparams(bindparam("kept", expanding=True)), {**p, "kept": list(kept)}).rowcount
    else:  # more than one IN list holds: by id, in chunks
        doomed = [i for i in conn.execute(text(f"SELECT id FROM mcp_messages WHERE {msgs}"), p).scalars()
                  if i not in kept]
        n = _delete_in(conn, "mcp_messages", "id", doomed)
    c = conn.execute(text(f"DELETE FROM mcp_connections WHERE {conns.format('')}"), p).rowcount
    return n, c


def _mcp_kept(conn: Connection, p: dict, keep_errors: bool) -> dict[int, str]:
    """The messages older than the cutoff that stay because a message of the same call
    does (see _mcp): message id -> connection. Read: the rows that stay and can answer an
    old request (kept errors; newer answers on connections that also hold messages older
    than the cutoff, the calls the cutoff cuts through), and the old rows on their
    connections. A batch's members are read from its body; a batch that stays keeps every
    call in it whole, and so on until nothing more stays."""
    cols = "id, connection, direction, kind, jsonrpc_id, CASE WHEN kind = 'batch' THEN raw END"
    seeds = []
    if keep_errors:
        seeds += conn.execute(text(f"SELECT {cols} FROM mcp_messages WHERE at < :cutoff AND is_error = :yes"
                                   " AND kind IN ('response', 'batch')"), {**p, "yes": True}).all()
    old = set(conn.execute(text("SELECT DISTINCT connection FROM mcp_messages WHERE at < :cutoff"), p).scalars())
    cut = sorted(old & set(conn.execute(text("SELECT DISTINCT connection FROM mcp_messages WHERE at >= :cutoff"),
                                        p).scalars()))
    for chunk in _chunks(cut):
        seeds += conn.execute(text(f"SELECT {cols} FROM mcp_messages WHERE at >= :cutoff AND connection IN :cs"
                                   " AND kind IN ('response', 'batch')")
                              .bindparams(bindparam("cs", expanding=True)), {**p, "cs": chunk}).all()
    staying = {k for _id, *row in seeds for k in _calls_of(*row)}
    if not staying:
        return {}
    candidates = []
    doomed = " AND is_error = :no" if keep_errors else ""  # a kept error stays anyway
    for chunk in _chunks(sorted({k[0] for k in staying})):
        candidates += [(mid, row[0], _calls_of(*row)) for mid, *row in conn.execute(text(
            f"SELECT {cols} FROM mcp_messages WHERE at < :cutoff{doomed} AND connection IN :cs"
            " AND kind IN ('request', 'response', 'batch')").bindparams(bindparam("cs", expanding=True)),
            {**p, "cs": chunk})]
    kept: dict[int, str] = {}
    more = True
    while more:  # a single message names one call; only a batch brings in more
        more = False
        for mid, connection, calls in candidates:
            if mid not in kept and calls & staying:
                kept[mid] = connection
                more |= not calls <= staying
                staying |= calls
    return kept


def _calls_of(connection: str, direction: str, kind: str, ident: str | None, body: bytes | None) -> set[tuple]:
    """The calls a message is part of, as (connection, the request's direction, JSON-RPC id
    as stored): a request's own, an answer's request's; a batch's members' from its body."""
    back = "from_server" if direction == "to_server" else "to_server"
    if kind != "batch":
        return {(connection, direction if kind == "request" else back, ident)} if ident is not None else set()
    from ..mcp.messages import classify, elements, json_id

    out = set()
    for m in elements(classify(zlib.decompress(body)).json if body is not None else None):
        if "id" in m and isinstance(m.get("method"), str):
            out.add((connection, direction, json_id(m["id"])))
        elif "id" in m and ("result" in m or "error" in m):
            out.add((connection, back, json_id(m["id"])))
    return out


def _chunks(items: list) -> Iterator[list]:
    for i in range(0, len(items), CHUNK):
        yield items[i:i + CHUNK]


def _count_in(conn: Connection, table: str, column: str, values: list) -> int:
    q = text(f"SELECT count(*) FROM {table} WHERE {column} IN :v").bindparams(bindparam("v", expanding=True))
    return sum(conn.execute(q, {"v": chunk}).scalar() for chunk in _chunks(values))


def _delete_in(conn: Connection, table: str, column: str, values: list) -> int:
    q = text(f"DELETE FROM {table} WHERE {column} IN :v").bindparams(bindparam("v", expanding=True))
    return sum(conn.execute(q, {"v": chunk}).rowcount for chunk in _chunks(values))


@contextlib.contextmanager
def _transaction(engine: Engine) -> Iterator[Connection]:
    """A write transaction no writer's batch overlaps (see the module's docstring)."""
    if engine.dialect.name != "sqlite":
        with engine.begin() as conn:
            conn.execute(text("SELECT pg_advisory_xact_lock(:k)"), {"k": PRUNE_LOCK})
            yield conn
        return
    with engine.connect().execution_options(isolation_level="AUTOCOMMIT") as conn:
        conn.exec_driver_sql("BEGIN IMMEDIATE")  # the write lock now, as the writer takes it
        try:
            yield conn
        except BaseException:
            conn.exec_driver_sql("ROLLBACK")
            raise
        conn.exec_driver_sql("COMMIT")


def _reclaim(engine: Engine, full: bool) -> str:
    """Give the freed space back (see the module's docstring); says how."""
    if engine.dialect.name != "sqlite":
        with engine.connect().execution_options(isolation_level="AUTOCOMMIT") as conn:
            conn.exec_driver_sql("SET statement_timeout = 0")  # db.py's 30 s is for the writer
            for table in TABLES:
                conn.exec_driver_sql(f"VACUUM (ANALYZE) {table}")
        return "vacuum"
    with engine.connect().execution_options(isolation_level="AUTOCOMMIT") as conn:
        if full or conn.exec_driver_sql("PRAGMA auto_vacuum").scalar() != 2:
            conn.exec_driver_sql("PRAGMA auto_vacuum=INCREMENTAL")  # applied by this VACUUM
            conn.exec_driver_sql("VACUUM")
            how = "full"
        else:
            while True:
                with _transaction(engine) as step:
                    if not step.exec_driver_sql("PRAGMA freelist_count").scalar():
                        break
                    step.exec_driver_sql(f"PRAGMA incremental_vacuum({VACUUM_STEP})")
            how = "incremental"
        # The WAL holds the shrunk pages until a checkpoint; passive: never waits on readers.
        conn.exec_driver_sql("PRAGMA wal_checkpoint(PASSIVE)").fetchall()
    return how
