"""`tooltap replay ...` and `tooltap export ...`: the command line over this package."""

from __future__ import annotations

import sys

import click

from ..config import DEFAULT_DB
from .compare import ARG_MODES, ORDER_MODES, Rules
from .recording import RecordingError, load, open_reader
from .result import ReplayResult, render_json, render_markdown, render_text

db_option = click.option("--db", "db_url", envvar="TOOLTAP_DB", default=DEFAULT_DB, show_default=True,
                         metavar="URL", help="The tooltap database to read (env: TOOLTAP_DB).")
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
    click.echo({"text": render_text, "json": render_json, "markdown": render_markdown}[fmt](result))


@click.group()
def replay() -> None:
    """Replay stored sessions: through the converters, against their recording, or live."""


# -- replay tools: converter replay (proxy/replay/tools.py) ------------------------------


# -- replay session: recorded (proxy/replay/recorded.py) and live (proxy/replay/live.py) --

@replay.command("session")
@click.argument("session_id", metavar="SESSION")
@db_option
@click.option("--recorded", is_flag=True, help="Serve the stored response bytes as the upstream.")
@click.option("--speed", default=0.0, show_default=True, type=click.FloatRange(min=0),
              help="With --recorded: 1 replays at the recorded chunk timing, N N times faster, 0 at once.")
@click.option("--against", "url", metavar="URL", help="Send the stored requests to this endpoint instead.")
@click.option("--model", default=None, help="With --against: the model to ask (default: as recorded).")
@click.option("--to", "to_api", type=click.Choice(["openai", "anthropic", "gemini"]), default=None,
              help="With --against: translate each request into this API first.")
@click.option("--repeat", default=1, show_default=True, type=click.IntRange(min=1),
              help="With --against: run each turn K times and report pass^k.")
@click.option("--api-key", envvar="TOOLTAP_REPLAY_API_KEY", default=None,
              help="With --against: the key for the endpoint, sent the way its API expects "
                   "(stored keys are fingerprints). Env: TOOLTAP_REPLAY_API_KEY.")
@click.option("-H", "--header", "headers", multiple=True, metavar="'NAME: VALUE'",
              help="With --against: an extra request header. Repeatable.")
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
def session_cmd(session_id, db_url, recorded, speed, url, model, to_api, repeat, api_key, headers,
                order, arg_mode, tool_args, ignore, fmt, record_run) -> None:
    """Replay SESSION and compare what comes back with what was recorded, turn by turn.

    Exit 0 when every turn matches, 1 when one differs, 2 on a usage error."""
    if recorded == bool(url):
        raise click.UsageError("give either --recorded or --against URL")
    try:
        per_tool = dict(_pair(t, "--tool-args", "TOOL=MODE") for t in tool_args)
        rules = Rules(order=order, args=arg_mode, per_tool=per_tool, ignore=tuple(ignore))
    except ValueError as exc:
        raise click.UsageError(str(exc)) from exc
    reader = _reader(db_url)
    recording = _recording(reader, session_id)
    if recorded:
        from .recorded import replay_recorded

        result = replay_recorded(recording, speed=speed, rules=rules)
    else:
        from .live import LiveError, replay_live

        extra = dict(_pair(h, "--header", "'NAME: VALUE'", sep=":") for h in headers)
        try:
            result = replay_live(recording, url, model=model, to_api=to_api, repeat=repeat, rules=rules,
                                 api_key=api_key, headers=extra)
        except LiveError as exc:
            raise ReplayError(str(exc)) from exc
    if record_run:
        from .runs import save_run

        save_run(reader.engine, result.kind, session_id, result.target, result.ok, result.to_dict())
    _emit(result, fmt)
    sys.exit(0 if result.ok else 1)


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
              help="Write a cassette and a pytest module that replays SESSION offline into DIR.")
def export(session_id, db_url, pytest_dir) -> None:
    """Export a stored session."""
    if not pytest_dir:
        raise click.UsageError("say what to export: --pytest DIR")
    from .export import ExportError, export_pytest

    recording = _recording(_reader(db_url), session_id)
    try:
        written = export_pytest(recording, pytest_dir)
    except ExportError as exc:
        raise ReplayError(str(exc)) from exc
    for path in written:
        click.echo(f"wrote {path}")
