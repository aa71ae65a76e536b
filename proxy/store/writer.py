"""The one writer: a thread that takes finished turns off a queue and commits them in batches.

The request path only ever calls `submit()`, which never blocks. A turn is committed
within `BATCH_SECONDS` of its end. If the database is unavailable (locked, down, disk
full), turns go to the spool file, in arrival order, and are replayed once it answers
again; while the spool holds anything, new turns queue behind it so a session's turns
land in order. A turn the database refuses for good (a value it cannot store) is set
aside whole in the quarantine file, never allowed to hold the others back. `close()`
drains the queue: SIGINT/SIGTERM flush everything pending. A turn that carries a unique
id (from the journal, see journal.py) and is already in the database is skipped: a
journal or spool read again after a crash stores nothing twice.
"""

from __future__ import annotations

import collections
import gc
import logging
import queue
import threading
import time
from typing import Callable

from sqlalchemy import event
from sqlalchemy.exc import InterfaceError, OperationalError
from sqlmodel import Session as DB, select

from .. import malloc
from ..capture import TurnRecord
from ..live import LiveHub
from .db import make_engine, migrate
from .decoding import BlobCache, RecentTurns, decode_new_turns
from .ingest import Ingestor
from .models import Turn
from .peers import announce
from .spool import Spool

log = logging.getLogger("tooltap.store")

BATCH_SECONDS = 0.2
BATCH_MAX = 200
SPOOL_BATCH_BYTES = 16 << 20  # a spool replay reads this much at a time
RETRY_SECONDS = 2.0
FULL_GC_SECONDS = 300.0
# The database is unavailable for now (locked, unreachable, disk full, timed out): wait
# and retry. Anything else is a problem with one turn's data.
UNAVAILABLE = (OperationalError, InterfaceError, OSError)
_STOP = object()


class Writer:
    def __init__(self, db_url: str, spool_path: str, *, busy_timeout: float = 2.0,
                 live: LiveHub | None = None, durable: bool = False, own_process: bool = False):
        self.db_url = db_url
        self.engine = make_engine(db_url, busy_timeout=busy_timeout)
        if self.engine.dialect.name == "sqlite":
            begin_immediate(self.engine)
        if durable and self.engine.dialect.name == "sqlite":
            # The journal forgets a turn once it is committed: the commit must survive a
            # power loss too (Postgres commits are durable already).
            event.listen(self.engine, "connect", _sync_every_commit)
        self.spool = Spool(spool_path)
        self.journaled = durable  # the turns come from a journal, which keeps them until confirmed
        self.live = live
        self.written = 0  # turns committed, for tests and stats
        self.spooled = 0
        self.duplicates = 0  # turns skipped because their id was already stored
        self.rate = Rate()
        self.own_process = own_process  # alone in its process: it may tune the garbage collector
        # Set: announce each batch's turns to the other instances on the database (peers.py).
        self.announce_as: str | None = None
        self._full_gc_at = time.monotonic() + FULL_GC_SECONDS
        self._heap_used = False  # a batch stored since the heap was last given back (own_process)
        self._queue: queue.SimpleQueue = queue.SimpleQueue()
        self._thread: threading.Thread | None = None
        self._ingestor = Ingestor(self.engine.dialect.name)
        self._blobs = BlobCache()
        self._recent = RecentTurns()
        self._retry_after = 0.0  # monotonic time before which the spool is not retried
        self._stopping = False
        self.on_done: Callable[[list[TurnRecord]], None] | None = None
        # Called with the stored turns' live events after each commit (OpenTelemetry export).
        self.on_stored: Callable[[list[dict]], None] | None = None

    def start(self, migrate_first: bool = True) -> None:
        if migrate_first:
            migrate(self.engine)
        self._thread = threading.Thread(target=self._run, name="tooltap-writer", daemon=True)
        self._thread.start()

    def submit(self, record: TurnRecord) -> None:
        self._queue.put(record)

    def close(self, timeout: float = 30.0) -> None:
        if self._thread is None:
            return
        self._stopping = True
        self._queue.put(_STOP)
        self._thread.join(timeout)
        if self._thread.is_alive():  # stuck on the database: what is still queued is spooled
            left = self._drain()
            if left:
                log.warning("database did not answer in %.1f s; spooling %d turn(s)", timeout, len(left))
                try:
                    self.spool.append(left)
                except OSError as exc:
                    log.error("%s %d turn(s): the spool cannot be written either (%s)",
                              "the journal keeps" if self.journaled else "LOST", len(left), exc.strerror or exc)
                else:
                    self._release(left)  # taken care of: whoever waits on them must not spool them again
        self._thread = None
        self.engine.dispose()

    def flush(self, timeout: float = 10.0) -> None:
        """Wait until everything submitted so far is committed or spooled (for tests)."""
        done = threading.Event()
        self._queue.put(done)
        done.wait(timeout)

    def health(self) -> dict:
        return {"backlog": self._queue.qsize() + self.spool.count, "spool_bytes": self.spool.size(),
                "turns_per_s": self.rate.per_second(), "written": self.written, "spooled": self.spooled}

    # -- the writer thread ---------------------------------------------------------------

    def _run(self) -> None:
        while True:
            try:
                if not self._loop():
                    return
            except Exception:  # the writer must outlive any bug
                log.exception("writer loop error")

    def _loop(self) -> bool:
        """Write batches until asked to stop; False once stopped."""
        stopping = False
        while not stopping:
            self._replay_spool()
            try:
                item = self._queue.get(timeout=RETRY_SECONDS)
            except queue.Empty:
                if self._heap_used:  # idle after work: the request bodies' memory goes back
                    malloc.give_back()
                    self._heap_used = False
                continue
            batch, waiters, stopping = self._gather(item)
            if batch:
                if self.spool.pending():  # behind the spooled turns, to keep the order
                    self._spool(batch)
                else:
                    self._spool(self._store(batch))
            if stopping:
                self._replay_spool(force=True)
            for w in waiters:
                w.set()
        return False

    def _gather(self, item) -> tuple[list[TurnRecord], list[threading.Event], bool]:
        """A batch: what arrives within BATCH_SECONDS of the first turn (or all that is
        queued, when stopping). Returns (turns, flush waiters, stopping)."""
        batch, waiters, stopping = [], [], False
        deadline = time.monotonic() + BATCH_SECONDS
        while True:
            if item is _STOP:
                stopping = True
            elif isinstance(item, threading.Event):
                waiters.append(item)
            else:
                batch.append(item)
            if (stopping or waiters) and self._queue.empty():
                break
            if len(batch) >= BATCH_MAX:
                break
            try:
                wait = 0 if stopping or waiters else max(0.0, deadline - time.monotonic())
                item = self._queue.get(timeout=wait) if wait else self._queue.get_nowait()
            except queue.Empty:
                break
        return batch, waiters, stopping

    def _drain(self) -> list[TurnRecord]:
        left = []
        while not self._queue.empty():
            item = self._queue.get_nowait()
            if isinstance(item, TurnRecord):
                left.append(item)
            elif isinstance(item, threading.Event):
                item.set()
        return left

    def _store(self, records: list[TurnRecord]) -> list[TurnRecord]:
        """Commit `records`. Returns those left over, in order, because the database is
        unavailable; a turn it refuses for good is quarantined instead."""
        try:
            events, stored = self._commit(records)
        except UNAVAILABLE as exc:
            self._forget()
            log.warning("database unavailable (%s: %s)", type(exc).__name__, str(exc).splitlines()[0])
            return records
        except Exception:
            self._forget()
            if len(records) == 1:
                log.exception("could not store a turn; kept whole in %s", self.spool.failed_path)
                self.spool.quarantine(records)
                self._release(records)
                return []
            for i, record in enumerate(records):  # find the one that trips; store the others
                if self._store([record]):
                    return records[i:]  # the database went away meanwhile
            return []
        self.written += stored
        self.duplicates += len(records) - stored
        self.rate.note(self.written)
        self._release(records)
        if self.own_process:
            self._settle_memory()
            self._heap_used = True
        if self.live is not None:
            if hasattr(self.live, "publish_all"):  # the writer process's pipe: one message per batch
                self.live.publish_all(events)
            else:
                for stored in events:
                    self.live.publish_threadsafe(stored)
        if self.on_stored is not None:
            self.on_stored(events)
        return []

    def _commit(self, records: list[TurnRecord]) -> tuple[list[dict], int]:
        """One transaction for the batch; returns the live events to announce it and how
        many turns were new."""
        # The work that needs no database comes first, before SQLite's write lock is
        # taken: other writers on the file (`--writers`, `--workers`) store meanwhile.
        prepared = [self._ingestor.add(r) for r in records]
        with DB(self.engine, autoflush=False) as db:
            if self._ingestor.check_epoch(db.connection()):  # a prune ran: add() trusted stale hashes
                self._ingestor.discard_batch()
                prepared = [self._ingestor.add(r) for r in records]
            fresh = {id(r) for r in self._unseen(db, records)}
            stored = [item for r, item in zip(records, prepared) if id(r) in fresh]
            records = [r for r in records if id(r) in fresh]
            if stored:
                self._ingestor.write(db, stored)
            decode_new_turns(db, stored, self._recent, self._blobs)
            events = [{"type": "turn_stored", "turn_id": s.turn.id, "session_id": s.turn.session_id,
                       "live_id": r.live_id} for s, r in zip(stored, records)]
            if self.announce_as and events and self.engine.dialect.name == "postgresql":
                announce(db.connection(), self.announce_as, events)  # sent by the commit, not before
            db.commit()
        return events, len(records)

    @staticmethod
    def _unseen(db: DB, records: list[TurnRecord]) -> list[TurnRecord]:
        """The turns not stored yet: a turn read again from the journal or the spool
        after a crash is recognised by its id. (The unique index on turns.uid is the
        guarantee; this keeps it from ever being tripped.)"""
        uids = [u for u in (getattr(r, "uid", "") for r in records) if u]
        if not uids:
            return records
        seen = set(db.exec(select(Turn.uid).where(Turn.uid.in_(uids))).all())
        fresh = []
        for r in records:
            uid = getattr(r, "uid", "")
            if uid and uid in seen:
                continue
            seen.add(uid)
            fresh.append(r)
        if len(fresh) < len(records):
            log.info("skipped %d turn(s) already stored (read again after a restart)", len(records) - len(fresh))
        return fresh

    def _settle_memory(self) -> None:
        """What a batch leaves alive (the recent requests and turns the next batches start
        from) is put out of the garbage collector's sight: otherwise every collection
        walks all of it again, a fifth of the writer's time. Those objects are still freed
        when nothing refers to them; a full collection now and then takes back any cycle
        that was frozen with them."""
        if time.monotonic() >= self._full_gc_at:
            gc.unfreeze()
            gc.collect()
            self._full_gc_at = time.monotonic() + FULL_GC_SECONDS
        gc.freeze()

    def _forget(self) -> None:
        """After a rollback: what the caches say was written may not have been."""
        self._ingestor = Ingestor(self.engine.dialect.name)
        self._recent = RecentTurns()

    def _spool(self, records: list[TurnRecord]) -> None:
        if not records:
            return
        said = False
        while True:
            try:
                self.spool.append(records)
                break
            except OSError as exc:  # not even the spool can be written (disk full): keep trying
                if not said:
                    log.error("cannot write the spool %s (%s): %d turn(s) wait in memory%s; retrying",
                              self.spool.path, exc.strerror or exc, len(records),
                              " (the journal keeps them too)" if self.journaled else "")
                    said = True
                if self._stopping:
                    if self.journaled:
                        log.warning("stopping: %d turn(s) neither stored nor spooled stay in the journal",
                                    len(records))
                    else:
                        log.error("LOST %d turn(s): neither the database nor the spool could take them "
                                  "before the writer stopped", len(records))
                    return  # not released: a journal still has them
                time.sleep(RETRY_SECONDS)
                records = self._store(records)  # the database may be back first
                if not records:
                    return
        self.spooled += len(records)
        self._retry_after = time.monotonic() + RETRY_SECONDS
        self._release(records)

    def _replay_spool(self, force: bool = False) -> None:
        """Write the spooled turns, oldest first, in batches; stop at the first batch the
        database cannot take and keep the rest for the next try."""
        if not self.spool.pending() or (not force and time.monotonic() < self._retry_after):
            return
        replayed = 0
        batches = self.spool.replay(BATCH_MAX, SPOOL_BATCH_BYTES)
        for records, offsets in batches:
            left = self._store(records)
            self.spool.stored(len(records) - len(left))
            replayed += len(records) - len(left)
            if left:
                batches.close()
                self.spool.keep_from(offsets[len(records) - len(left)])
                self._retry_after = time.monotonic() + RETRY_SECONDS
                break
        else:
            if not self.spool.done():  # a line it could not set aside (a full disk): later
                self._retry_after = time.monotonic() + RETRY_SECONDS
        if self.on_done is not None:  # the spool's count changed after its turns were announced
            self.on_done([])
        if replayed:
            log.info("replayed %d spooled turn(s) into the database", replayed)

    def _release(self, records: list[TurnRecord]) -> None:
        """These turns are taken care of (stored, spooled or quarantined)."""
        for r in records:
            r.release()
        if self.on_done is not None:
            self.on_done(records)


class Rate:
    """Turns per second over the last few seconds, from a running total."""

    WINDOW = 10.0

    def __init__(self) -> None:
        self._samples: collections.deque[tuple[float, int]] = collections.deque()

    def note(self, total: int) -> None:
        now = time.monotonic()
        self._samples.append((now, total))
        while len(self._samples) > 2 and now - self._samples[1][0] > self.WINDOW:
            self._samples.popleft()

    def per_second(self) -> float:
        if len(self._samples) < 2:
            return 0.0
        (t0, n0), (t1, n1) = self._samples[0], self._samples[-1]
        span = max(time.monotonic() - t0, t1 - t0, 1e-3)
        return round((n1 - n0) / span, 2)


def _sync_every_commit(dbapi_conn, _record) -> None:
    cur = dbapi_conn.cursor()
    cur.execute("PRAGMA synchronous=FULL")
    cur.close()


def begin_immediate(engine) -> None:
    """Take SQLite's write lock when the transaction begins, not at its first write: a
    batch places its turns by what it reads, and another process (a second tooltap on
    the same file, `serve --workers`) must not commit between that read and the write."""

    @event.listens_for(engine, "connect")
    def _no_implicit_begin(dbapi_conn, _record) -> None:
        dbapi_conn.isolation_level = None  # the driver's own BEGIN would be deferred

    @event.listens_for(engine, "begin")
    def _begin(conn) -> None:
        conn.exec_driver_sql("BEGIN IMMEDIATE")
