"""Files tooltap writes its captures to are their owner's alone: prompts, code and
answers are in them."""

from __future__ import annotations

import os
from pathlib import Path


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


class FolderError(Exception):
    """A folder that cannot be made, in one line: why."""


def make_folders(directory: str | os.PathLike) -> list[Path]:
    """`mkdir -p DIRECTORY` (`tests/recorded/` in a project without `tests/` yet), each
    folder owner-only, as what goes in them is. Returns the folders made, outermost
    first; on failure none is left."""
    missing, existing = [], Path(directory).absolute()
    while not os.path.lexists(existing):
        missing.append(existing)
        existing = existing.parent
    if not existing.is_dir():
        raise FolderError(f"{existing} is not a folder")
    made: list[Path] = []
    try:
        for folder in reversed(missing):
            folder.mkdir(mode=0o700)
            made.append(folder)
    except OSError as exc:
        remove_folders(made)
        raise FolderError(exc.strerror or str(exc)) from None
    return made


def remove_folders(folders: list[Path]) -> None:
    """Undo make_folders (folders still empty only)."""
    for folder in reversed(folders):
        try:
            folder.rmdir()
        except OSError:
            pass
