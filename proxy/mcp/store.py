"""The MCP recorder: a thread that classifies relayed messages and stores them in batches.

The relay only calls `record()`, a queue put that never blocks; parsing, naming and the
database all happen here. Messages reach the database within `BATCH_SECONDS`. While the
database cannot take them (locked, down, migrating, missing its driver, a file that is
not a database), they wait in the spool (spool.py) and are replayed, in order, once it
answers; a record the database refuses for good is set aside in `<spool file>.failed`.
The problem is said once, in one line on stderr (a database that cannot be opened in
`tooltap serve`'s words): it lands in the agent's log of the server. Several recorders
(wrapped servers, `tooltap serve`) share one database: every write is an insert that
ignores what is already there, or an upsert.

A write waits up to `busy_timeout` for a locked SQLite file, in short steps, so that
`close()` can cut the wait short: the agent waits on the wrapper's exit, and what a lock
keeps out at the end stays in the spool for the next recorder on the database.

A stdio server's name comes from `--name`, else from the `serverInfo.name` of its answer
to `initialize`: a connection's first messages wait here (a few seconds at most) until
that answer names them.
"""

from __future__ import annotations

import itertools
import logging
import math
import os
import queue
import sys
import threading
import time
import zlib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from sqlalchemy import text, update
from sqlalchemy.exc import InterfaceError, OperationalError, ProgrammingError

from ..store import content
from ..store.models import McpConnection, McpMessage, McpToolSet
from .messages import FROM_SERVER, TO_SERVER, classify, elements, json_id
from .spool import McpSpool, default_dir, fallback_dir

log = logging.getLogger("tooltap.mcp")

BATCH_SECONDS = 0.1
BATCH_MAX = 500
RETRY_SECONDS = 2.0
LOCK_STEP_SECONDS = 0.05  # SQLite's own busy wait per attempt; the recorder retries up to busy_timeout
CLOSE_WAIT_SECONDS = 0.2  # after close(), how long a lock may still hold a write up (a writer's batch)
NAME_WAIT_SECONDS = 30.0  # how long a connection's messages wait for `initialize` to name it (npx servers, a busy machine: starts can be slow)
NAME_WAIT_MAX = 1000


class Unopened(Exception):
    """The database could not be opened or migrated; the message says why, as `serve` says it."""


# The database cannot be used for now: spool and retry. (ProgrammingError: a table
# missing because another process is migrating.)
UNAVAILABLE = (Unopened, OperationalError, InterfaceError, ProgrammingError, OSError, ImportError)
_STOP = object()


@dataclass
class Connection:
    """One conversation with one server: a wrapper's run, or an HTTP MCP session."""

    id: str
    transport: str  # "stdio" | "http"
    name: str | None = None  # given (--name, --mcp NAME=...); else learned from initialize
    fallback: str = "mcp"  # the name when initialize never says one (the command's name)
    command: str | None = None
    url: str | None = None
    started_at: float = field(default_factory=time.time)
    _seq: Any = field(default_factory=itertools.count, repr=False)

    def next_seq(self) -> int:
        return next(self._seq)  # itertools.count: atomic under the GIL, safe across relay threads


class Recorder:
    def __init__(self, db_url: str, spool_dir: str | Path | None = None, *, busy_timeout: float = 2.0):
        self.db_url = db_url
        self.busy_timeout = busy_timeout
        self.spool = McpSpool(spool_dir or default_dir(db_url), fallback=fallback_dir(db_url))
        self.written = 0  # messages stored (tests, health)
        self.spooled = 0
        self.problem: str | None = None  # the last reason the database was not used, as said
        self._queue: queue.SimpleQueue = queue.SimpleQueue()
        self._thread: threading.Thread | None = None
        self._engine = None
        self._retry_after = 0.0
        self._give_up_at: float | None = None  # set by close(): lock waits end then
        self._inflight: list[dict] = []
        self._state = _State()
        self._said: str | None = None  # the problem said on stderr during the run

    # -- the relay's side: never blocks ---------------------------------------------------

    def record(self, conn: Connection, direction: str, raw: bytes, at: float | None = None,
               note: str | None = None) -> None:
        self._queue.put(("msg", conn, conn.next_seq(), direction, time.time() if at is None else at, raw, note))

    def ended(self, conn: Connection, exit_code: int | None, stderr_tail: str | None = None) -> None:
        self._queue.put(("end", conn, time.time(), exit_code, stderr_tail))

    # -- life cycle -------------------------------------------------------------------------

    def start(self) -> None:
        self._thread = threading.Thread(target=self._run, name="tooltap-mcp-recorder", daemon=True)
        self._thread.start()

    def flush(self, timeout: float = 10.0) -> None:
        """Wait until what was recorded so far is stored or spooled (a connection still
        waiting for its name excepted)."""
        done = threading.Event()
        self._queue.put(done)
        done.wait(timeout)

    def close(self, timeout: float = 3.0) -> None:
        """Store what is left; what the database does not take within `timeout` is spooled,
        and so is what a lock keeps out `CLOSE_WAIT_SECONDS` from now (the agent waits on us)."""
        if self._thread is None:
            return
        # A database that already kept this run out is not waited for again.
        self._give_up_at = time.monotonic() + (0.0 if self.problem else CLOSE_WAIT_SECONDS)
        self._queue.put(_STOP)
        self._thread.join(timeout)
        if self._thread.is_alive():  # stuck on the database: spool the rest from here
            ops = list(self._inflight)
            while True:
                try:
                    item = self._queue.get_nowait()
                except queue.Empty:
                    break
                if isinstance(item, threading.Event):
                    item.set()
                elif item is not _STOP:
                    ops += self._state.take(item)
            ops += self._state.release_all()
            if ops:
                self._to_spool(ops)
        self._thread = None
        if self._engine is not None:
            self._engine.dispose()
        if self.spool.pending():
            _say(self._left_behind())

    # -- the recorder thread ----------------------------------------------------------------

    def _run(self) -> None:
        stopping = False
        while not stopping:
            try:
                stopping = self._once()
            except Exception:  # the recorder must outlive any bug; the relay never notices
                log.exception("MCP recorder error")
                time.sleep(0.1)

    def _once(self) -> bool:
        self._replay()
        try:
            item = self._queue.get(timeout=0.5)
        except queue.Empty:
            self._write(self._state.release_stale())
            return False
        ops, waiters, stopping = [], [], False
        deadline = time.monotonic() + BATCH_SECONDS
        while True:
            if item is _STOP:
                stopping = True
            elif isinstance(item, threading.Event):
                waiters.append(item)
            else:
                ops += self._state.take(item)
            if len(ops) >= BATCH_MAX or ((stopping or waiters) and self._queue.empty()):
                break
            wait = deadline - time.monotonic()
            try:
                item = self._queue.get_nowait() if stopping or waiters or wait <= 0 else self._queue.get(timeout=wait)
            except queue.Empty:
                break
        ops += self._state.release_all() if stopping else self._state.release_stale()
        self._write(ops)
        if stopping:
            self._replay(force=True)
        for w in waiters:
            w.set()
        return stopping

    def _write(self, ops: list[dict]) -> None:
        if not ops:
            return
        if self.spool.pending():  # behind what waits already, to keep each connection's order
            self._replay()
            if self.spool.pending():
                self._to_spool(ops)
                return
        left = self._store(ops)
        if left:
            self._to_spool(left)

    def _store(self, ops: list[dict]) -> list[dict]:
        """Store `ops`; returns them back when the database is unavailable (a record it
        refuses for good is set aside instead)."""
        self._inflight = ops
        try:
            self._commit(ops)
        except UNAVAILABLE as exc:
            self._unavailable(exc)
            return ops
        except Exception:
            if len(ops) == 1:
                log.exception("could not store an MCP record; kept in %s.failed", self.spool.path)
                self._quarantine(ops)
                return []
            for i, op in enumerate(ops):  # find the one that trips; store the others
                if self._store([op]):
                    return ops[i:]
            return []
        finally:
            self._inflight = []
        self.written += sum(op["op"] == "msg" for op in ops)
        self.problem = None
        return []

    def _commit(self, ops: list[dict]) -> None:
        """One transaction; a locked database is retried in short steps, until
        `busy_timeout` has passed or close() says to stop waiting."""
        deadline = time.monotonic() + self.busy_timeout
        while True:
            try:
                engine = self._ready()
                with engine.begin() as db:
                    write_ops(db, engine.dialect.name, ops)
                return
            except OperationalError as exc:
                if not _locked(exc) or time.monotonic() >= min(deadline, self._give_up_at or math.inf):
                    raise
            time.sleep(0.005)  # some lock errors come back at once (a stale WAL snapshot): never spin

    def _ready(self):
        if self._engine is None:
            from ..store.db import DatabaseUnavailable, open_database

            # Opened as `serve` opens it (created owner-only: tool traffic is as private as
            # prompts; migrated), so what makes it unusable is said in serve's words. Its short
            # busy wait lets close() cut a lock's wait short (_commit retries up to busy_timeout).
            try:
                self._engine = open_database(self.db_url, busy_timeout=min(LOCK_STEP_SECONDS, self.busy_timeout))
            except DatabaseUnavailable as exc:
                raise Unopened(str(exc)) from exc
        return self._engine

    def _unavailable(self, exc: BaseException) -> None:
        self.problem = _problem(exc)
        self._retry_after = time.monotonic() + RETRY_SECONDS
        if self._engine is not None and isinstance(exc, ProgrammingError):
            self._engine.dispose()
            self._engine = None  # migrate again next time
        # Once (it lands in the agent's log of the server's stderr); a failure at close, close() reports.
        if self._said is None and self._give_up_at is None:
            self._said = self.problem
            _say(f"tooltap mcp: {self.problem}; recording to {self.spool.folder} until it answers")

    def _left_behind(self) -> str:
        """The exit's line on what waits in the spool; it names the problem unless that was said."""
        problem = self.problem or "database unavailable at exit"
        named = "" if problem == self._said else f"{problem}; "
        return (f"tooltap mcp: {named}the messages the database did not take wait in {self.spool.folder}, "
                "for the next `tooltap mcp` or `tooltap serve --mcp` on it to store")

    def _to_spool(self, ops: list[dict]) -> None:
        try:
            self.spool.append(ops)
            self.spooled += sum(op["op"] == "msg" for op in ops)
        except OSError as exc:  # not even the spool: lose the records, never the relay
            log.error("LOST %d MCP message(s): the spool cannot be written in %s (%s)",
                      sum(op["op"] == "msg" for op in ops), " nor ".join(map(str, self.spool.folders)),
                      exc.strerror or exc)
        if self._retry_after < time.monotonic():
            self._retry_after = time.monotonic() + RETRY_SECONDS

    def _quarantine(self, ops: list[dict]) -> None:
        from .spool import encode

        try:
            self.spool.folder.mkdir(parents=True, exist_ok=True)
            with open(str(self.spool.path) + ".failed", "a", encoding="ascii") as f:
                f.writelines(encode(op) + "\n" for op in ops)
        except OSError:
            pass

    def _replay(self, force: bool = False) -> None:
        if not force and time.monotonic() < self._retry_after:
            return
        self._retry_after = time.monotonic() + RETRY_SECONDS
        try:
            files = self.spool.take()
        except OSError:
            return
        for path in files:
            for ops in McpSpool.read(path, BATCH_MAX):
                if self._store(ops):  # unavailable again: the file waits, whole, for the next try
                    return
            self.spool.done(path)


class _State:
    """What the recorder remembers per connection: its name (or the messages waiting for
    it) and its open requests, so an answer is filed under its request's method."""

    def __init__(self) -> None:
        self.names: dict[str, str] = {}
        self.held: dict[str, list[tuple[Connection, dict]]] = {}
        self.held_since: dict[str, float] = {}
        self.open: dict[tuple[str, str], dict[str, str]] = {}  # (conn, requester) -> id -> method

    def take(self, item: tuple) -> list[dict]:
        """The records for one queued item: nothing while its connection waits for a name."""
        if item[0] == "end":
            _, conn, at, exit_code, tail = item
            ops = [] if conn.id in self.names else self._named(conn, conn.name or conn.fallback)
            return ops + [{"op": "end", "id": conn.id, "ended_at": at, "exit_code": exit_code, "stderr_tail": tail}]
        _, conn, seq, direction, at, raw, note = item
        records, learned = self._message(conn, seq, direction, at, raw, note)
        name = self.names.get(conn.id)
        if name is not None:
            return [{**r, "server": name} for r in records]
        name = conn.name or learned
        if name is None:
            self.held.setdefault(conn.id, []).extend((conn, r) for r in records)
            self.held_since.setdefault(conn.id, time.monotonic())
            return []
        return self._named(conn, name) + [{**r, "server": name} for r in records]

    def _named(self, conn: Connection, name: str) -> list[dict]:
        """The connection's record, then the messages that waited for its name."""
        return self._name(conn, name) + self._release(conn, name)

    def _name(self, conn: Connection, name: str) -> list[dict]:
        self.names[conn.id] = name
        return [{"op": "conn", "id": conn.id, "server": name, "transport": conn.transport,
                 "command": conn.command, "url": conn.url, "started_at": conn.started_at}]

    def _release(self, conn: Connection, name: str) -> list[dict]:
        self.held_since.pop(conn.id, None)
        return [{**row, "server": name} for _, row in self.held.pop(conn.id, [])]

    def release_stale(self) -> list[dict]:
        now = time.monotonic()
        ops: list[dict] = []
        for conn_id in [c for c, t in self.held_since.items()
                        if now - t > NAME_WAIT_SECONDS or len(self.held.get(c, ())) > NAME_WAIT_MAX]:
            conn = self.held[conn_id][0][0]
            ops += self._named(conn, conn.name or conn.fallback)
        return ops

    def release_all(self) -> list[dict]:
        ops: list[dict] = []
        for conn_id in list(self.held):
            conn = self.held[conn_id][0][0]
            ops += self._named(conn, conn.name or conn.fallback)
        return ops

    def _message(self, conn: Connection, seq: int, direction: str, at: float, raw: bytes,
                 note: str | None) -> tuple[list[dict], str | None]:
        """The message's record (and a tool set's, for a tools/list answer), and the
        server's name when this is its answer to initialize."""
        parsed = classify(raw)
        tool_sets: list[dict] = []
        learned = None
        requester = TO_SERVER if direction == FROM_SERVER else FROM_SERVER  # who asked what this answers
        method = parsed.method
        for msg in elements(parsed.json):
            if isinstance(msg.get("method"), str) and "id" in msg:
                self.open.setdefault((conn.id, direction), {})[json_id(msg["id"])] = msg["method"]
            elif "id" in msg and ("result" in msg or "error" in msg):
                asked = self.open.get((conn.id, requester), {}).pop(json_id(msg["id"]), None)
                if parsed.kind == "response":
                    method = asked
                result = msg.get("result") if isinstance(msg.get("result"), dict) else {}
                if direction == FROM_SERVER and asked == "tools/list" and isinstance(result.get("tools"), list):
                    tools = result["tools"]
                    tool_sets.append({"op": "tools", "tools_hash": content.content_hash(tools),
                                      "tool_count": len(tools), "at": at, "tools": content.pack(tools)})
                info = result.get("serverInfo")
                if direction == FROM_SERVER and asked == "initialize" and isinstance(info, dict) \
                        and isinstance(info.get("name"), str) and info["name"].strip():
                    learned = info["name"].strip()[:200]
        notes = [n for n in (parsed.note, note) if n]
        row = {"op": "msg", "connection": conn.id, "seq": seq, "direction": direction,
               "at": at, "kind": parsed.kind, "method": method[:200] if method else None,
               "jsonrpc_id": parsed.jsonrpc_id, "tool": parsed.tool, "is_error": parsed.is_error,
               "size": len(raw), "note": "; ".join(notes) or None, "raw": zlib.compress(raw, 1)}
        return [row, *tool_sets], learned


def write_ops(db, dialect: str, ops: list[dict]) -> None:
    """Apply records in one transaction; each is idempotent (a replay may repeat one)."""
    if dialect == "sqlite":
        from sqlalchemy.dialects.sqlite import insert
    else:
        from sqlalchemy.dialects.postgresql import insert

        from ..store.db import PRUNE_LOCK

        # Shared, as the turns' writer holds it: a prune pairs requests with their answers
        # and deletes in one transaction, alone (retention.py); no answer may land between.
        # (SQLite: the prune's BEGIN IMMEDIATE keeps this insert out already.)
        db.execute(text("SELECT pg_advisory_xact_lock_shared(:k)"), {"k": PRUNE_LOCK})
    msgs = McpMessage.__table__
    conns = McpConnection.__table__
    sets = McpToolSet.__table__
    batch: list[dict] = []

    def flush_messages() -> None:
        if batch:
            db.execute(insert(msgs).on_conflict_do_nothing(index_elements=["connection", "seq"]), batch)
            batch.clear()

    for op in ops:
        kind = op["op"]
        if kind == "msg":
            batch.append({k: v for k, v in op.items() if k != "op"})
            continue
        flush_messages()
        if kind == "conn":
            db.execute(insert(conns).on_conflict_do_nothing(index_elements=["id"]),
                       [{k: v for k, v in op.items() if k != "op"}])
        elif kind == "end":
            db.execute(update(conns).where(conns.c.id == op["id"]).values(
                ended_at=op["ended_at"], exit_code=op["exit_code"], stderr_tail=op["stderr_tail"]))
        elif kind == "tools":
            stmt = insert(sets).values(server=op["server"], tools_hash=op["tools_hash"], tool_count=op["tool_count"],
                                       first_seen=op["at"], last_seen=op["at"], seen=1, tools=op["tools"])
            db.execute(stmt.on_conflict_do_update(
                index_elements=["server", "tools_hash"],
                set_={"last_seen": stmt.excluded.last_seen, "seen": sets.c.seen + 1}))
    flush_messages()


def _problem(exc: BaseException) -> str:
    """Why the database was not used, in one line."""
    if isinstance(exc, Unopened):
        return str(exc)  # already in serve's words
    from ..store.db import _cause

    return f"database unavailable ({_cause(exc)})"


def _locked(exc: OperationalError) -> bool:
    """SQLite's busy error ("database is locked", "database table is locked")."""
    return "is locked" in str(getattr(exc, "orig", exc))


def _say(line: str) -> None:
    try:
        sys.stderr.write(line + "\n")
        sys.stderr.flush()
    except (OSError, ValueError):
        pass


def new_id() -> str:
    return os.urandom(12).hex()

