"""The journal: a finished turn is on disk before the writer takes it.

The proxy hands each finished turn to a thread that appends it to a segment file (at
once when idle, under load in batches `GATHER_SECONDS` apart) and fsyncs in batches
(every `fsync_seconds`, 200 ms by default). A SIGKILL of tooltap loses no turn that
reached the file; a power loss, at most the turns of the last interval.
The writer process reads the segments in order, never more than its memory bound at a
time, and deletes a segment once every turn in it is stored (or spooled). Each turn
carries a unique id, stored with it: reading a segment again after a crash stores
nothing twice.

On disk: `<root>/<slot>/<number>.seg`. A slot belongs to one running tooltap (a lock
file says so; a second instance on the same path takes the next slot, and a slot left
behind by a dead instance is adopted by the next one to start). A segment is a run of
frames: payload length, payload, crc32 of the payload; a zero length ends the data.
Every frame holds its whole turn. One whose request body starts with most of the body
of an earlier turn of its conversation (an agent's resent history) also names that turn
and how many bytes they share (resent.py), and carries a CRC-32 of its header and one of
the bytes after the shared ones: a writer that still has the earlier body reads only the
rest of the frame.
Space is reserved ahead of need: each segment is allocated in full when it is created
and the next one is allocated in advance, so turns that arrive as the disk fills still
find room; when nothing can be written the turns wait in memory, and the log says how
many.
"""

from __future__ import annotations

import bisect
import collections
import dataclasses
import errno
import fcntl
import io
import logging
import os
import pickle
import queue
import struct
import threading
import time
import uuid
from array import array
from dataclasses import dataclass

from zlib_ng import zlib_ng  # the same CRC-32 as zlib's, 14x faster (a 1.3 MB body: 0.02 ms)

from ..capture import TurnRecord
from .resent import Base, Recent, Spliced

log = logging.getLogger("tooltap.store")

FSYNC_SECONDS = 0.2
GATHER_SECONDS = 0.005  # under load, turns are written in batches this far apart
SEGMENT_BYTES = 8 << 20
ROLL_SECONDS = 30.0  # a quiet segment is closed after this, so stored turns leave the disk
RETRY_SECONDS = 1.0  # a full disk is tried again this often
SAY_AGAIN_SECONDS = 10.0  # and the held turns are counted in the log this often
HAND_OVER_BYTES = 64 << 20  # at shutdown, a backlog up to this size moves to the spool

_LEN = struct.Struct("<Q")  # a frame: its payload's length, the payload, its crc32
_CRC = struct.Struct("<I")
_OVERHEAD = _LEN.size + _CRC.size
_LENGTHS = struct.Struct("<IIQ")  # the header's, the request body's and the raw response's
# The payload starts with the lengths; the CRC-32 of them and the header; and that of the
# body past what it shares with its base, then the raw response (0 without a base).
_PARTS = struct.Struct("<IIQII")
_PARTS_V1 = _LENGTHS  # frames written before 2026-12-01 start with the lengths alone: read, not written
_SEG = ".seg"
_SPARE = "next.spare"
_FIELDS = tuple(f.name for f in dataclasses.fields(TurnRecord) if f.name not in ("request_body", "raw", "seq"))

Position = tuple[int, int]  # (segment number, byte offset): everything before it


@dataclass
class JournaledTurn(TurnRecord):
    """A turn read back from the journal (or the spool), with the unique id it was given
    there: storing it twice stores it once. Its body may be a `Spliced` over the one of
    the turn it `extends` (that turn's uid, and how many bytes they share): `body()`
    gives it as it is, `request_body` as bytes."""

    extends: tuple[str, int] | None = None

    @property
    def request_body(self) -> bytes:
        body = self.__dict__["_body"]
        if isinstance(body, Spliced):
            body = self.__dict__["_body"] = bytes(body)
        return body

    @request_body.setter
    def request_body(self, value: bytes | Spliced) -> None:
        self.__dict__["_body"] = value

    def body(self) -> bytes | Spliced:
        return self.__dict__["_body"]


# -- frames ----------------------------------------------------------------------------


def _header(record: TurnRecord, uid: str, base: Base | None) -> bytes:
    """The turn's fields but its bodies: plain values (str, numbers, lists, dicts), pickled
    because that costs the proxy a fifth of JSON; read back by an unpickler that loads no
    class at all, so a journal file can only ever yield plain values."""
    data = {name: getattr(record, name) for name in _FIELDS}
    data["uid"] = uid
    if base is not None:
        data["base"] = (base.uid, base.shared)
    try:
        return pickle.dumps(data, protocol=5)
    except (RecursionError, pickle.PicklingError):  # a pathologically deep assembled response
        data["response"] = None  # the writer assembles it again from the raw bytes
        return pickle.dumps(data, protocol=5)


class _PlainValues(pickle.Unpickler):
    def find_class(self, module: str, name: str):
        raise pickle.UnpicklingError(f"a journal header names {module}.{name}: only plain values belong there")


def _pwritev(fd: int, parts: list[bytes], offset: int) -> None:
    written = os.pwritev(fd, parts, offset)  # no copy to join the parts
    total = sum(len(p) for p in parts)
    if written < total:  # a short write (a signal, the disk filling): the rest, joined
        _pwrite(fd, b"".join(parts)[written:], offset + written)


def _pwrite(fd: int, data: bytes, offset: int) -> None:
    view = memoryview(data)
    while view:
        n = os.pwrite(fd, view, offset)
        view, offset = view[n:], offset + n


class Frame:
    """One turn, ready to write: its size is known before a byte is written. A raw
    response kept in a temporary file is copied in (the journal must not depend on a file
    deleted at exit). With a `base` (resent.py), its header names the earlier turn, and a
    CRC-32 of what follows the shared bytes lets a reader that has that turn's body read
    only the rest."""

    def __init__(self, record: TurnRecord, uid: str, base: Base | None = None):
        self.raw_path = record.raw if isinstance(record.raw, str) else None
        self.raw = b"" if self.raw_path else record.raw
        raw_len = len(self.raw)
        if self.raw_path:
            base = None  # its CRC-32 would need the file read twice
            try:
                raw_len = os.path.getsize(self.raw_path)
            except OSError as exc:  # not the journal's disk: keep the turn without those bytes
                record.error = "; ".join(filter(None, [record.error, f"capture: raw bytes lost ({exc})"]))
                self.raw_path = None
        header = _header(record, uid, base)
        body = record.request_body
        tail_crc = 0
        if base is not None:
            tail_crc = zlib_ng.crc32(self.raw, zlib_ng.crc32(memoryview(body)[base.shared:]))
        lengths = (len(header), len(body), raw_len)
        header_crc = zlib_ng.crc32(header, zlib_ng.crc32(_LENGTHS.pack(*lengths)))
        parts = _PARTS.pack(*lengths, header_crc, tail_crc)
        # The body stays a part of its own (a megabyte at 200 turns: not copied to join it).
        self.head = [parts + header, body]
        self.head_len = sum(map(len, self.head))
        self.raw_len = raw_len
        self.size = _OVERHEAD + self.head_len + raw_len

    def write(self, fd: int, offset: int) -> int:
        """Write at `offset`; returns the offset after the frame."""
        n = self.head_len + self.raw_len
        crc = zlib_ng.crc32(self.head[1], zlib_ng.crc32(self.head[0]))
        if self.raw_path is None:
            crc = zlib_ng.crc32(self.raw, crc)
            _pwritev(fd, [_LEN.pack(n), *self.head, self.raw, _CRC.pack(crc)], offset)
            return offset + self.size
        pos, copied = offset + _LEN.size + self.head_len, 0
        _pwritev(fd, [_LEN.pack(n), *self.head], offset)
        with open(self.raw_path, "rb") as f:
            while chunk := f.read(1 << 20):
                crc = zlib_ng.crc32(chunk, crc)
                _pwrite(fd, chunk, pos)
                pos, copied = pos + len(chunk), copied + len(chunk)
        if copied != self.raw_len:
            raise OSError(f"the raw response file {self.raw_path} changed while it was journaled")
        _pwrite(fd, _CRC.pack(crc), pos)
        return pos + _CRC.size


def decode_header(header: bytes) -> dict:
    return _PlainValues(io.BytesIO(header)).load()


def _values(header: bytes) -> dict | Exception:
    """A frame's header decoded, or why it cannot be."""
    try:
        values = decode_header(header)
    except (ValueError, TypeError, KeyError, pickle.UnpicklingError, EOFError) as exc:
        return exc
    return values if isinstance(values, dict) else TypeError(f"its header holds a {type(values).__name__}")


def journaled_turn(values: dict, body: bytes | Spliced, raw: bytes) -> JournaledTurn:
    known = {k: v for k, v in values.items() if k in _FIELDS or k == "uid"}
    turn = JournaledTurn(**known, request_body=body, raw=raw)
    if isinstance(body, Spliced):
        turn.extends = (values["base"][0], body.shared)
    return turn


def frame_ends(path: str) -> array:
    """The end offset of every complete frame in a segment (lengths only, no checksums)."""
    ends = array("Q")
    try:
        with open(path, "rb") as f:
            size, offset = os.fstat(f.fileno()).st_size, 0
            while offset + _LEN.size <= size:
                f.seek(offset)
                (n,) = _LEN.unpack(f.read(_LEN.size))
                if n == 0 or offset + n + _OVERHEAD > size:
                    break
                offset += n + _OVERHEAD
                ends.append(offset)
    except OSError:
        pass
    return ends


def _read_parts(fd: int, at: int, lengths, before: bytes) -> tuple | None:
    """The parts of `lengths` from `at`, each straight into bytes of its own, if the
    frame's CRC-32 (of `before` and them, then at their end) checks out."""
    parts = []
    for length in lengths:
        parts.append(os.pread(fd, length, at))
        at += length
    end = os.pread(fd, _CRC.size, at)
    crc = zlib_ng.crc32(before)
    for part in parts:
        crc = zlib_ng.crc32(part, crc)
    if [len(p) for p in parts] != list(lengths) or len(end) != _CRC.size or crc != _CRC.unpack(end)[0]:
        return None
    return tuple(parts)


class _Bodies:
    """The request bodies a reader read last, by turn uid, up to `budget` bytes of what
    they keep alive: a frame whose body extends one of them is read past what they share
    only. A body replaces the one it extends (a conversation needs its last one). A
    spliced body is joined into bytes after `FLATTEN` links, or once its chain keeps twice
    its own size alive, so none grows long or heavy."""

    FLATTEN = 32

    def __init__(self, budget: int = 32 << 20) -> None:
        self.budget = budget
        self._kept: collections.OrderedDict[str, bytes | Spliced] = collections.OrderedDict()
        self._bytes = 0

    def get(self, uid: str) -> bytes | Spliced | None:
        return self._kept.get(uid)

    def keep(self, uid: str, body: bytes | Spliced, extends: str | None = None) -> None:
        if isinstance(body, Spliced) and (body.depth >= self.FLATTEN or body.held > 2 * len(body)):
            body = bytes(body)
        if extends is not None and (gone := self._kept.pop(extends, None)) is not None:
            self._bytes -= _held(gone)
        if _held(body) > self.budget or uid in self._kept:
            return
        self._kept[uid] = body
        self._bytes += _held(body)
        while self._bytes > self.budget:
            _, gone = self._kept.popitem(last=False)
            self._bytes -= _held(gone)


def _held(body: bytes | Spliced) -> int:
    return body.held if isinstance(body, Spliced) else len(body)


# -- slots -------------------------------------------------------------------------------


def _lock(path: str, block: bool) -> int | None:
    """An exclusive lock on `path`, or None if another process holds it."""
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | (0 if block else fcntl.LOCK_NB))
    except BlockingIOError:
        os.close(fd)
        return None
    return fd


def segments(slot: str) -> list[int]:
    try:
        names = os.listdir(slot)
    except FileNotFoundError:
        return []
    return sorted(int(n[:-len(_SEG)]) for n in names if n.endswith(_SEG) and n[:-len(_SEG)].isdigit())


def segment_path(slot: str, number: int) -> str:
    return os.path.join(slot, f"{number:020d}{_SEG}")


def claim_slot(root: str) -> tuple[str, int]:
    """The first slot no running tooltap holds, locked; segments of slots left behind by
    dead instances are moved into it (their writers gone too), to be stored first."""
    os.makedirs(root, mode=0o700, exist_ok=True)  # owner-only, as the segments in it
    k = 0
    while True:
        slot = os.path.join(root, str(k))
        os.makedirs(slot, mode=0o700, exist_ok=True)
        fd = _lock(os.path.join(slot, "lock"), block=False)
        if fd is not None:
            break
        k += 1
    for name in sorted(os.listdir(root)):
        other = os.path.join(root, name)
        if other == slot or not os.path.isdir(other) or not segments(other):
            continue
        held = [_lock(os.path.join(other, "lock"), block=False)]
        if held[0] is not None:
            held.append(_lock(os.path.join(other, "writer.lock"), block=False))
        if None not in held:
            for n in segments(other):
                if not os.path.exists(segment_path(slot, n)):
                    os.rename(segment_path(other, n), segment_path(slot, n))
            log.info("journal: took over the turns left in %s by a tooltap that stopped", other)
        for h in held:
            if h is not None:
                os.close(h)
    return slot, fd


def lock_writer(slot: str) -> int:
    """The writer's own lock on its slot: a writer whose proxy was killed may still be
    finishing a batch; its successor waits for it instead of storing the same turns."""
    path = os.path.join(slot, "writer.lock")
    fd = _lock(path, block=False)
    if fd is None:
        log.info("journal: waiting for the previous writer process to finish")
        fd = _lock(path, block=True)
    return fd


def _fsync_dir(path: str) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _reserve(fd: int, size: int) -> None:
    if hasattr(os, "posix_fallocate"):
        os.posix_fallocate(fd, 0, size)


# -- the proxy's side ---------------------------------------------------------------------


class _Mark:
    def __init__(self) -> None:
        self.done = threading.Event()
        self.position: Position = (0, 0)


_STOP = object()


class Journal:
    """Takes finished turns from the request path (`submit`, a queue put) and appends
    them to the slot's current segment on a thread of its own."""

    def __init__(self, root: str, *, fsync_seconds: float = FSYNC_SECONDS, segment_bytes: int = SEGMENT_BYTES):
        self.root = root
        self.fsync_seconds = fsync_seconds
        self.segment_bytes = segment_bytes
        self.slot = ""
        self.lost = 0  # turns that could not be written before tooltap stopped
        self._queue: queue.SimpleQueue = queue.SimpleQueue()
        self._held: collections.deque[tuple[str, TurnRecord]] = collections.deque()  # accepted, not on disk
        self._recent = Recent()  # the last body of each conversation, for the next one to name
        self._ends: dict[int, array] = {}  # frame end offsets per segment, for the backlog
        self._lock = threading.Lock()
        self._slot_fd: int | None = None
        self._fd: int | None = None
        self._number = 0
        self._offset = 0
        self._opened_at = 0.0
        self._unsynced = False
        self._synced_at = 0.0
        self._retry_at = 0.0
        self._full_since: float | None = None
        self._said_at = 0.0
        self._full_reason = ""
        self._short_said = False  # the warning that no spare segment could be reserved
        self._thread: threading.Thread | None = None

    # the request path and the writer's bookkeeping

    def start(self) -> None:
        self.slot, self._slot_fd = claim_slot(self.root)
        for n in segments(self.slot):
            self._ends[n] = frame_ends(segment_path(self.slot, n))
        self._number = max(self._ends, default=0)
        if self._number:  # the end of what earlier runs left, until a segment of our own opens
            self._offset = self._ends[self._number][-1] if self._ends[self._number] else 0
        try:  # now, not at the first turn: the space is reserved before it is needed
            self._open_segment()
        except OSError as exc:
            log.error("journal: cannot open a segment in %s (%s); turns will wait in memory until "
                      "it can", self.slot, exc.strerror or exc)
        self._thread = threading.Thread(target=self._run, name="tooltap-journal", daemon=True)
        self._thread.start()

    def submit(self, record: TurnRecord) -> None:
        self._queue.put(record)

    def mark(self, timeout: float = 10.0) -> Position:
        """Wait until every turn submitted so far is written (or held); the end of the data."""
        m = _Mark()
        self._queue.put(m)
        m.done.wait(timeout)
        return m.position

    def end(self) -> Position:
        return (self._number, self._offset)

    @property
    def held(self) -> int:
        return len(self._held)

    def pending(self) -> int:
        """Turns accepted and not yet on disk."""
        return self._queue.qsize() + len(self._held)

    def backlog(self, confirmed: Position) -> tuple[int, int]:
        """Turns and bytes on disk after `confirmed` (what the writer has yet to take care of)."""
        turns = size = 0
        with self._lock:
            for n, ends in self._ends.items():
                if not ends or n < confirmed[0]:
                    continue
                start = confirmed[1] if n == confirmed[0] else 0
                i = bisect.bisect_right(ends, start)
                turns += len(ends) - i
                size += max(0, ends[-1] - start)
        return turns, size

    def forget_before(self, number: int) -> None:
        """The writer deleted the segments before `number`."""
        with self._lock:
            for n in [n for n in self._ends if n < number]:
                del self._ends[n]

    def close(self) -> None:
        """Write what is left (a last try for held turns), fsync, stop the thread."""
        if self._thread is None:
            return
        self._queue.put(_STOP)
        self._thread.join()
        self._thread = None

    def hand_over(self, spool, confirmed: Position, max_bytes: int = HAND_OVER_BYTES) -> int:
        """At shutdown: the turns the writer did not confirm go to the spool, and the
        segments go. Returns how many moved. A long backlog (over `max_bytes`), or one the
        spool cannot take, stays in the journal instead: the next start stores it."""
        turns, size = self.backlog(confirmed)
        if size > max_bytes:
            log.warning("journal: %d turn(s) not stored yet wait in %s; the next start stores them",
                        turns, self.slot)
            return 0
        moved = 0
        reader = JournalReader(self.slot, start=confirmed, sealed=True)
        try:
            while batch := reader.read(32 << 20):
                spool.append(batch)
                moved += len(batch)
        except OSError as exc:
            log.error("journal: could not move the unstored turns to the spool (%s); they stay in %s "
                      "and are stored at the next start", exc, self.slot)
            return moved
        finally:
            reader.close()
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None
        for n in segments(self.slot):
            os.remove(segment_path(self.slot, n))
        return moved

    def release(self) -> None:
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None
        try:
            os.remove(os.path.join(self.slot, _SPARE))
        except OSError:
            pass
        if self._slot_fd is not None:
            os.close(self._slot_fd)
            self._slot_fd = None

    # the journal thread

    def _run(self) -> None:
        stopping = False
        while not stopping:
            try:
                item = self._queue.get(timeout=self._wait())
            except queue.Empty:
                item = None
            busy = item is not None
            marks = []
            while True:
                if item is _STOP:
                    stopping = True
                elif isinstance(item, _Mark):
                    marks.append(item)
                elif item is not None:
                    self._held.append((item.uid or uuid.uuid4().hex, item))
                try:
                    item = self._queue.get_nowait()
                except queue.Empty:
                    break
            try:
                self._write_held(force=stopping)
                if self._unsynced and (stopping or time.monotonic() >= self._synced_at + self.fsync_seconds):
                    self._sync()
            except Exception:  # the journal must outlive any bug; the turns stay held
                log.exception("journal error")
            for m in marks:
                m.position = self.end()
                m.done.set()
            if busy and not stopping and not self._held:
                # Busy: let turns gather before the next batch. Asleep here, the thread is
                # not waiting on the queue, so the request path's put wakes nobody (a wake
                # costs the event loop more than the put itself, on every turn).
                time.sleep(GATHER_SECONDS)
        if self._held:
            self.lost += len(self._held)
            log.error("LOST %d answered turn(s): the journal at %s could not be written until tooltap "
                      "stopped (%s)", len(self._held), self.slot or self.root, self._full_reason)
            for _, record in self._held:
                record.release()
            self._held.clear()

    def _wait(self) -> float | None:
        if self._held:
            return max(0.01, self._retry_at - time.monotonic())
        if self._unsynced:
            return max(0.0, self._synced_at + self.fsync_seconds - time.monotonic())
        return None

    def _write_held(self, force: bool = False) -> None:
        if not self._held or (not force and time.monotonic() < self._retry_at):
            return
        try:
            while self._held:
                uid, record = self._held[0]
                try:
                    self._append(uid, record)
                except OSError:
                    raise
                except Exception:  # this turn, not the disk: it must not hold back the others
                    log.exception("LOST 1 answered turn: it could not be written to the journal (a bug)")
                    self.lost += 1
                self._held.popleft()
                record.release()
        except OSError as exc:
            self._retry_at = time.monotonic() + RETRY_SECONDS
            self._say_full(exc)
            return
        if self._full_since is not None:
            log.warning("journal: disk space is back after %.0f s; the held turns are on disk",
                        time.monotonic() - self._full_since)
            self._full_since = None

    def _say_full(self, exc: OSError) -> None:
        now = time.monotonic()
        self._full_reason = exc.strerror or str(exc)
        if self._full_since is None:
            self._full_since = now
        elif now - self._said_at < SAY_AGAIN_SECONDS:
            return
        self._said_at = now
        size = sum(len(r.request_body) + (len(r.raw) if isinstance(r.raw, bytes) else 0) for _, r in self._held)
        log.error("%s: cannot write the journal at %s (%s): %d answered turn(s) held in memory "
                  "(%.2f MB) until space returns; stopping tooltap now would lose them",
                  "DISK FULL" if exc.errno in (errno.ENOSPC, errno.EDQUOT) else "JOURNAL FAILING",
                  self.slot or self.root, self._full_reason, len(self._held), size / 1e6)

    def _append(self, uid: str, record: TurnRecord) -> None:
        body, hint = record.request_body, record.session_hint
        frame = Frame(record, uid, self._recent.base_for(body, hint))
        if self._fd is None:
            self._open_segment()
        elif self._offset and (self._offset + frame.size > self.segment_bytes
                               or time.monotonic() - self._opened_at > ROLL_SECONDS):
            self._open_segment()
        start = self._offset
        try:
            end = frame.write(self._fd, start)
        except OSError:
            try:  # a zero length ends the data where the frame began: the reader sees no half frame
                _pwrite(self._fd, bytes(_LEN.size), start)
            except OSError:
                os.ftruncate(self._fd, start)
            raise
        self._offset, self._unsynced = end, True
        with self._lock:
            self._ends[self._number].append(end)
        self._recent.wrote(body, hint, uid)

    def _open_segment(self) -> None:
        """A new segment (the spare one if it is there), then a new spare."""
        number = max(time.time_ns(), self._number + 1)
        path, spare = segment_path(self.slot, number), os.path.join(self.slot, _SPARE)
        if os.path.exists(spare):
            os.rename(spare, path)
            fd = os.open(path, os.O_WRONLY)
        else:
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
            try:
                _reserve(fd, self.segment_bytes)
            except OSError:
                pass  # written as it grows, while the disk lets it
        _fsync_dir(self.slot)
        if self._fd is not None:
            if self._unsynced:
                os.fdatasync(self._fd)
            os.close(self._fd)
        with self._lock:
            self._ends[number] = array("Q")
        self._fd, self._number, self._offset, self._opened_at = fd, number, 0, time.monotonic()
        self._make_spare(spare)

    def _make_spare(self, spare: str) -> None:
        try:
            fd = os.open(spare, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        except OSError:
            return
        try:
            _reserve(fd, self.segment_bytes)
        except OSError as exc:
            os.close(fd)
            os.remove(spare)
            if not self._short_said:
                log.warning("journal: cannot reserve %.2f MB for the next segment in %s (%s): the disk "
                            "is nearly full", self.segment_bytes / 2**20, self.slot, exc.strerror or exc)
                self._short_said = True
            return
        os.close(fd)
        self._short_said = False

    def _sync(self) -> None:
        if self._fd is not None:
            os.fdatasync(self._fd)
        self._unsynced, self._synced_at = False, time.monotonic()


# -- the writer's side ---------------------------------------------------------------------


class JournalReader:
    """The turns of a slot, oldest first, as they are written. `read()` hands out what is
    complete; `confirm()` takes back the turns stored (or spooled) and deletes a segment
    once all of its turns are."""

    def __init__(self, slot: str, start: Position = (0, 0), sealed: bool = False):
        self.slot = slot
        self._sealed_all = sealed  # nobody writes any more: the last segment is sealed too
        self._pos: Position = start  # one attribute: read whole from the writer thread
        self._file = None
        self._lock = threading.RLock()
        self._out: collections.deque[list] = collections.deque()  # [uid, number, start, size, done]
        self._waiting: dict[str, list] = {}
        self.outstanding_bytes = 0
        self._deleter = _Deleter()
        self._bodies = _Bodies()  # the last ones read: the bases of the frames after them

    @property
    def position(self) -> Position:
        """How far reading got."""
        return self._pos

    @property
    def confirmed(self) -> Position:
        """Every turn before this position is taken care of."""
        with self._lock:
            return tuple(self._out[0][1:3]) if self._out else self._pos

    def read(self, budget: int) -> list[JournaledTurn]:
        """Complete turns from the read position on, about `budget` bytes (at least one)."""
        out: list[JournaledTurn] = []
        used = 0
        while used < budget or not out:
            with self._lock:  # a turn read is a turn outstanding, at once
                frame = self._next_frame()
                if frame is None:
                    break
                n, values, body, raw = frame
                try:
                    if isinstance(values, Exception):
                        raise values
                    entry = journaled_turn(values, body, raw)
                except (ValueError, TypeError, KeyError, pickle.UnpicklingError, EOFError) as exc:
                    log.error("journal: skipped an unreadable turn in %s (%s)", self._path(), exc)
                    continue
                self._bodies.keep(entry.uid, entry.body(), entry.extends and entry.extends[0])
                number, end = self._pos
                item = [entry.uid, number, end - n - _OVERHEAD, n, False]
                self._out.append(item)
                self._waiting[entry.uid] = item
                self.outstanding_bytes += n
            used += n
            out.append(entry)
        return out

    def confirm(self, records) -> None:
        """These turns are taken care of (stored, spooled or quarantined)."""
        with self._lock:
            for r in records:
                item = self._waiting.pop(getattr(r, "uid", ""), None)
                if item is not None:
                    item[4] = True
            moved = False
            while self._out and self._out[0][4]:
                self.outstanding_bytes -= self._out.popleft()[3]
                moved = True
            if moved:
                self._trim()

    def close(self) -> None:
        self._close_file()
        self._deleter.finish()

    def _close_file(self) -> None:
        if self._file is not None:
            self._file.close()
            self._file = None

    def _trim(self) -> None:
        """Delete the segments before the oldest turn still needed."""
        oldest_needed = self._out[0][1] if self._out else self._pos[0]
        for n in segments(self.slot):
            if n >= oldest_needed:
                break
            self._deleter.delete(segment_path(self.slot, n))

    def _path(self) -> str:
        return segment_path(self.slot, self._pos[0])

    def _frame_at(self, fd: int, offset: int) -> tuple[int, dict | Exception, bytes | Spliced, bytes] | None:
        """The complete frame at `offset`: its payload's length, its header's values (or
        why they cannot be read), request body and raw response; None if there is none
        (yet), or it is torn. A body that extends one remembered comes as a `Spliced` over
        it: the bytes they share are not read."""
        head = os.pread(fd, _LEN.size + _PARTS.size, offset)
        n = _LEN.unpack_from(head)[0] if len(head) >= _LEN.size + _PARTS_V1.size else 0
        if not n:
            return None
        if len(head) == _LEN.size + _PARTS.size:
            lengths = _PARTS.unpack_from(head, _LEN.size)
            if _PARTS.size + sum(lengths[:3]) == n:
                return self._frame_v2(fd, offset, n, head[_LEN.size:], *lengths)
        lengths = _PARTS_V1.unpack_from(head, _LEN.size)
        if _PARTS_V1.size + sum(lengths) != n:
            return None
        at = _LEN.size + _PARTS_V1.size
        parts = _read_parts(fd, offset + at, lengths, head[_LEN.size:at])
        return (n, _values(parts[0]), *parts[1:]) if parts else None

    def _frame_v2(self, fd: int, offset: int, n: int, parts: bytes, header_len: int, body_len: int,
                  raw_len: int, header_crc: int, tail_crc: int):
        at = offset + _LEN.size + _PARTS.size
        header = os.pread(fd, header_len, at)
        lengths = _LENGTHS.pack(header_len, body_len, raw_len)
        if len(header) != header_len or zlib_ng.crc32(header, zlib_ng.crc32(lengths)) != header_crc:
            return None
        values = _values(header)
        named = values.get("base") if isinstance(values, dict) else None
        uid, shared = named if isinstance(named, tuple) and len(named) == 2 else ("", 0)
        base = self._bodies.get(uid) if shared else None
        if base is not None and shared <= min(len(base), body_len):
            at += header_len + shared
            rest, raw = os.pread(fd, body_len - shared, at), os.pread(fd, raw_len, at + body_len - shared)
            if (len(rest), len(raw)) == (body_len - shared, raw_len) and \
                    zlib_ng.crc32(raw, zlib_ng.crc32(rest)) == tail_crc:
                return n, values, Spliced(base, shared, rest), raw
            return None
        whole = _read_parts(fd, at + header_len, (body_len, raw_len), parts + header)
        return (n, values, *whole) if whole else None

    def _next_frame(self) -> tuple[int, dict | Exception, bytes | Spliced, bytes] | None:
        """The next complete frame (see `_frame_at`)."""
        while True:
            if self._file is None and not self._open_current():
                return None
            number, offset = self._pos
            # pread on a raw file: a buffered reader would serve the zeros it read ahead
            frame = self._frame_at(self._file.fileno(), offset)
            if frame is not None:
                self._pos = (number, offset + frame[0] + _OVERHEAD)
                return frame
            # The end of the data, or a frame still being written, or one torn by a crash.
            later = [k for k in segments(self.slot) if k > number]
            if not later and not self._sealed_all:
                return None
            if os.pread(self._file.fileno(), _LEN.size, offset).strip(b"\0"):
                log.warning("journal: %s ends in an incomplete turn (torn by a crash); the rest of "
                            "that segment is skipped", self._path())
            self._close_file()
            self._pos = (later[0] if later else number + 1, 0)
            self._trim()

    def _open_current(self) -> bool:
        numbers = [n for n in segments(self.slot) if n >= self._pos[0]]
        if not numbers:
            return False
        if numbers[0] != self._pos[0]:
            self._pos = (numbers[0], 0)
        try:
            self._file = open(self._path(), "rb", buffering=0)
        except FileNotFoundError:
            return False
        return True


class _Deleter:
    """Deletes used segments on a thread of its own: freeing a segment's blocks takes the
    file system a few milliseconds, mostly waiting, which the writer need not wait for.
    (One left undeleted by a crash is read again, its turns skipped as stored.)"""

    def __init__(self) -> None:
        self._queue: queue.SimpleQueue = queue.SimpleQueue()
        self._queued: set[str] = set()
        self._thread: threading.Thread | None = None

    def delete(self, path: str) -> None:
        if path in self._queued:
            return
        self._queued.add(path)
        if self._thread is None:
            self._thread = threading.Thread(target=self._run, name="tooltap-journal-trim", daemon=True)
            self._thread.start()
        self._queue.put(path)

    def finish(self) -> None:
        """Wait for the deletions asked so far."""
        if self._thread is not None:
            self._queue.put(None)
            self._thread.join()
            self._thread = None

    def _run(self) -> None:
        while (path := self._queue.get()) is not None:
            try:
                os.remove(path)
            except FileNotFoundError:
                pass
            self._queued.discard(path)
