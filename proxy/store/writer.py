"""The one writer: a thread that takes finished turns off a queue and commits them in batches.

The request path only ever calls `submit()`, which never blocks. A turn is committed
within `BATCH_SECONDS` of its end. If the database refuses (locked, down, disk full), the
batch goes to the spool file and is replayed once the database answers again. `close()`
drains the queue: SIGINT/SIGTERM flush everything pending.
"""

from __future__ import annotations

import logging
import queue
import threading
import time
from typing import Callable

from sqlalchemy.exc import DBAPIError
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
_STOP = object()


class Writer:
    def __init__(self, db_url: str, spool_path: str, *, busy_timeout: float = 2.0,
                 live: LiveHub | None = None):
        self.db_url = db_url
        self.engine = make_engine(db_url, busy_timeout=busy_timeout)
        self.spool = Spool(spool_path)
        self._queue: queue.SimpleQueue = queue.SimpleQueue()
        self._thread: threading.Thread | None = None
        self._ingestor = Ingestor(self.engine.dialect.name)
        self._last_retry = 0.0
        self.written = 0  # turns committed, for tests and stats
        self.spooled = 0
        self._blobs = BlobCache()
        self._recent = RecentTurns()
        self.live = live

    def start(self) -> None:
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
        self._thread = None
        self.engine.dispose()

    def flush(self, timeout: float = 10.0) -> None:
        """Wait until everything submitted so far is committed or spooled (for tests)."""
        done = threading.Event()
        self._queue.put(done)
        done.wait(timeout)

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
            self._replay_spool()  # rate-limited to one attempt per RETRY_SECONDS
            batch, waiters = [], []
            try:
                item = self._queue.get(timeout=RETRY_SECONDS)
            except queue.Empty:
                continue
            deadline = time.monotonic() + BATCH_SECONDS
            while True:
                if item is _STOP:
                    stopping = True
                elif isinstance(item, threading.Event):
                    waiters.append(item)
                else:
                    batch.append(item)
                if stopping or len(batch) >= BATCH_MAX or waiters:
                    break
                try:
                    item = self._queue.get(timeout=max(0.0, deadline - time.monotonic()))
                except queue.Empty:
                    break
            if stopping:  # take whatever else is already queued
                while not self._queue.empty():
                    item = self._queue.get_nowait()
                    if isinstance(item, TurnRecord):
                        batch.append(item)
                    elif isinstance(item, threading.Event):
                        waiters.append(item)
            if batch:
                self._write(batch)
            for w in waiters:
                w.set()
        return False

    def _write(self, records: list[TurnRecord]) -> bool:
        """Commit a batch; on a database failure spool it. True if committed."""
        try:
            with DB(self.engine, autoflush=False) as db:  # ingest flushes where it must
                stored = [self._ingestor.add(db, r) for r in records]
                db.flush()
                decode_new_turns(db, stored, self._recent, self._blobs)
                db.commit()
                events = [{"type": "turn_stored", "turn_id": s.turn.id, "session_id": s.turn.session_id,
                           "live_id": r.live_id} for s, r in zip(stored, records)]
        except (DBAPIError, OSError) as exc:
            self._forget()
            log.warning("database unavailable (%s: %s); %d turn(s) spooled to %s",
                        type(exc).__name__, exc, len(records), self.spool.path)
            self._spool(records, self.spool.append)
            return False
        except Exception:
            self._forget()
            if len(records) > 1:  # find the one turn that trips the bug; write the others
                return all([self._write([r]) for r in records])
            log.exception("could not store a turn; kept in %s", self.spool.failed_path)
            self._spool(records, self.spool.quarantine)
            return False
        self.written += len(records)
        for r in records:
            r.release()
        if self.live is not None:
            for event in events:
                self.live.publish_threadsafe(event)
        return True

    def _forget(self) -> None:
        """After a rollback: what the caches say was written may not have been."""
        self._ingestor = Ingestor(self.engine.dialect.name)
        self._recent = RecentTurns()

    def _spool(self, records: list[TurnRecord], put: Callable[[list[TurnRecord]], None]) -> None:
        try:
            put(records)
            self.spooled += len(records)
        except OSError:  # not even the spool can be written (disk full): keep them queued
            log.exception("cannot write the spool: keeping %d turn(s) in memory", len(records))
            time.sleep(RETRY_SECONDS)
            for r in records:
                self._queue.put(r)
            return
        for r in records:
            r.release()

    def _replay_spool(self) -> None:
        if not self.spool.pending():
            return
        now = time.monotonic()
        if now - self._last_retry < RETRY_SECONDS:
            return
        self._last_retry = now
        records = self.spool.take()
        if not records:
            self.spool.done()
            return
        if self._write(records):
            log.info("replayed %d spooled turn(s) into the database", len(records))
        self.spool.done()  # committed, or appended to the spool again by _write
