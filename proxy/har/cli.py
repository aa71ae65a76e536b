"""`tooltap import FILE.har`, and the `--har FILE` of `tooltap export`."""

from __future__ import annotations

import json
from pathlib import Path

import click

from ..config import DEFAULT_DB
from ..store.files import FolderError, make_folders, remove_folders, write_private
from . import HarError


class HarProblem(click.ClickException):
    exit_code = 2


def write_har(db_url: str, session_id: str, path: str) -> int:
    """`tooltap export SESSION --har FILE` (`-`: standard output): returns the number of
    entries written."""
    from ..replay.recording import RecordingError, open_reader
    from .export import session_har

    try:
        har = session_har(open_reader(db_url), session_id)
    except (RecordingError, HarError) as exc:
        raise HarProblem(str(exc)) from None
    if path == "-":
        click.echo(json.dumps(har, indent=1))  # escaped: whatever the terminal's encoding
        _warn_of_secrets(har, "the HAR")
        return len(har["log"]["entries"])
    target = Path(path)
    try:
        made = make_folders(target.absolute().parent)  # as --pytest DIR does
    except FolderError as exc:
        raise HarProblem(f"cannot write {path}: {exc}") from None
    text = json.dumps(har, ensure_ascii=False, indent=1)
    try:
        data = text.encode("utf-8")
    except UnicodeEncodeError:  # a lone surrogate a model wrote: escaped, as JSON can
        data = json.dumps(har, indent=1).encode("ascii")
    try:
        write_private(target, data)  # prompts and answers: the owner's alone, as the database is
    except OSError as exc:
        remove_folders(made)
        raise HarProblem(f"cannot write {path}: {exc.strerror or exc}") from None
    _warn_of_secrets(har, path)
    return len(har["log"]["entries"])


def _warn_of_secrets(har: dict, name: str) -> None:
    """A HAR is meant to hold the bodies, so a key pasted into one is written all the same
    (the pytest export refuses it): the user is told, on stderr, before sharing the file."""
    from .export import har_secrets

    found = [str(f) for f in har_secrets(har)]
    if found:
        shown = "; ".join(found[:5]) + (f"; and {len(found) - 5} more" if len(found) > 5 else "")
        click.echo(f"warning: {name} holds {len(found)} key-like value(s) in clear: {shown}", err=True)


@click.command("import", short_help="Load a HAR file (devtools, mitmproxy, tooltap) into the store.")
@click.argument("path", metavar="FILE.har", type=click.Path(dir_okay=False))
@click.option("--db", "db_url", envvar="TOOLTAP_DB", show_envvar=True, default=DEFAULT_DB, show_default=True,
              metavar="URL",
              help="The tooltap database to load into (created if missing).")
@click.option("--all-requests", is_flag=True,
              help="Also store entries that are no model call (pages, images, model lists).")
def import_command(path, db_url, all_requests) -> None:
    """Load a HAR file (browser devtools, mitmproxy, `tooltap export --har`) into the store.

    Model calls are reassembled, decoded and threaded into sessions as if they had passed
    through tooltap; importing the same file again stores nothing twice."""
    from ..cli import on_interrupt
    from ..store.db import DatabaseUnavailable
    from .load import import_har

    on_interrupt("what it had stored is kept, and importing the file again stores the rest")

    try:
        done = import_har(path, db_url, all_requests=all_requests)
    except HarError as exc:
        raise HarProblem(str(exc)) from None
    except DatabaseUnavailable as exc:
        raise HarProblem(str(exc)) from None
    notes = []
    if done.already:
        notes.append(f"{done.already} already stored")
    if done.skipped:
        notes.append(f"{done.skipped} not a model call (--all-requests keeps them)")
    click.echo(f"imported {done.turns} turn(s) into {len(done.sessions)} session(s)"
               + (f"; {', '.join(notes)}" if notes else ""))
