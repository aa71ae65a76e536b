"""Where MCP records wait while the database cannot take them.

A folder of JSON-lines files, one per recording process (`<pid>-<id>.jsonl`), so several
wrapped servers and a `tooltap serve` never write the same file. A process replays its
own file once the database answers, renaming it first so that what it appends meanwhile
goes to a fresh file. A file whose process is gone (it exited while the database was
down) is adopted by the next recorder that starts. Every record is idempotent in the
database (messages are unique by connection and sequence number), so a file read twice
stores nothing twice.

A folder that cannot be written (a read-only project folder beside the database) is given
up for the user's cache folder for that database, which every recorder also looks in.
"""

from __future__ import annotations

import base64
import json
import logging
import os
import threading
import uuid
from pathlib import Path
from typing import Iterator

from ..store.files import private

log = logging.getLogger("tooltap.mcp")

_BYTES = ("raw", "tools")


def default_dir(db_url: str) -> Path:
    """Beside the SQLite file; for Postgres, in the user's cache folder (a wrapper runs
    in whatever folder the agent started it)."""
    from ..store.db import sqlite_path

    path = sqlite_path(db_url)
    if path is not None:
        return path.parent / f"{path.name}.mcp-spool"
    return fallback_dir(db_url)


def fallback_dir(db_url: str) -> Path:
    """The database's spool folder in the user's cache folder."""
    import hashlib

    base = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache")
    return base / "tooltap" / f"mcp-spool-{hashlib.sha256(db_url.encode()).hexdigest()[:12]}"


def encode(op: dict) -> str:
    data = dict(op)
    for key in _BYTES:
        if isinstance(data.get(key), bytes):
            data[key] = base64.b64encode(data[key]).decode("ascii")
    return json.dumps(data, ensure_ascii=True)


def decode(line: bytes) -> dict:
    data = json.loads(line)
    for key in _BYTES:
        if isinstance(data.get(key), str):
            data[key] = base64.b64decode(data[key])
    return data


class McpSpool:
    def __init__(self, folder: str | Path, fallback: str | Path | None = None):
        self.folders = [Path(folder)] + ([Path(fallback)] if fallback and Path(fallback) != Path(folder) else [])
        self.folder = self.folders[0]  # where this process writes
        self.name = f"{os.getpid()}-{uuid.uuid4().hex[:12]}"
        self.path = self.folder / f"{self.name}.jsonl"
        self._lock = threading.Lock()

    def append(self, ops: list[dict]) -> None:
        data = "".join(encode(op) + "\n" for op in ops)
        with self._lock:
            while True:
                try:
                    self.folder.mkdir(mode=0o700, parents=True, exist_ok=True)
                    with open(self.path, "a", encoding="ascii", opener=private) as f:
                        f.write(data)
                        f.flush()
                        os.fsync(f.fileno())
                    return
                except OSError as exc:
                    at = self.folders.index(self.folder)
                    if at + 1 == len(self.folders):
                        raise
                    self.folder = self.folders[at + 1]
                    self.path = self.folder / f"{self.name}.jsonl"
                    log.warning("cannot write the MCP spool in %s (%s); spooling to %s instead",
                                self.folders[at], exc.strerror or exc, self.folder)

    def pending(self) -> bool:
        return self.path.exists() or any(self._mine_replaying())

    def take(self) -> list[Path]:
        """Files to replay, oldest first: this process's own (renamed, so appends go to
        a fresh file) and those of processes that are gone (claimed by renaming)."""
        taken = list(self._mine_replaying())
        with self._lock:
            if self.path.exists():
                target = self.folder / f"{self.name}.{uuid.uuid4().hex[:8]}.replaying"
                os.replace(self.path, target)
                taken.append(target)
        for folder in (f for f in self.folders if f.is_dir()):
            for p in sorted(folder.iterdir(), key=_mtime):
                owner = p.name.split("-", 1)[0]
                if p.name.startswith(self.name) or not owner.isdigit() or _alive(int(owner)):
                    continue
                if p.suffix in (".jsonl", ".replaying"):
                    target = folder / f"{self.name}.{uuid.uuid4().hex[:8]}.replaying"
                    try:
                        os.replace(p, target)  # atomic: one adopter wins
                    except FileNotFoundError:
                        continue
                    taken.append(target)
        return sorted(taken, key=_mtime)

    @staticmethod
    def read(path: Path, batch: int) -> Iterator[list[dict]]:
        ops: list[dict] = []
        with open(path, "rb") as f:
            for line in f:
                if not line.strip():
                    continue
                try:
                    ops.append(decode(line))
                except ValueError:
                    with open(str(path) + ".bad", "ab", opener=private) as bad:
                        bad.write(line if line.endswith(b"\n") else line + b"\n")
                if len(ops) >= batch:
                    yield ops
                    ops = []
        if ops:
            yield ops

    @staticmethod
    def done(path: Path) -> None:
        path.unlink(missing_ok=True)

    def _mine_replaying(self) -> Iterator[Path]:
        for folder in (f for f in self.folders if f.is_dir()):
            yield from folder.glob(f"{self.name}.*.replaying")


def _mtime(p: Path) -> float:
    try:
        return p.stat().st_mtime
    except OSError:
        return 0.0


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True
