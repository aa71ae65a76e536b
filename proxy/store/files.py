"""Files tooltap writes its captures to are their owner's alone: prompts, code and
answers are in them."""

from __future__ import annotations

import os


def private(path: str, flags: int) -> int:
    """An `open()` opener: a file it creates can be read by its owner only."""
    return os.open(path, flags, 0o600)


def create_private(path: str) -> None:
    """Create `path` empty, owner-only, unless it exists (SQLite then gives the same mode to
    the database's -wal and -shm files)."""
    try:
        os.close(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600))
    except FileExistsError:
        pass


def write_private(path: str | os.PathLike, data: bytes) -> None:
    """Write `data` to `path` (an export: a HAR, a cassette), readable by its owner only,
    as the database is; a file that was there is overwritten and made so too."""
    with open(path, "wb", opener=private) as f:
        os.fchmod(f.fileno(), 0o600)
        f.write(data)
