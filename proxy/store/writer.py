"""The one writer: a thread that takes finished turns off a queue and commits them in batches.

The request path only ever calls `submit()`, which never blocks. A turn is committed
within `BATCH_SECONDS` of its end. If the database is unavailable (locked, down, disk
full), turns go to the spool file, in arrival order, and are replayed once it answers
again; while the spool holds anything, new turns queue behind it so a session's turns
land in order. A turn the database refuses for good (a value it cannot store) is set
aside whole in the quarantine file, never allowed to hold the others back. `close()`
drains the queue: SIGINT/SIGTERM flush everything pending.
"""

from __future__ import annotations

import logging
import queue
import threading
import time
from typing import Callable

from sqlalchemy.exc import InterfaceError, OperationalError
from sqlmodel import Session as DB

from ..capture import TurnRecord
from ..live import LiveHub
from .db import make_engine, migrate
from .decoding import BlobCache, RecentTurns, decode_new_turns
from .ingest import Ingestor
from .spool import Spool

log = logging.getLogger("tooltap.store")

BATCH_SECONDS = 0.2
BATCH_MAX = 200
RETRY_SECONDS = 2.0
# The database is unavailable for now (locked, unreachable, disk full, timed out): wait
# and retry. Anything else is a problem with one turn's data.
UNAVAILABLE = (OperationalError, InterfaceError, OSError)
_STOP = object()


class Writer:
    def __init__(self, db_url: str, spool_path: str, *, busy_timeout: float = 2.0,
                 live: LiveHub | None = None):
        self.db_url = db_url
        self.engine = make_engine(db_url, busy_timeout=busy_timeout)
        self.spool = Spool(spool_path)
        self.live = live
        self.written = 0  # turns committed, for tests and stats
        self.spooled = 0
        self._queue: queue.SimpleQueue = queue.SimpleQueue()
        self._thread: threading.Thread | None = None
        self._ingestor = Ingestor(self.engine.dialect.name)
        self._blobs = BlobCache()
        self._recent = RecentTurns()
        self._retry_after = 0.0  # monotonic time before which the spool is not retried
        self.on_done: Callable[[list[TurnRecord]], None] | None = None

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
        self._queue.put(_STOP)
        self._thread.join(timeout)
        if self._thread.is_alive():  # stuck on the database: what is still queued is spooled
            left = self._drain()
            if left:
                log.warning("database did not answer in %.0f s; spooling %d turn(s)", timeout, len(left))
                self.spool.append(left)
        self._thread = None
        self.engine.dispose()

    def flush(self, timeout: float = 10.0) -> None:
        """Wait until everything submitted so far is committed or spooled (for tests)."""
        done = threading.Event()
        self._queue.put(done)
        done.wait(timeout)

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
            events = self._commit(records)
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
        self.written += len(records)
        self._release(records)
        if self.live is not None:
            for event in events:
                self.live.publish_threadsafe(event)
        return []

    def _commit(self, records: list[TurnRecord]) -> list[dict]:
        """One transaction for the batch; returns the live events to announce it."""
        with DB(self.engine, autoflush=False) as db:  # ingest flushes where it must
            stored = [self._ingestor.add(db, r) for r in records]
            db.flush()
            decode_new_turns(db, stored, self._recent, self._blobs)
            events = [{"type": "turn_stored", "turn_id": s.turn.id, "session_id": s.turn.session_id,
                       "live_id": r.live_id} for s, r in zip(stored, records)]
            db.commit()
        return events

    def _forget(self) -> None:
        """After a rollback: what the caches say was written may not have been."""
        self._ingestor = Ingestor(self.engine.dialect.name)
        self._recent = RecentTurns()

    def _spool(self, records: list[TurnRecord]) -> None:
        if not records:
            return
        while True:
            try:
                self.spool.append(records)
                break
            except OSError:  # not even the spool can be written (disk full): keep trying
                log.exception("cannot write the spool %s; retrying", self.spool.path)
                time.sleep(RETRY_SECONDS)
        self.spooled += len(records)
        self._retry_after = time.monotonic() + RETRY_SECONDS
        self._release(records)

    def _replay_spool(self, force: bool = False) -> None:
        """Write the spooled turns, oldest first, in batches; stop at the first batch the
        database cannot take and keep the rest for the next try."""
        if not self.spool.pending() or (not force and time.monotonic() < self._retry_after):
            return
        records = self.spool.take()
        for i in range(0, len(records), BATCH_MAX):
            left = self._store(records[i:i + BATCH_MAX])
            if left:
                self.spool.keep(left + records[i + BATCH_MAX:])
                self._retry_after = time.monotonic() + RETRY_SECONDS
                return
        self.spool.done()
        if records:
            log.info("replayed %d spooled turn(s) into the database", len(records))

    def _release(self, records: list[TurnRecord]) -> None:
        """These turns are taken care of (stored, spooled or quarantined)."""
        for r in records:
            r.release()
        if self.on_done is not None:
            self.on_done(records)
