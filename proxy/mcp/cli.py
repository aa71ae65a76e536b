"""`tooltap mcp -- COMMAND [ARGS...]`: wrap a stdio MCP server and record its traffic."""

from __future__ import annotations

import os
import shlex
import sys

import click

from ..config import DEFAULT_DB, normalize_db_url

# Launchers whose first argument names the server better than they do.
_LAUNCHERS = {"python", "python3", "node", "npx", "uv", "uvx", "bun", "bunx", "deno", "pipx", "docker", "pnpm",
              "yarn", "npm", "java", "ruby", "go", "cargo", "sh", "bash"}


class WrapperProblem(click.ClickException):
    exit_code = 2


@click.command(short_help="Run a stdio MCP server and record its messages.",
               context_settings={"ignore_unknown_options": True, "allow_interspersed_args": False})
@click.option("--name", default=None, metavar="NAME",
              help="The server's name in the inspector (default: the serverInfo.name of its answer to initialize). "
                   "Give the name the agent knows it by, so its tool calls are tied to the MCP calls.")
@click.option("--db", "db_url", envvar="TOOLTAP_DB", show_envvar=True, default=DEFAULT_DB, show_default=True,
              metavar="URL",
              help="Database URL, shared with `tooltap serve` (sqlite:///ABSOLUTE/PATH or postgresql+psycopg://...).")
@click.option("--spool", "spool_dir", envvar="TOOLTAP_MCP_SPOOL", show_envvar=True, default=None, metavar="DIR",
              help="Folder where messages wait while the database is unavailable "
                   "(default: beside the SQLite file; where that cannot be written, and for Postgres, "
                   "~/.cache/tooltap).")
@click.argument("command", nargs=-1, required=True, type=click.UNPROCESSED)
def mcp(name, db_url, spool_dir, command) -> None:
    """Run a stdio MCP server and record every message between it and the agent.

    Put `tooltap mcp --db sqlite:///PATH/tooltap.db --` in front of the server's command in
    the agent's MCP settings. stdin, stdout and stderr pass through byte for byte; signals
    go to the server; the exit code is the server's."""
    from .relay import Relay, StartError, exit_like
    from .store import Connection, Recorder, new_id
    url = _check_db(db_url)
    if name is not None and not name.strip():
        raise click.BadParameter("give a name, or leave --name out", param_hint="--name")
    recorder = Recorder(url, spool_dir)
    conn = Connection(id=new_id(), transport="stdio", name=name.strip() if name else None,
                      fallback=fallback_name(list(command)), command=shown_command(list(command)))
    relay = Relay(list(command), lambda d, line, at, note: recorder.record(conn, d, line, at, note))
    try:
        relay.start()
    except StartError as exc:
        click.echo(str(exc), err=True)
        sys.exit(exc.exit_code)
    recorder.start()
    code = relay.wait()
    recorder.ended(conn, code, relay.stderr_text())
    # Long enough for a first run's migrations on a busy machine; past it the rest is spooled.
    recorder.close(timeout=10.0)
    exit_like(code)


def _check_db(db_url: str) -> str:
    """Mistakes in the URL stop the wrapper at once (exit 2); a database that is down
    only means spooling."""
    from ..store.db import sqlite_path

    url = normalize_db_url(db_url)
    if not url.split("://", 1)[0].startswith(("sqlite", "postgresql")):
        raise WrapperProblem(f"unsupported database URL {db_url!r}: use sqlite:///FILE or postgresql+psycopg://...")
    path = sqlite_path(url)
    if path is not None and not path.parent.is_dir():
        raise WrapperProblem(f"cannot record to {path}: the folder {path.parent} does not exist "
                             "(give --db an absolute path: agents start servers in any folder)")
    return url


def fallback_name(argv: list[str]) -> str:
    """A name for a server that does not say its own: its script or package, else its
    program; a key in it (`bash -c 'TOKEN=... server'`) as a fingerprint, as in the command."""
    prog = os.path.basename(argv[0]) if argv else "mcp"
    base = prog.split(".")[0].rstrip("0123456789.")
    if base in _LAUNCHERS:
        for arg in argv[1:]:
            if not arg.startswith("-") and arg not in ("run", "exec", "x", "-m"):
                stem = os.path.basename(arg.rstrip("/")).split("@")[0] or arg
                return _hidden(os.path.splitext(stem)[0] or prog)[:200]
    return _hidden(prog)[:200]


def _hidden(name: str) -> str:
    from ..secrets import fingerprint, is_secret_name, redact_keys

    words = [f"{k}={fingerprint(v)}" if eq and v and is_secret_name(k) else redact_keys(w)
             for w in name.split(" ") for k, eq, v in [w.partition("=")]]
    return " ".join(words)


def shown_command(argv: list[str]) -> str:
    """The command as stored: key-shaped values, and the values of options whose names
    say key, token, secret..., as fingerprints."""
    from ..secrets import fingerprint, is_secret_name, redact_keys

    out, secret_next = [], False
    for arg in argv:
        if secret_next:
            out.append(fingerprint(arg))
            secret_next = False
            continue
        name, eq, value = arg.partition("=")
        if arg.startswith("-") and is_secret_name(name.lstrip("-")):
            if eq:
                out.append(f"{name}={fingerprint(value)}")
            else:
                out.append(arg)
                secret_next = True
            continue
        out.append(redact_keys(arg))
    return shlex.join(out)
