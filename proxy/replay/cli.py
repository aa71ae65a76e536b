"""`tooltap replay ...` and `tooltap export ...`: the command line over this package."""

from __future__ import annotations

import contextlib
import signal
import sys

import click

from ..bidi import printable
from ..config import DEFAULT_DB
from ..options import Finite
from .compare import ARG_MODES, ORDER_MODES, Rules
from .recording import RecordingError, full_id, load, open_reader
from .result import ReplayResult, render_json, render_markdown, render_text

db_option = click.option("--db", "db_url", envvar="TOOLTAP_DB", show_envvar=True, default=DEFAULT_DB,
                         show_default=True, metavar="URL", help="The tooltap database to read.")
format_option = click.option("--format", "fmt", type=click.Choice(["text", "json", "markdown"]),
                             default="text", show_default=True)
record_run_option = click.option("--record-run", is_flag=True,
                                 help="Save this run in the database; the session page lists it.")


class ReplayError(click.ClickException):
    exit_code = 2  # 1 means "replay found a difference"


def _reader(db_url: str):
    try:
        return open_reader(db_url)
    except RecordingError as exc:
        raise ReplayError(str(exc)) from exc


def _recording(reader, session_id: str):
    try:
        return load(reader, session_id)
    except RecordingError as exc:
        raise ReplayError(str(exc)) from exc


def _emit(result: ReplayResult, fmt: str) -> None:
    # Tool names, arguments and differences are the model's words: what can fool or break a
    # terminal goes as escapes (in JSON, the same text).
    click.echo(printable({"text": render_text, "json": render_json, "markdown": render_markdown}[fmt](result)))


@click.group(short_help="Replay stored sessions: converters, recording, or live.")
def replay() -> None:
    """Replay stored sessions: through the converters, against their recording, or live."""


# -- replay tools: converter replay (proxy/replay/tools.py) ------------------------------

@replay.command("tools", short_help="What each provider format loses of the stored tools and calls.")
@click.argument("session_ids", nargs=-1, metavar="[SESSION ...]")
@click.option("--all", "all_sessions", is_flag=True, help="Every stored session.")
@db_option
@format_option
@record_run_option
def tools_cmd(session_ids, all_sessions, db_url, fmt, record_run) -> None:
    """Feed each stored turn's tools and tool calls through every provider format: what
    each conversion loses, which recorded calls its schema would reject, which names break
    its rules.

    Exit 0 when no call would be rejected, 1 when one would, 2 on a usage error."""
    from sqlalchemy.exc import SQLAlchemyError

    from .recording import session_ids as stored_ids
    from .tools import ConverterReplay, ToolsReport
    from .tools_recording import ToolsLoader
    from .tools_render import RENDERERS

    if bool(session_ids) == all_sessions:
        raise ReplayError("give one or more SESSION ids, or --all")
    from ..cli import on_interrupt

    on_interrupt("no run was saved" if record_run else "")
    reader = _reader(db_url)
    loader, replay_, report = ToolsLoader(reader), ConverterReplay(), ToolsReport()
    try:
        ids = list(stored_ids(reader)) if all_sessions else list(dict.fromkeys(
            full_id(reader, i) for i in session_ids))
        with _progress(len(ids), "replay tools", sys.stderr.isatty() or len(ids) > 1) as advance:
            for recording in loader.recordings(ids):
                report.sessions.append(replay_.session(recording))
                advance()
        if record_run:
            from .runs import save_run

            for s in report.sessions:
                save_run(reader.engine, "tools", s.session_id, "converters", s.ok, s.to_dict())
    except RecordingError as exc:
        raise ReplayError(str(exc)) from exc
    except SQLAlchemyError as exc:
        raise ReplayError(f"cannot read {db_url}: {str(exc.orig if getattr(exc, 'orig', None) else exc)}") from exc
    click.echo(RENDERERS[fmt](report))
    sys.exit(0 if report.ok else 1)


@contextlib.contextmanager
def _progress(total: int, label: str, show: bool):
    """A progress bar on stderr, `show`n when someone may be waiting (a terminal, many sessions)."""
    if not show:
        yield lambda: None
        return
    from rich.console import Console
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    with Progress(TextColumn(label), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                  console=Console(stderr=True), transient=sys.stderr.isatty()) as bar:
        task = bar.add_task("sessions", total=total)
        yield lambda: bar.advance(task)



# -- replay session: recorded (proxy/replay/recorded.py) and live (proxy/replay/live.py) --

@replay.command("session", short_help="Replay SESSION and compare the answers with the recording.")
@click.argument("session_id", metavar="SESSION")
@db_option
@click.option("--recorded", is_flag=True, help="Serve the stored response bytes as the upstream.")
@click.option("--speed", default=0.0, show_default=True, type=Finite(min=0),
              help="With --recorded: 1 replays at the recorded chunk timing, N N times faster, 0 at once.")
@click.option("--against", "url", metavar="URL", help="Send the stored requests to this endpoint instead.")
@click.option("--model", default=None, help="With --against: the model to ask (default: as recorded).")
@click.option("--to", "to_api", type=click.Choice(["openai", "anthropic", "gemini"]), default=None,
              help="With --against: translate each request into this API first.")
@click.option("--repeat", default=1, show_default=True, type=click.IntRange(min=1),
              help="With --against: run each turn K times and report pass^k.")
@click.option("--api-key", envvar="TOOLTAP_REPLAY_API_KEY", show_envvar=True, default=None,
              help="With --against: the key for the endpoint, sent the way its API expects "
                   "(stored keys are fingerprints).")
@click.option("-H", "--header", "headers", multiple=True, metavar="'NAME: VALUE'",
              help="With --against: an extra request header. Repeatable.")
@click.option("--read-timeout", default=600.0, show_default=True, type=Finite(min=0, min_open=True),
              help="With --against: seconds to wait for the endpoint's next bytes (models think before they answer).")
@click.option("--order", type=click.Choice(ORDER_MODES), default="strict", show_default=True,
              help="How the replayed calls must line up with the recorded ones.")
@click.option("--args", "arg_mode", type=click.Choice(ARG_MODES), default="exact", show_default=True,
              help="How each call's arguments must match.")
@click.option("--tool-args", "tool_args", multiple=True, metavar="TOOL=MODE",
              help="An argument mode for one tool (decoded name). Repeatable.")
@click.option("--ignore-arg", "ignore", multiple=True, metavar="[TOOL:]PATH",
              help="An argument path left out of the comparison, e.g. task_progress. Repeatable.")
@format_option
@record_run_option
def session_cmd(session_id, db_url, recorded, speed, url, model, to_api, repeat, api_key, headers, read_timeout,
                order, arg_mode, tool_args, ignore, fmt, record_run) -> None:
    """Replay SESSION and compare what comes back with what was recorded, turn by turn:
    from the stored answers (--recorded) or from a live endpoint (--against URL); give
    one of the two.

    Exit 0 when every turn matches, 1 when one differs or none could be compared (every
    turn skipped), 2 on a usage error."""
    if recorded == bool(url):
        raise click.UsageError("give either --recorded or --against URL")
    _refuse_other_mode(recorded)
    from ..cli import on_interrupt

    on_interrupt("no run was saved" if record_run else "")
    try:
        per_tool = dict(_pair(t, "--tool-args", "TOOL=MODE") for t in tool_args)
        rules = Rules(order=order, args=arg_mode, per_tool=per_tool, ignore=tuple(ignore))
    except ValueError as exc:
        raise click.UsageError(str(exc)) from exc
    reader = _reader(db_url)
    recording = _recording(reader, session_id)
    if recorded:
        from .recorded import ReplayFailed, replay_recorded

        try:
            result = replay_recorded(recording, speed=speed, rules=rules)
        except ReplayFailed as exc:
            raise ReplayError(str(exc)) from exc
    else:
        from .live import LiveError, replay_live

        extra = dict(_pair(h, "--header", "'NAME: VALUE'", sep=":") for h in headers)
        try:
            with _progress(len(recording.turns), "replay live", sys.stderr.isatty()) as advance:
                result = replay_live(recording, url, model=model, to_api=to_api, repeat=repeat, rules=rules,
                                     api_key=api_key, headers=extra, read_timeout=read_timeout, advance=advance)
        except LiveError as exc:
            raise ReplayError(str(exc)) from exc
        if result.interrupted:
            previous = signal.signal(signal.SIGINT, signal.SIG_IGN)  # a second Ctrl-C must not cut the report
            try:
                _emit(result, fmt)
                click.echo(f"tooltap replay: interrupted (Ctrl-C) after {len(result.turns)} of "
                           f"{len(recording.turns)} turns{'; no run was saved' if record_run else ''}", err=True)
            finally:
                signal.signal(signal.SIGINT, previous)
            sys.exit(130)
    if record_run:
        from .runs import save_run

        save_run(reader.engine, result.kind, recording.session_id, result.target, result.ok, result.to_dict())
    _emit(result, fmt)
    sys.exit(0 if result.ok else 1)


# The options of one mode, as the user spells them; the other mode would ignore them.
LIVE_ONLY = {"model": "--model", "to_api": "--to", "repeat": "--repeat", "api_key": "--api-key", "headers": "--header",
             "read_timeout": "--read-timeout"}
RECORDED_ONLY = {"speed": "--speed"}


def _refuse_other_mode(recorded: bool) -> None:
    """An option the chosen mode would ignore is a mistake to point out, not to drop."""
    from click.core import ParameterSource

    ctx = click.get_current_context()
    # Given on the command line only: TOOLTAP_REPLAY_API_KEY may be set for every run.
    given = [flag for name, flag in (LIVE_ONLY if recorded else RECORDED_ONLY).items()
             if ctx.get_parameter_source(name) == ParameterSource.COMMANDLINE]
    if given:
        needs = "--against URL (live replay)" if recorded else "--recorded"
        raise click.UsageError(f"{' and '.join(given)} only {'apply' if len(given) > 1 else 'applies'} "
                               f"with {needs}")


def _pair(text: str, option: str, shape: str, sep: str = "=") -> tuple[str, str]:
    key, found, value = text.partition(sep)
    if not found or not key.strip():
        raise click.UsageError(f"{option} {text!r}: expected {shape}")
    return key.strip(), value.strip()


# -- export: a session as a cassette and a pytest module (proxy/replay/export.py) --------

@click.command()
@click.argument("session_id", metavar="SESSION")
@db_option
@click.option("--pytest", "pytest_dir", metavar="DIR", default=None,
              help="Write a cassette and a pytest module that replays SESSION offline into DIR "
                   "(made, with its parents, if missing).")
@click.option("--har", "har_path", metavar="FILE", default=None,
              help="Write SESSION as a HAR 1.2 file (browser devtools, mitmproxy; `tooltap import` reads it); "
                   "-: standard output.")
def export(session_id, db_url, pytest_dir, har_path) -> None:
    """Export a stored session."""
    if not (pytest_dir or har_path):
        raise click.UsageError("say what to export: --pytest DIR or --har FILE")
    if har_path == "-" and pytest_dir:
        raise click.UsageError("--har - writes the HAR to standard output alone: give --pytest DIR in a run of its own")
    if har_path:
        from ..har.cli import write_har

        entries = write_har(db_url, session_id, har_path)
        if har_path != "-":
            click.echo(f"wrote {har_path} ({entries} {'entry' if entries == 1 else 'entries'})")
        if not pytest_dir:
            return
    recording = _recording(_reader(db_url), session_id)
    from .export import ExportError, export_pytest

    try:
        written = export_pytest(recording, pytest_dir)
    except ExportError as exc:
        raise ReplayError(str(exc)) from exc
    for path in written:
        click.echo(f"wrote {path}")
