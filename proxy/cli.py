"""The `tooltap` command."""

from __future__ import annotations

import contextlib
import dataclasses
import errno
import logging
import os
import re
import signal
from pathlib import Path

import click

from . import malloc, stacks
from .config import DEFAULT_DB, Settings, Upstream, normalize_db_url, upstreams_from_env
from .mcp.cli import mcp as mcp_command
from .options import Finite
from .replay.cli import db_option, export, replay
from .har.cli import import_command
from .otel.cli import otel, otlp_options
from .schemas.cli import schemas
from .secrets import add_secret_names


class UsageProblem(click.ClickException):
    """A mistake in the command line, said in one line (click puts its usage line and a
    hint above it, three lines for a misspelt flag): exit 2, as click's own."""

    exit_code = 2


# For the commands that change the database (the read commands take replay's db_option).
db_changed_option = click.option("--db", "db_url", envvar="TOOLTAP_DB", show_envvar=True, default=DEFAULT_DB,
                                 show_default=True, metavar="URL", help="The tooltap database.")
_BARE_GROUP = getattr(click.exceptions, "NoArgsIsHelpError", ())  # click 8.2 and later


INTERRUPTED = "tooltap.interrupted"  # ctx.meta: what a command stopped by Ctrl-C leaves behind


def on_interrupt(leaves: str) -> None:
    """Say, in the command running, what a Ctrl-C leaves behind (told after "stopped")."""
    click.get_current_context().meta[INTERRUPTED] = leaves


@contextlib.contextmanager
def _said_in_one_line(ctx: click.Context | None = None):
    try:
        yield
    except _BARE_GROUP as exc:  # a group run bare: its help, as `--help` gives it
        click.echo(exc.ctx.get_help())
        exc.ctx.exit(0)
    except click.UsageError as exc:
        where = exc.ctx.command_path if exc.ctx is not None else "tooltap"
        raise UsageProblem(f"{exc.format_message()} (see '{where} --help')") from exc
    except KeyboardInterrupt:
        # click would print a blank line and "Aborted!", exit 1: for replay, the code of a
        # turn that differs. 130 is what shells report for Ctrl-C. A second Ctrl-C while
        # this is said would be a traceback.
        with contextlib.suppress(ValueError):  # (only the main thread may set it)
            signal.signal(signal.SIGINT, signal.SIG_IGN)
        leaves = ctx.meta.get(INTERRUPTED) if ctx is not None else None
        click.echo(f"Interrupted (Ctrl-C): stopped before it finished{'; ' + leaves if leaves else ''}.", err=True)
        raise click.exceptions.Exit(130) from None


class _Commands(click.Group):
    """tooltap's command group: usage errors anywhere below it come out as one line."""

    def make_context(self, *args, **kwargs):
        with _said_in_one_line():
            return super().make_context(*args, **kwargs)

    def invoke(self, ctx):
        with _said_in_one_line(ctx):
            return super().invoke(ctx)


@click.group(cls=_Commands)
@click.version_option(package_name="tooltap")
def main() -> None:
    """tooltap: a logging reverse proxy and tool-call inspector for LLM agents."""
    stacks.dump_on_sigusr1()
    malloc.keep_large_buffers()  # request bodies grow each turn: reuse their memory (malloc.py)


def _upstream(ctx, param, values):
    try:
        ups = [Upstream.parse(v) for v in values] or upstreams_from_env()
    except ValueError as exc:
        raise click.BadParameter(str(exc)) from exc
    if not ups:
        raise click.BadParameter("give at least one --upstream URL (or set TOOLTAP_UPSTREAM)")
    if sum(u.name is None for u in ups) > 1:
        raise click.BadParameter("only one upstream can be served at the root; name the others NAME=URL")
    names = [u.name for u in ups if u.name]
    if len(set(names)) < len(names):
        twice = sorted({n for n in names if names.count(n) > 1})
        raise click.BadParameter(f"the name {twice[0]!r} is given to more than one upstream")
    return tuple(ups)


def _mcp_servers(ctx, param, values):
    from .mcp.http import parse_all

    try:
        return parse_all(values)
    except ValueError as exc:
        raise click.BadParameter(str(exc)) from exc


def _secret_names(ctx, param, values):
    # Added together, not overridden: a list of names kept in the environment stays in
    # force when one more is given on the command line.
    given = [*values, os.environ.get("TOOLTAP_SECRET_HEADERS", "")]
    return tuple(n for v in given for n in re.split(r"[\s,]+", v) if n)


@main.command()
@click.option("--upstream", "upstreams", multiple=True, callback=_upstream, metavar="URL | NAME=URL",
              help="Where to forward. A bare URL is served at the root; NAME=URL under /NAME/. Repeatable.  "
                   "[env var: TOOLTAP_UPSTREAM, the same, separated by commas or spaces]")
@click.option("--db", "db_url", envvar="TOOLTAP_DB", show_envvar=True, default=DEFAULT_DB, show_default=True,
              metavar="URL", help="Database URL (sqlite:///FILE or postgresql+psycopg://...).")
@click.option("--host", default="127.0.0.1", show_default=True,
              help="Address to listen on; one that is not loopback needs --ui-token.")
@click.option("--port", default=8000, show_default=True, type=click.IntRange(1, 65535),
              help="Port the agents and the inspector connect to.")
@click.option("--read-timeout", default=600.0, show_default=True, type=Finite(min=0, min_open=True),
              help="Seconds to wait for each upstream read; slow models think before they speak.")
@click.option("--connect-timeout", default=10.0, show_default=True, type=Finite(min=0, min_open=True),
              help="Seconds to wait for a connection to the upstream, TLS handshake included.")
@click.option("--spool", "spool_path", envvar="TOOLTAP_SPOOL", show_envvar=True, default=None,
              help="File where turns wait while the database is down (default: beside the SQLite file).")
@click.option("--log-level", default="info", show_default=True,
              type=click.Choice(["debug", "info", "warning", "error"]),
              help="How much tooltap says on stderr: warnings name every turn it could not forward.")
@click.option("--ui-token", envvar="TOOLTAP_UI_TOKEN", show_envvar=True, default=None,
              help="Token the inspector asks for on every page, API and live request "
                   "(required when --host is not a loopback address).")
@click.option("--secret-header", "secret_headers", multiple=True, metavar="NAME", callback=_secret_names,
              help="Also store this header (or query parameter) only as a fingerprint, beside those whose "
                   "names say key, token, auth, secret... Repeatable.  [env var: TOOLTAP_SECRET_HEADERS, "
                   "comma-separated, added to these]")
@click.option("--shutdown-grace", envvar="TOOLTAP_SHUTDOWN_GRACE", show_envvar=True, default=8.0, show_default=True,
              type=Finite(min=0.5), metavar="SECONDS",
              help="On SIGTERM, SIGINT or SIGHUP, exit within this time: open streams may finish until "
                   "3 s before it (half of it, if shorter), then are cut and recorded. Keep it under your "
                   "orchestrator's kill timeout (docker: 10 s).")
@click.option("--max-connections", default=None, type=click.IntRange(min=1),
              help="Client connections served at once (default: what the open-file limit allows); "
                   "past it, idle connections make room.")
@click.option("--mcp", "mcp_servers", multiple=True, callback=_mcp_servers, metavar="NAME=URL",
              help="Also serve this streamable-HTTP MCP server at /_mcp/NAME and record its traffic. Repeatable.")
@click.option("--workers", envvar="TOOLTAP_WORKERS", show_envvar=True, default=1, show_default=True,
              type=click.IntRange(1, 64),
              help="tooltap processes serving the port, one core each (they share the database).")
@click.option("--writers", envvar="TOOLTAP_WRITERS", show_envvar=True, default=1, show_default=True,
              type=click.IntRange(1, 16),
              help="Processes that store turns, one core each at full load (a conversation always goes to the "
                   "same one). One stores a few hundred agent turns a second.")
@click.option("--turn-header", is_flag=True, envvar="TOOLTAP_TURN_HEADER", show_envvar=True,
              help="Add X-Tooltap-Turn: UID to every forwarded response; GET /_tooltap/api/turns/uid/UID?wait=5 "
                   "then gives that turn (a test finds its own turn without polling).")
@otlp_options  # listed last in --help
def serve(upstreams, db_url, host, port, read_timeout, connect_timeout, spool_path, log_level, ui_token,
          secret_headers, shutdown_grace, max_connections, mcp_servers, workers, writers, turn_header) -> None:
    """Forward agent traffic to the upstream and record every turn."""
    from .app import TooltapApp
    from .server import exit_now, serve as run_server
    from .workers import worker_index, worker_spool

    worker = worker_index()  # None, or which of `serve --workers N` this process is
    _require_token_off_loopback(host, ui_token)
    add_secret_names(secret_headers)
    _check_spool(spool_path)
    if worker is None:  # a worker's port was checked by the process that started it
        _check_port(host, port)
    _open_database(db_url)
    logging.basicConfig(level=log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    if log_level != "debug":
        logging.getLogger("alembic").setLevel(logging.WARNING)  # the SQL dialect it found, at every start
        logging.getLogger("httpx").setLevel(logging.WARNING)  # each request of a replay the inspector runs
    settings = Settings(upstreams=upstreams, db_url=normalize_db_url(db_url), read_timeout=read_timeout,
                        connect_timeout=connect_timeout, spool_path=spool_path, ui_token=ui_token or None,
                        mcp_servers=mcp_servers, turn_header=turn_header, writers=writers)
    if worker is None and workers > 1:
        _serve_workers(settings, host, port, ui_token, db_url, workers)
    if worker:
        settings = dataclasses.replace(settings, spool_path=worker_spool(settings.spool_file(), worker))
    app = TooltapApp(settings)
    if worker is None:
        _banner(settings, host, port, ui_token, db_url)
    run_server(app, host=host, port=port, log_level=log_level, grace=shutdown_grace,
               max_connections=max_connections, reuse_port=worker is not None)
    exit_now(0)  # stopped by a signal, every turn stored or spooled


def _banner(settings: Settings, host: str, port: int, ui_token, db_url: str, note: str = "") -> None:
    for m in settings.mcp_servers:
        click.echo(f"tooltap: MCP http://{host}:{port}{m.prefix} -> {m.url}")
    for up in settings.upstreams:
        click.echo(f"tooltap: http://{host}:{port}{up.prefix or '/'} -> {up.url}")
    if settings.writers > 1:
        note += f", {settings.writers} writer processes{' each' if note else ''}"
    click.echo(f"tooltap: inspector at http://{host}:{port}/_tooltap/"
               f"{'?token=...' if ui_token else ''}  (database: {db_url}){note}")


def _serve_workers(settings: Settings, host: str, port: int, ui_token, db_url: str, workers: int) -> None:
    """Start `workers` tooltap processes on the port and supervise them until stopped."""
    from .store.process import journal_dir
    from .workers import Supervisor

    spool = settings.spool_file()
    supervisor = Supervisor(workers, spool, os.environ.get("TOOLTAP_JOURNAL") or journal_dir(spool))
    _banner(settings, host, port, ui_token, db_url, f", {workers} workers")
    raise SystemExit(supervisor.run())


class EnvironmentProblem(click.ClickException):
    """Something about this machine stops tooltap (a busy port, a database it cannot
    open): one line, exit 2, never a traceback."""

    exit_code = 2


def _check_port(host: str, port: int) -> None:
    """Fail before the banner when the port is taken: the user must not be shown the
    address of another program."""
    error = _bind_error(host, port)
    if error is None:
        return
    if error.errno == errno.EADDRINUSE:
        # Suggest a port that is free now, not merely the next one.
        free = next((p for p in range(port + 1, min(port + 100, 65536)) if _bind_error(host, p) is None), None)
        hint = f"stop what holds it or give --port {free}" if free else "stop what holds it or give another --port"
        raise EnvironmentProblem(f"port {port} on {host} is already in use: {hint}")
    raise EnvironmentProblem(f"cannot listen on {host}:{port}: {error.strerror or error}")


def _bind_error(host: str, port: int) -> OSError | None:
    import socket

    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    with socket.socket(family, socket.SOCK_STREAM) as probe:
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            probe.bind((host, port))
        except OSError as exc:
            return exc
    return None


def _check_spool(spool_path: str | None) -> None:
    if spool_path and not Path(spool_path).resolve().parent.is_dir():
        raise click.BadParameter(f"the folder of {spool_path} does not exist", param_hint="--spool")


def _open_database(db_url: str, create: bool = True):
    from .store.db import DatabaseUnavailable, open_database

    try:
        return open_database(db_url, create=create)
    except DatabaseUnavailable as exc:
        raise EnvironmentProblem(str(exc)) from None


def _require_token_off_loopback(host: str, ui_token: str | None) -> None:
    """The inspector shows prompts, files and tool results: never serve it to a network
    without a token."""
    from inspector_ui.security import is_loopback_name

    if not is_loopback_name(host) and not ui_token:
        raise click.UsageError(
            f"--host {host} is not a loopback address: the inspector would show every captured "
            "prompt and tool result to the network. Give --ui-token TOKEN (or set TOOLTAP_UI_TOKEN).")


@main.command(short_help="A scripted upstream and recorded sessions: no API key needed.")
@click.option("--host", default="127.0.0.1", show_default=True,
              help="Address to listen on; one that is not loopback needs --ui-token.")
@click.option("--port", default=None, type=click.IntRange(1, 65535),
              help="Default: 8000, or a free port when 8000 is taken.")
@click.option("--db", "db_url", default=None, metavar="FILE | URL",
              help="Keep the demo's database here, a new SQLite file or an empty database URL (default: a "
                   "temporary file removed on exit).")
@click.option("--ui-token", envvar="TOOLTAP_UI_TOKEN", show_envvar=True, default=None, help="As for `serve`.")
@click.option("--live-every", default=20.0, show_default=True, type=Finite(min=0),
              help="Seconds between slowly streamed turns, to watch live updates (0: none).")
def demo(host, port, db_url, ui_token, live_every) -> None:
    """Run tooltap with a built-in scripted upstream and recorded sessions: no API key needed."""
    import time

    from . import demo as demo_mod

    _require_token_off_loopback(host, ui_token)
    if port is None:
        try:
            _check_port(host, 8000)
            port = 8000
        except EnvironmentProblem:
            port = demo_mod.free_port(host)
    else:
        _check_port(host, port)
    if db_url:
        _refuse_a_store_in_use(db_url)
        _open_database(db_url)
    # Ctrl-C, SIGTERM or a closed terminal: the servers, the writer process and the
    # temporary folder are cleaned up whatever the demo was doing.
    with demo_mod.stopped_by_signals():
        try:
            with demo_mod.running(db_url=db_url, host=host, port=port, ui_token=ui_token) as d:
                d.play_all()
                click.echo("tooltap demo: played two Cline sessions (Chinese and English; the English one's MCP "
                           "server recorded too), parallel tool calls, an upstream error and an aborted stream "
                           "through tooltap.")
                click.echo(f"tooltap demo: inspector at {d.inspector}{'?token=' + ui_token if ui_token else ''}")
                click.echo(f"tooltap demo: agents would use base URL {d.url}  (Ctrl-C to stop)")
                if live_every > 0:
                    click.echo(f"tooltap demo: every {live_every:g} s a slowly streamed turn comes in, to watch "
                               "the live view (--live-every 0: none)")
                while True:
                    if live_every > 0:
                        time.sleep(live_every)
                        d.play(demo_mod.slow_haiku())
                    else:
                        time.sleep(3600)
        except KeyboardInterrupt:
            pass
    with contextlib.suppress(OSError):  # the terminal may be gone (SIGHUP)
        click.echo("tooltap demo: stopped")
    from .server import exit_now

    exit_now(0)  # cleaned up: as serve ends, without the interpreter's teardown (a second, interruptible)


def _refuse_a_store_in_use(db_url: str) -> None:
    """The demo's sessions are made up: they must not mix with what an agent recorded. Asked
    before the database is opened, which would bring an older store up to date."""
    from sqlalchemy import create_engine, text

    from .store.db import make_engine, shown_url, sqlite_path

    url = normalize_db_url(db_url)
    path = sqlite_path(url)
    if path is not None and not path.is_file():
        return  # a new file
    try:
        engine = create_engine(url) if path is not None else make_engine(url)  # (its connect timeout)
        try:
            with engine.connect() as db:
                turns = db.execute(text("SELECT count(*) FROM turns")).scalar_one()
        finally:
            engine.dispose()
    except Exception:  # no turns table, or no database to ask: opening it says what is wrong
        return
    if turns:
        raise click.UsageError(f"{shown_url(url)} already holds {turns:,} turn{'s' if turns != 1 else ''}: the demo's "
                               "made-up sessions would mix with them. Give --db a new file, or no --db for a temporary "
                               "one.")


@main.command(short_help="Decode every stored session again (after an upgrade).")
@db_changed_option
def redecode(db_url) -> None:
    """Decode every stored session again (after upgrading tooltap's decoders).

    Safe while `tooltap serve` runs: each session is decoded and committed on its own."""
    on_interrupt("the sessions decoded so far keep their new decoding")
    from sqlmodel import Session as DB, select

    from .store.decoding import BlobCache, decode_sessions
    from .store.models import Session

    engine = _open_database(db_url, create=False)
    with DB(engine) as db:
        ids = db.exec(select(Session.id).order_by(Session.started_at)).all()
    cache = BlobCache()
    with click.progressbar(ids, label="redecoding sessions") as bar:
        for session_id in bar:
            with DB(engine) as db:
                decode_sessions(db, [session_id], cache)
                db.commit()
    click.echo(f"redecoded {len(ids)} session(s)")


def _age(ctx, param, value):
    from .store.retention import parse_duration

    try:
        return parse_duration(value)
    except ValueError as exc:
        raise click.BadParameter(str(exc)) from None


@main.command(short_help="Delete old turns, and what no remaining turn uses.")
@click.option("--older-than", "older_than", required=True, callback=_age, metavar="AGE",
              help="Delete turns started longer ago than this: 90m, 12h, 30d, 2w.")
@click.option("--keep-errors", is_flag=True,
              help="Keep turns whose status is not ok (and what they need), and failed MCP calls (request and answer).")
@click.option("--dry-run", is_flag=True, help="Say what would be deleted; change nothing.")
@click.option("--vacuum", default="auto", show_default=True, type=click.Choice(["auto", "full", "none"]),
              help="Give the space back. SQLite, auto: in short steps (a database made before tooltap had "
                   "prune is converted by one full VACUUM); full: VACUUM, which also repacks half-empty pages "
                   "but holds the writer off while it runs. Postgres: plain VACUUM either way.")
@db_changed_option
def prune(older_than, keep_errors, dry_run, vacuum, db_url) -> None:
    """Delete old turns, and the sessions, messages and blobs nothing else uses.

    Safe while `tooltap serve` runs: it works in short transactions the writer waits for."""
    on_interrupt("nothing was deleted" if dry_run else "what it had deleted is gone, the rest is kept")
    from rich.console import Console
    from rich.progress import Progress

    from .store.db import make_engine
    from .store.retention import prune as run_prune

    _open_database(db_url, create=False).dispose()  # checked and migrated; no store there is an error
    engine = make_engine(db_url, busy_timeout=30.0)  # waits for the writer's batch, never for long
    console = Console()
    with contextlib.ExitStack() as stack:
        step = None
        if console.is_terminal and not dry_run:
            bar = stack.enter_context(Progress(console=console, transient=True))
            task = bar.add_task("pruning turns", total=None)
            step = lambda res, total: bar.update(task, completed=res.turns, total=total)  # noqa: E731
        res = run_prune(engine, older_than, keep_errors=keep_errors, dry_run=dry_run, vacuum=vacuum,
                        progress=step)
    engine.dispose()
    if dry_run:
        click.echo(f"would prune {res.what()}; about {_size(res.turn_bytes + res.blob_bytes)} of data "
                   "(nothing changed)")
        return
    click.echo(f"pruned {res.what()}; reclaimed {_size(res.reclaimed)} ({_vacuum_note(res.vacuum)}, "
               f"{res.seconds:.1f} s)")


def _size(n: int) -> str:
    return f"{n / 1e6:.1f} MB" if n >= 100_000 else f"{n / 1e3:.1f} KB" if n >= 1000 else f"{n} bytes"


def _vacuum_note(how: str) -> str:
    return {"incremental": "incremental vacuum", "full": "full VACUUM",
            "vacuum": "VACUUM: space reusable, files keep their size", "none": "no vacuum"}[how]


@main.command()
@click.option("--days", default=7, show_default=True, type=click.IntRange(1, 366), help="Days of growth shown.")
@click.option("--json", "as_json", is_flag=True, help="Print the figures as JSON.")
@db_option
def stats(days, as_json, db_url) -> None:
    """What the store holds and how fast it grows, per day.

    Turns, sessions, blobs, MCP messages and the database's size; then, per UTC day,
    turns, turns not ok, bytes on the wire and stored, and MCP messages."""
    import json

    from rich.console import Console
    from rich.table import Table

    from .store.read import shown_time
    from .store.stats import store_stats

    engine = _open_database(db_url, create=False)
    s = store_stats(engine, days=days)
    engine.dispose()
    if as_json:
        click.echo(json.dumps(s.to_json(), indent=2))
        return
    console = Console()
    console.print(f"turns {s.turns} ({s.errors} not ok), sessions {s.sessions}, blobs {s.blobs} "
                  f"({_size(s.blob_bytes)}), database {_size(s.database_bytes)}", highlight=False)
    console.print(f"MCP messages {s.mcp_messages} ({_size(s.mcp_bytes)}), servers {s.mcp_servers}, "
                  f"connections {s.mcp_connections}", highlight=False)
    for label, at, none in (("first turn", s.first_at, "-"), ("last turn ", s.last_at, "-"),
                            ("pruned    ", s.pruned_at, "never")):
        console.print(f"{label} {shown_time(at) + ' UTC' if at else none}", highlight=False)
    table = Table(title=f"growth, last {days} days (UTC)" if days > 1 else "growth, today (UTC)")
    for name in ("day", "turns", "not ok", "wire", "stored", "MCP messages"):
        table.add_column(name, justify="left" if name == "day" else "right")
    for d in s.days:
        table.add_row(d.day, str(d.turns), str(d.errors), _size(d.wire_bytes), _size(d.stored_bytes),
                      str(d.mcp_messages))
    console.print(table)


main.add_command(schemas)
main.add_command(otel)
main.add_command(import_command)
main.add_command(replay)
main.add_command(export)
main.add_command(mcp_command)
