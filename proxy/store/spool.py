"""The spool: where turns wait when the database cannot take them (locked, down, disk full).

One JSON line per turn, bytes in base64. The writer appends here instead of dropping a
turn, and replays the file into the database once it answers again, a batch at a time
(memory stays flat however long the outage was). A turn keeps its unique id in the
spool, so a replay cut short by a crash and started again stores nothing twice.
"""

from __future__ import annotations

import base64
import dataclasses
import json
import logging
import os
import shutil
import threading
from typing import Iterator

from ..capture import TurnRecord
from .files import private
from .journal import JournaledTurn

_BYTES = ("request_body", "raw")

log = logging.getLogger("tooltap.store")


def encode(record: TurnRecord) -> str:
    data = dataclasses.asdict(dataclasses.replace(record, raw=b"", seq=0))  # a receipt is per run
    data.pop("extends", None)  # the journal's hint, good for one writer's memory only
    data["request_body"] = base64.b64encode(record.request_body).decode()
    data["raw"] = base64.b64encode(record.raw_bytes()).decode()
    return json.dumps(data)  # ASCII: one line per turn, whatever the text holds


def decode(line: str | bytes) -> TurnRecord:
    data = json.loads(line)
    for key in _BYTES:
        data[key] = base64.b64decode(data[key])
    return JournaledTurn(**data) if "uid" in data else TurnRecord(**data)


class Spool:
    def __init__(self, path: str):
        self.path = path
        self._lock = threading.Lock()
        self.count = sum(_lines(p) for p in (path, self._replaying))  # turns waiting here
        self._stuck_at: int | None = None  # a line replay could neither read nor move to .bad

    def append(self, records: list[TurnRecord]) -> None:
        self._append(self.path, records)
        self.count += len(records)

    def _append(self, path: str, records: list[TurnRecord]) -> None:
        """Whole lines or nothing: a write the disk cuts short (full) is taken back, and a
        line an earlier run left torn (killed mid-write) is ended first, so no turn's line
        is ever glued onto a fragment and lost with it."""
        data = "".join(encode(r) + "\n" for r in records).encode()  # ASCII (encode)
        with self._lock:
            fd = private(path, os.O_RDWR | os.O_CREAT | os.O_APPEND)
            try:
                start = os.lseek(fd, 0, os.SEEK_END)
                if start and os.pread(fd, 1, start - 1) != b"\n":
                    data = b"\n" + data
                try:
                    view = memoryview(data)
                    while view:
                        view = view[os.write(fd, view):]
                    os.fsync(fd)
                except OSError:
                    try:
                        os.ftruncate(fd, start)
                    except OSError:
                        pass
                    raise
            finally:
                os.close(fd)

    @property
    def failed_path(self) -> str:
        return self.path + ".failed"

    def quarantine(self, records: list[TurnRecord]) -> None:
        """Turns that the database took but tooltap could not store (a bug): kept whole
        for a later version to import, never replayed in a loop."""
        self._append(self.failed_path, records)

    def pending(self) -> bool:
        return any(_size(p) for p in (self.path, self._replaying))

    def size(self) -> int:
        return _size(self.path) + _size(self._replaying)

    @property
    def _replaying(self) -> str:
        return self.path + ".replaying"

    def replay(self, max_records: int, max_bytes: int) -> Iterator[tuple[list[TurnRecord], list[int]]]:
        """The spooled turns, oldest first, in batches of at most `max_records` turns or
        about `max_bytes`, each turn with the offset of its line in the `.replaying` file
        (for `keep_from`). The file stays until `done()`, so a crash mid-replay loses
        nothing: the next replay reads it again. A line that does not parse is moved to
        `.bad`, never discarded."""
        with self._lock:
            if _size(self.path):
                if os.path.exists(self._replaying):
                    with open(self.path, "rb") as src, open(self._replaying, "ab", opener=private) as dst:
                        shutil.copyfileobj(src, dst)
                        dst.flush()
                        os.fsync(dst.fileno())
                    os.remove(self.path)
                else:
                    os.replace(self.path, self._replaying)
        try:
            f = open(self._replaying, "rb")
        except FileNotFoundError:
            return
        with f:
            batch, offsets, size, offset = [], [], 0, 0
            for line in f:  # split on b"\n" only: U+2028 inside a line is not an end
                start, offset = offset, offset + len(line)
                if not line.strip():
                    continue
                try:
                    batch.append(decode(line))
                    offsets.append(start)
                    size += len(line)
                except (ValueError, TypeError, KeyError):
                    if not self._set_aside(line):
                        self._stuck_at = start  # it and the lines after it wait for room
                        break
                if len(batch) >= max_records or size >= max_bytes:
                    yield batch, offsets
                    batch, offsets, size = [], [], 0
            if batch:
                yield batch, offsets

    def _set_aside(self, line: bytes) -> bool:
        """Move a line that does not parse to `.bad`; False if the disk will not take it."""
        try:
            with open(self.path + ".bad", "ab", opener=private) as bad:
                bad.write(line if line.endswith(b"\n") else line + b"\n")
            return True
        except OSError as exc:
            log.error("spool: a line that does not parse could not be moved to %s.bad (%s); it and the turns "
                      "after it stay in %s until there is room", self.path, exc.strerror or exc, self._replaying)
            return False

    def stored(self, n: int) -> None:
        """`n` replayed turns are in the database."""
        self.count = max(0, self.count - n)

    def keep_from(self, offset: int) -> None:
        """A replay stopped part way: the turns from `offset` on wait for the next one.
        If the rest cannot be rewritten (a full disk), the whole file is read again next
        time; the turns already stored are recognised by their ids."""
        tmp = self._replaying + ".tmp"
        try:
            with self._lock:
                with open(self._replaying, "rb") as src, open(tmp, "wb", opener=private) as dst:
                    src.seek(offset)
                    shutil.copyfileobj(src, dst)
                    dst.flush()
                    os.fsync(dst.fileno())
                os.replace(tmp, self._replaying)
        except OSError:
            try:
                os.remove(tmp)
            except OSError:
                pass

    def done(self) -> bool:
        """The replayed turns are in the database (or back in the spool). False when the
        replay stopped at a line it could not set aside: the rest waits for the next one."""
        if self._stuck_at is not None:
            offset, self._stuck_at = self._stuck_at, None
            self.keep_from(offset)
            return False
        with self._lock:
            try:
                os.remove(self._replaying)
            except FileNotFoundError:
                pass
            self.count = _lines(self.path)
        return True


def _size(path: str) -> int:
    try:
        return os.path.getsize(path)
    except OSError:
        return 0


def _lines(path: str) -> int:
    n = 0
    try:
        with open(path, "rb") as f:
            while chunk := f.read(1 << 20):
                n += chunk.count(b"\n")
    except OSError:
        pass
    return n
