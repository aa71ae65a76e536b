"""The spool: where turns wait when the database cannot take them (locked, down, disk full).

One JSON line per turn, bytes in base64. The writer appends here instead of dropping a
turn, and replays the file into the database once it answers again.
"""

from __future__ import annotations

import base64
import dataclasses
import json
import os
import threading

from ..capture import TurnRecord

_BYTES = ("request_body", "raw")


def encode(record: TurnRecord) -> str:
    data = dataclasses.asdict(dataclasses.replace(record, raw=b"", seq=0))  # a receipt is per run
    data["request_body"] = base64.b64encode(record.request_body).decode()
    data["raw"] = base64.b64encode(record.raw_bytes()).decode()
    return json.dumps(data)  # ASCII: one line per turn, whatever the text holds


def decode(line: str) -> TurnRecord:
    data = json.loads(line)
    for key in _BYTES:
        data[key] = base64.b64decode(data[key])
    return TurnRecord(**data)


class Spool:
    def __init__(self, path: str):
        self.path = path
        self._lock = threading.Lock()

    def append(self, records: list[TurnRecord]) -> None:
        self._append(self.path, records)

    def _append(self, path: str, records: list[TurnRecord]) -> None:
        lines = "".join(encode(r) + "\n" for r in records)
        with self._lock, open(path, "a", encoding="utf-8") as f:
            f.write(lines)
            f.flush()
            os.fsync(f.fileno())

    @property
    def failed_path(self) -> str:
        return self.path + ".failed"

    def quarantine(self, records: list[TurnRecord]) -> None:
        """Turns that the database took but tooltap could not store (a bug): kept whole
        for a later version to import, never replayed in a loop."""
        self._append(self.failed_path, records)

    def pending(self) -> bool:
        return any(_size(p) for p in (self.path, self._replaying))

    @property
    def _replaying(self) -> str:
        return self.path + ".replaying"

    def take(self) -> list[TurnRecord]:
        """Move the spooled turns out of the spool for a replay. The `.replaying` file stays
        until `done()`, so a crash mid-replay loses nothing: the next take reads it again.
        A line that does not parse is moved to `.bad`, never discarded."""
        with self._lock:
            if _size(self.path):
                with open(self.path, "rb") as src, open(self._replaying, "ab") as dst:
                    dst.write(src.read())
                os.remove(self.path)
            try:
                with open(self._replaying, encoding="utf-8") as f:
                    lines = f.read().split("\n")  # not splitlines: U+2028 may sit in a line
            except FileNotFoundError:
                return []
        records, bad = [], []
        for line in lines:
            if line.strip():
                try:
                    records.append(decode(line))
                except (ValueError, TypeError, KeyError):
                    bad.append(line + "\n")
        if bad:
            with open(self.path + ".bad", "a", encoding="utf-8") as f:
                f.writelines(bad)
        return records

    def keep(self, records: list[TurnRecord]) -> None:
        """A replay stopped part way: these (oldest first) wait for the next take."""
        tmp = self._replaying + ".tmp"
        with self._lock:
            with open(tmp, "w", encoding="utf-8") as f:
                f.write("".join(encode(r) + "\n" for r in records))
                f.flush()
                os.fsync(f.fileno())
            os.replace(tmp, self._replaying)

    def done(self) -> None:
        """The taken turns are in the database (or back in the spool)."""
        with self._lock:
            try:
                os.remove(self._replaying)
            except FileNotFoundError:
                pass


def _size(path: str) -> int:
    try:
        return os.path.getsize(path)
    except OSError:
        return 0
