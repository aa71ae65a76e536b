"""The writer in a process of its own, at a lower priority than the proxy.

Storage is work that can wait: in a separate process it shares no GIL with the event
loop, and under a load that saturates the CPU the scheduler serves the agents' traffic
first while the writer falls behind and catches up afterwards. Turns travel to it as
plain data over a pipe (a long response as the path of its temporary file); it answers
with the live events of stored turns and with acknowledgements of flushes.

`WriterProcess` has the interface of `writer.Writer`, which runs inside the child.
"""

from __future__ import annotations

import itertools
import logging
import multiprocessing as mp
import os
import queue
import signal
import threading
from typing import Any

from ..capture import TurnRecord
from ..live import LiveHub
from .db import make_engine, migrate
from .spool import Spool

log = logging.getLogger("tooltap.store")

NICENESS = 10
_context = mp.get_context("spawn")  # the parent has threads and an event loop: never fork it


class WriterProcess:
    def __init__(self, db_url: str, spool_path: str, *, busy_timeout: float = 2.0,
                 live: LiveHub | None = None):
        self.db_url = db_url
        self.busy_timeout = busy_timeout
        self.engine = make_engine(db_url, busy_timeout=busy_timeout)
        self.spool = Spool(spool_path)
        self.live = live
        self.written = 0  # as of the child's last report
        self.spooled = 0
        self._process: Any = None
        self._listener: threading.Thread | None = None
        self._flushes: dict[int, threading.Event] = {}
        self._ids = itertools.count(1)
        # Every turn is kept here until the writer says it is stored or spooled: a writer
        # that dies takes nothing with it, its successor gets the turns again.
        self._unconfirmed: dict[int, TurnRecord] = {}
        self._lock = threading.Lock()
        self._receipts = itertools.count(1)

    def start(self) -> None:
        migrate(self.engine)  # here, so a bad database URL fails the start, not the child
        self._closing = False
        self._spawn()
        self._listener = threading.Thread(target=self._listen, name="tooltap-writer-events", daemon=True)
        self._listener.start()

    def _spawn(self) -> None:
        # Fresh queues: a process killed inside a queue call can leave that queue locked.
        self._inbox, self._outbox = _context.Queue(), _context.Queue()
        self._process = _context.Process(
            target=_child, name="tooltap-writer", daemon=False,
            args=(self.db_url, self.spool.path, self.busy_timeout, self._inbox, self._outbox),
        )
        self._process.start()

    def submit(self, record: TurnRecord) -> None:
        with self._lock:
            record.seq = next(self._receipts)
            self._unconfirmed[record.seq] = record
            self._inbox.put(("turn", record))  # pickled by the queue's own feeder thread

    def flush(self, timeout: float = 10.0) -> None:
        """Wait until everything submitted so far is committed or spooled."""
        n = next(self._ids)
        done = self._flushes[n] = threading.Event()
        self._inbox.put(("flush", n))
        done.wait(timeout)
        self._flushes.pop(n, None)

    def close(self, timeout: float = 30.0) -> None:
        if self._process is None:
            return
        self._closing = True
        self._inbox.put(("stop", None))
        self._process.join(timeout + 5)  # the child's own close() spools what it cannot commit
        if self._process.is_alive():
            log.error("the writer process did not stop; terminating it")
            self._process.terminate()
        self._outbox.put(("closed", None))  # after the writer's last confirmations
        if self._listener is not None:
            self._listener.join(5)
        with self._lock:
            left = list(self._unconfirmed.values())
            self._unconfirmed.clear()
        if left:  # the writer was stuck or died: what it never confirmed is kept
            log.warning("spooling %d turn(s) the writer did not confirm", len(left))
            self.spool.append(left)
        self._process = None
        self.engine.dispose()

    def _listen(self) -> None:
        while True:
            try:
                kind, payload = self._outbox.get(timeout=1.0)
            except queue.Empty:
                self._revive()
                continue
            if kind == "closed":
                return
            if kind == "done":
                with self._lock:
                    for seq in payload:
                        self._unconfirmed.pop(seq, None)
            elif kind == "event" and self.live is not None:
                self.live.publish_threadsafe(payload)
            elif kind == "flushed":
                n, self.written, self.spooled = payload
                done = self._flushes.get(n)
                if done is not None:
                    done.set()


    def _revive(self) -> None:
        """A writer that died (a crash, the OOM killer) is replaced; the turns waiting in
        the pipe go to its successor."""
        process = self._process
        if process is None or self._closing or process.is_alive():
            return
        with self._lock:
            log.error("the writer process exited (code %s); starting another with its %d "
                      "unconfirmed turn(s)", process.exitcode, len(self._unconfirmed))
            self._spawn()
            for record in self._unconfirmed.values():  # in submission order
                self._inbox.put(("turn", record))


class _Events:
    """Stands in for the LiveHub inside the child: events go back to the parent."""

    def __init__(self, outbox) -> None:
        self.outbox = outbox

    def publish_threadsafe(self, event: dict) -> None:
        self.outbox.put(("event", event))


def _child(db_url: str, spool_path: str, busy_timeout: float, inbox, outbox) -> None:
    from .writer import Writer

    # Ctrl-C reaches the whole process group; the parent decides when the writer stops.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    try:
        os.nice(NICENESS)
    except OSError:
        pass
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    writer = Writer(db_url, spool_path, busy_timeout=busy_timeout, live=_Events(outbox))
    writer.on_done = lambda records: outbox.put(("done", [r.seq for r in records if r.seq]))
    writer.start(migrate_first=False)  # the parent migrated; the database may be down by now
    while True:
        try:
            kind, payload = inbox.get()
        except (EOFError, OSError):  # the parent is gone: store what came, then stop
            kind, payload = "stop", None
        if kind == "turn":
            writer.submit(payload)
        elif kind == "flush":
            writer.flush()
            outbox.put(("flushed", (payload, writer.written, writer.spooled)))
        elif kind == "stop":
            writer.close()
            outbox.put(("flushed", (0, writer.written, writer.spooled)))
            return
