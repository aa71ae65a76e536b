"""The writer in a process of its own, at a lower priority than the proxy.

Storage is work that can wait: in a separate process it shares no GIL with the event
loop, and under a load that saturates the CPU the scheduler serves the agents' traffic
first while the writer falls behind and catches up afterwards.

Turns travel to it through the journal (journal.py), not through memory: the proxy
appends each finished turn to a segment file off the request path, and the writer
reads the segments, never more than `memory_bytes` of turns at a time. A backlog, then,
waits on disk, whatever its size; a SIGKILL of the proxy loses nothing that reached the
file (a power loss, at most the last fsync interval); a writer that dies is replaced and
its successor reads on from the oldest turn not yet stored; a writer whose proxy died
exits. The pipe carries only small messages: flushes, the writer's progress, and the
live events of stored turns.

`WriterProcess` has the interface of `writer.Writer`, which runs inside the child.
Settings (environment): TOOLTAP_FSYNC_MS (200), TOOLTAP_WRITER_MEMORY_MB (64),
TOOLTAP_WRITER_NICE (19: how much lower the writer's priority is than the proxy's;
`idle`: SCHED_IDLE, only the CPU time nothing else wants),
TOOLTAP_JOURNAL (the journal's folder; default beside the spool),
TOOLTAP_JOURNAL_SEGMENT_MB (8; two segments are reserved on disk ahead of need).
"""

from __future__ import annotations

import itertools
import logging
import math
import multiprocessing as mp
import os
import queue
import signal
import threading
import time
import uuid
from typing import Any

from .. import malloc, stacks
from ..capture import TurnRecord
from ..live import LiveHub
from .db import make_engine, migrate
from .journal import FSYNC_SECONDS, SEGMENT_BYTES, Journal, JournalReader, Position, lock_writer
from .peers import Own, PeerTurns
from .spool import Spool
from .writer import Rate

log = logging.getLogger("tooltap.store")

NICENESS = 19  # agents first when they fill the cores; other work can make turns seconds late
MEMORY_BYTES = 64 << 20
POLL_SECONDS = 0.05  # how often the writer looks for new turns in the journal
_context = mp.get_context("spawn")  # the parent has threads and an event loop: never fork it
_STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)
_HELD_AT_START = (*_STOP_SIGNALS, signal.SIGUSR1)  # SIGUSR1's default would kill it too


def journal_dir(spool_path: str) -> str:
    """`.<name>.journal` beside the spool (hidden: it is tooltap's working space)."""
    folder, name = os.path.split(os.path.abspath(spool_path))
    for suffix in (".spool.jsonl", ".jsonl"):
        if name.endswith(suffix):
            name = name[:-len(suffix)]
            break
    return os.path.join(folder, f".{name}.journal")


def env_number(name: str, default: float) -> float:
    value = os.environ.get(name)
    if not value:
        return default
    try:
        number = float(value)
    except ValueError:
        number = -1.0
    if not 0 <= number < math.inf:  # NaN too
        log.warning("%s=%r is not a finite number of 0 or more; using %g", name, value, default)
        return default
    return number


class WriterProcess:
    def __init__(self, db_url: str, spool_path: str, *, busy_timeout: float = 2.0,
                 live: LiveHub | None = None, journal: str | None = None, fsync_seconds: float | None = None,
                 memory_bytes: int | None = None, segment_bytes: int | None = None,
                 instance: str | None = None, own: Own | None = None, listen: bool = True):
        self.db_url = db_url
        self.busy_timeout = busy_timeout
        self.engine = make_engine(db_url, busy_timeout=busy_timeout)
        self.spool = Spool(spool_path)
        self.live = live
        if fsync_seconds is None:
            fsync_seconds = env_number("TOOLTAP_FSYNC_MS", FSYNC_SECONDS * 1000) / 1000
        if memory_bytes is None:
            memory_bytes = int(env_number("TOOLTAP_WRITER_MEMORY_MB", MEMORY_BYTES / 2**20) * 2**20)
        if segment_bytes is None:
            segment_bytes = int(env_number("TOOLTAP_JOURNAL_SEGMENT_MB", SEGMENT_BYTES / 2**20) * 2**20)
        self.memory_bytes = max(memory_bytes, 1 << 16)
        self.journal = Journal(journal or os.environ.get("TOOLTAP_JOURNAL") or journal_dir(spool_path),
                               fsync_seconds=fsync_seconds, segment_bytes=max(segment_bytes, 1 << 16))
        self.written = 0  # as of the child's last report, over every child so far
        self.spooled = 0
        self.rate = Rate()
        self._quiet_since = time.monotonic()  # the last turn stored, or the last moment none waited
        self._process: Any = None
        self._listener: threading.Thread | None = None
        self._flushes: dict[int, tuple[threading.Event, Position]] = {}
        self._ids = itertools.count(1)
        self._confirmed: Position = (0, 0)  # everything before it is stored or spooled
        self._child = (0, 0, 0)  # the current child's written, spooled, spool turns
        self._base = (0, 0)  # written, spooled by the children before it
        self._spawn_lock = threading.Lock()
        self._closing = False
        # Names this instance among those sharing the database; their turns reach the
        # live view too (peers.py), this one's own come from its writer. Several writers
        # of one tooltap (shards.py) share the name, and one of them listens.
        self.instance = instance or uuid.uuid4().hex[:12]
        self._own = own or Own()
        self._listen_to_peers = listen
        self._peers: PeerTurns | None = None

    def start(self) -> None:
        migrate(self.engine)  # here, so a bad database URL fails the start, not the child
        self._closing = False
        self.journal.start()
        self._spawn()
        self._listener = threading.Thread(target=self._listen, name="tooltap-writer-events", daemon=True)
        self._listener.start()
        if self.live is not None and self._listen_to_peers:
            self._peers = PeerTurns(self.db_url, self.live, self.instance, self._own).start()

    def _spawn(self) -> None:
        # Fresh queues: a process killed inside a queue call can leave that queue locked.
        self._inbox, self._outbox = _context.Queue(), _context.Queue()
        self._process = _context.Process(
            target=_child, name="tooltap-writer", daemon=False,
            args=(self.db_url, self.spool.path, self.journal.slot, self.busy_timeout, self.memory_bytes,
                  os.getpid(), self._inbox, self._outbox, self.instance),
        )
        # Stop signals stay blocked while the child starts (it inherits this thread's
        # mask): a Ctrl-C to the process group during its imports must not kill it.
        # It ignores them, then unblocks them (see _child).
        mask = signal.pthread_sigmask(signal.SIG_BLOCK, _HELD_AT_START)
        try:
            self._process.start()
        finally:
            signal.pthread_sigmask(signal.SIG_SETMASK, mask)
        for n, (_, end) in list(self._flushes.items()):  # asked of a child that died
            self._inbox.put(("flush", (n, end)))

    def submit(self, record: TurnRecord) -> None:
        self.journal.submit(record)  # a queue put: the journal's thread writes it

    def flush(self, timeout: float = 10.0) -> None:
        """Wait until everything submitted so far is committed or spooled."""
        deadline = time.monotonic() + timeout
        end = self.journal.mark(timeout)
        self._revive()  # a writer that just died would never answer
        n = next(self._ids)
        done = threading.Event()
        self._flushes[n] = (done, end)
        self._inbox.put(("flush", (n, end)))
        done.wait(max(0.0, deadline - time.monotonic()))
        self._flushes.pop(n, None)

    def close(self, timeout: float = 30.0) -> None:
        if self._process is None:
            return
        self._closing = True
        if self._peers is not None:
            self._peers.close()
            self._peers = None
        self.journal.close()  # every turn accepted is on disk now (or counted as lost)
        # The child stops storing a little before the parent stops waiting (a stop signal's
        # grace is counted): what it has not stored by then stays in the journal.
        self._inbox.put(("stop", (self.journal.end(), timeout * 0.75)))
        self._process.join(timeout)
        killed = self._process.is_alive()
        if killed:  # it ignores SIGTERM (see _child)
            log.error("the writer process did not stop in %.1f s; killing it", timeout)
            self._process.kill()
            self._process.join(1)
        self._outbox.put(("closed", None))  # after the writer's last confirmations
        if self._listener is not None:
            self._listener.join(0.5 if killed else 5)
        left = self.journal.hand_over(self.spool, self._confirmed)
        if left:  # the writer was stuck or died: what it never confirmed waits in the spool
            log.warning("spooled %d turn(s) the writer did not confirm", left)
        self.journal.release()
        self._process = None
        self.engine.dispose()

    def health(self) -> dict:
        """For /_tooltap/api/health: what waits, where, and how fast it goes."""
        backlog, journal_bytes = self._backlog()
        process = self._process
        return {
            "backlog": backlog,
            # How long turns have waited with none stored: a locked database, or one huge turn.
            "stalled_s": round(time.monotonic() - self._quiet_since, 1) if backlog else 0.0,
            "spool_bytes": journal_bytes + self.spool.size(),
            "turns_per_s": self.rate.per_second(),
            "written": self.written,
            "spooled": self.spooled,
            "held_in_memory": self.journal.held,  # the disk is full: these wait in RAM
            "lost": self.journal.lost,
            "journal": self.journal.slot,
            "journal_bytes": journal_bytes,
            "memory_bound_bytes": self.memory_bytes,
            "fsync_ms": round(self.journal.fsync_seconds * 1000),
            "pid": process.pid if process is not None else None,
            "proxy_pid": os.getpid(),  # which tooltap process answered (serve --workers)
            "instance": self.instance,
            "alive": bool(process is not None and process.is_alive()),
        }

    def _listen(self) -> None:
        while True:
            try:
                kind, payload = self._outbox.get(timeout=1.0)
            except queue.Empty:
                self._revive()
                if not self._backlog()[0]:
                    self._quiet_since = time.monotonic()
                continue
            if kind == "closed":
                return
            if kind == "progress":
                confirmed, *counts = payload
                self._note(*counts)
                if tuple(confirmed) > self._confirmed:
                    self._confirmed = tuple(confirmed)
                    self.journal.forget_before(confirmed[0])
            elif kind == "events" and self.live is not None:
                for event in payload:
                    self._own.add(event["turn_id"])
                    self.live.publish_threadsafe(event)
            elif kind == "flushed":
                n, *counts = payload
                self._note(*counts)
                done = self._flushes.get(n)
                if done is not None:
                    done[0].set()

    def _backlog(self) -> tuple[int, int]:
        """Turns not yet stored (waiting for the journal, in it, in the spool), and the
        journal's bytes among them."""
        journal_turns, journal_bytes = self.journal.backlog(self._confirmed)
        return self.journal.pending() + journal_turns + self._child[2], journal_bytes

    def _note(self, written: int, spooled: int, spool_turns: int) -> None:
        self._child = (written, spooled, spool_turns)
        if self._base[0] + written != self.written:
            self._quiet_since = time.monotonic()
        self.written, self.spooled = self._base[0] + written, self._base[1] + spooled
        self.rate.note(self.written)

    def _revive(self) -> None:
        """A writer that died (a crash, the OOM killer) is replaced; its successor reads
        the journal from the oldest turn not yet confirmed (what it finds stored already
        it skips)."""
        with self._spawn_lock:
            process = self._process
            if process is None or self._closing or process.is_alive():
                return
            log.error("the writer process exited (code %s); starting another", process.exitcode)
            self._base = (self.written, self.spooled)
            self._child = (0, 0, self._child[2])
            self._spawn()


class _Events:
    """Stands in for the LiveHub inside the child: events go back to the parent."""

    def __init__(self, outbox) -> None:
        self.outbox = outbox

    def publish_threadsafe(self, event: dict) -> None:
        self.outbox.put(("events", [event]))

    def publish_all(self, events: list[dict]) -> None:
        if events:
            self.outbox.put(("events", events))


def _step_aside() -> None:
    """Lower this process's priority below the proxy's (its threads, started later, inherit
    it): TOOLTAP_WRITER_NICE steps nicer, 19 by default (0: the proxy's priority, as the
    writer benchmarks run), or `idle` for SCHED_IDLE (Linux): only the CPU time nothing
    else wants. Such a writer stores nothing while every core is busy (an agent's build,
    its tests, or agents' requests back to back), and its turns reach the inspector when
    the machine has time again (bench/README.md)."""
    value = os.environ.get("TOOLTAP_WRITER_NICE", "").strip().lower() or str(NICENESS)
    if value != "idle" and not value.isdigit():
        log.warning("TOOLTAP_WRITER_NICE=%r is neither a number of 0 or more nor 'idle'; using %d",
                    value, NICENESS)
        value = str(NICENESS)
    if value == "idle":
        try:
            os.sched_setscheduler(0, os.SCHED_IDLE, os.sched_param(0))
            return
        except (AttributeError, OSError):  # not Linux: the nicest niceness instead
            value = "19"
    try:
        os.nice(int(value))
    except OSError:
        pass


def _child(db_url: str, spool_path: str, slot: str, busy_timeout: float, memory_bytes: int,
           parent_pid: int, inbox, outbox, instance: str) -> None:
    from .writer import Writer

    # Ctrl-C (and a closed terminal's SIGHUP) reach the whole process group; the parent
    # decides when the writer stops.
    for sig in _STOP_SIGNALS:
        signal.signal(sig, signal.SIG_IGN)
    stacks.dump_on_sigusr1()
    malloc.keep_large_buffers()
    signal.pthread_sigmask(signal.SIG_UNBLOCK, _HELD_AT_START)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    _step_aside()
    lock_writer(slot)  # held until this process exits
    reader = JournalReader(slot)
    writer = Writer(db_url, spool_path, busy_timeout=busy_timeout, live=_Events(outbox), durable=True,
                    own_process=True)
    writer.announce_as = instance

    def counts():
        return writer.written, writer.spooled, writer.spool.count

    def done(records) -> None:
        reader.confirm(records)
        outbox.put(("progress", (reader.confirmed, *counts())))

    writer.on_done = done
    from ..otel.live import attach_from_environment

    attach_from_environment(writer)  # `serve --otlp-endpoint`: spans of stored turns, after commit
    writer.start(migrate_first=False)  # the parent migrated; the database may be down by now
    feed = _Feed(reader, writer, memory_bytes)
    while True:
        if os.getppid() != parent_pid:
            kind, payload = "orphaned", None
        else:
            feed.top_up()
            try:
                kind, payload = inbox.get(timeout=POLL_SECONDS)
            except queue.Empty:
                continue
            except (EOFError, OSError):
                kind, payload = "orphaned", None
        if kind == "flush":
            n, end = payload
            feed.catch_up(end, time.monotonic() + 10)
            writer.flush()
            outbox.put(("flushed", (n, *counts())))
        elif kind == "stop":
            end, timeout = payload
            deadline = time.monotonic() + timeout
            feed.catch_up(end, deadline)
            writer.close(max(0.1, deadline - time.monotonic()))
            reader.close()  # the segments stored are deleted before the next tooltap reads the slot
            outbox.put(("progress", (reader.confirmed, *counts())))
            outbox.put(("flushed", (0, *counts())))
            return
        elif kind == "orphaned":
            # The proxy is gone (SIGKILL): finish what is in hand and go; the journal keeps
            # the rest for the next tooltap, whose writer waits for this one to exit.
            log.warning("tooltap's main process is gone; the writer stops (the journal keeps "
                        "what is not stored yet)")
            writer.close(5.0)
            os._exit(0)  # nobody reads the pipe any more: do not wait to flush it


class _Feed:
    """Moves turns from the journal to the writer, never more than `memory_bytes` of them
    waiting in memory: a longer backlog stays on disk."""

    def __init__(self, reader: JournalReader, writer, memory_bytes: int) -> None:
        self.reader, self.writer, self.memory_bytes = reader, writer, memory_bytes

    def top_up(self) -> None:
        while (room := self.memory_bytes - self.reader.outstanding_bytes) > 0:
            entries = self.reader.read(room)
            if not entries:
                return
            for entry in entries:
                self.writer.submit(entry)

    def catch_up(self, end: Position, deadline: float) -> None:
        """Read up to `end` (for a flush or a stop), as memory allows, until `deadline`."""
        while tuple(self.reader.position) < tuple(end) and time.monotonic() < deadline:
            before = self.reader.position
            self.top_up()
            if self.reader.position == before:
                time.sleep(0.01)  # at the memory bound: wait for the writer
