"""`tooltap schemas ...`: list, show, convert and diff tool sets."""

from __future__ import annotations

import json
import sys

import click

from ..bidi import printable
from ..config import DEFAULT_DB
from .common import count
from .convert import PROFILES, TARGETS, UnsupportedTarget, convert_tools
from .diff import diff_toolsets
from .render import diff_markdown, diff_text, loss_lines, toolset_text
from .sources import SourceError, ToolSet, load
from .spec import SchemaError
from ..store.db import DatabaseUnavailable

db_option = click.option("--db", "db_url", envvar="TOOLTAP_DB", show_envvar=True, default=DEFAULT_DB,
                         show_default=True, metavar="URL",
                         help="The tooltap database the tool sets are read from (by list, and for "
                              "turn:, session: and mcp: sources).")


def _say(text: str, err: bool = False) -> None:
    # Tool names and descriptions are whoever wrote the tools': what can fool or break a
    # terminal goes as escapes (proxy/bidi.py).
    click.echo(printable(text), err=err)


class SchemasError(click.ClickException):
    # exit 1 is reserved for "breaking change found" in `diff`
    exit_code = 2


def _load(source: str, db_url: str | None) -> ToolSet:
    try:
        return load(source, db_url)
    except (SourceError, SchemaError) as exc:
        raise SchemasError(str(exc)) from exc
    except ImportError as exc:
        raise SchemasError(f"{source}: the tooltap database layer is not available ({exc})") from exc
    except DatabaseUnavailable as exc:
        raise SchemasError(str(exc)) from exc
    except RecursionError:
        raise SchemasError(f"{source}: nested too deeply to read") from None


def _dump(value) -> str:
    return json.dumps(value, indent=2, ensure_ascii=False)


@click.group()
def schemas() -> None:
    """Tool schemas: list, show, convert and diff tool sets.

    \b
    A tool set is read from:
      FILE                  JSON or JSONL, any provider's format (-: standard input)
      turn:<id>             the tools a recorded turn offered the model
      session:<id>          the newest tools array of a recorded session
      mcp:NAME              the newest tools/list answer of MCP server NAME
      mcp:NAME@ID           tool set ID of that server (the ids are on its page)
      mcp:NAME@session:<id> server NAME's tools as that session's agent offered them
    The database (--db) is $TOOLTAP_DB, else sqlite:///tooltap.db."""


@schemas.command("list")
@db_option
@click.option("--format", "fmt", type=click.Choice(["text", "json"]), default="text", show_default=True)
def list_cmd(db_url: str | None, fmt: str) -> None:
    """Tool sets seen by the proxy, by session and provider."""
    try:
        from proxy.store.read import tool_sets
    except ImportError as exc:
        raise SchemasError(f"the tooltap database layer is not available ({exc})") from exc
    try:
        rows = tool_sets(db_url)
    except DatabaseUnavailable as exc:
        raise SchemasError(str(exc)) from exc
    if fmt == "json":
        _say(_dump({"tool_sets": rows}))
        return
    if not rows:
        _say("no tool sets recorded")
        return
    _say(f"{'session':<24} {'turn':>6} {'api':<20} {'model':<28} {'tools':>5}  hash      seen")
    for r in rows:
        _say(f"{str(r.get('session_id'))[:24]:<24} {r.get('turn_id')!s:>6} {str(r.get('api'))[:20]:<20} "
                   f"{str(r.get('model'))[:28]:<28} {r.get('tool_count')!s:>5}  {str(r.get('tools_hash'))[:8]:<8}  {r.get('seen_at')}")


@schemas.command(short_help="Show a tool set, and what each provider's format would lose of it.")
@click.argument("source")
@db_option
@click.option("--format", "fmt", type=click.Choice(["text", "json"]), default="text", show_default=True)
def show(source: str, db_url: str | None, fmt: str) -> None:
    """Show a tool set SOURCE: a file (any format; - for standard input), turn:<id>,
    session:<id>, mcp:NAME[@ID] or mcp:NAME@session:<id> (see `tooltap schemas --help`)."""
    ts = _load(source, db_url)
    counts = {}
    try:
        for target in ("openai", "anthropic", "gemini", "mcp"):
            counts[target] = len(convert_tools(ts.tools, target)[1])
    except SchemaError as exc:
        counts = {}
        _say(f"warning: {exc}", err=True)
    if fmt == "json":
        _say(_dump({"source": ts.source, "format": ts.format, "skipped": ts.skipped,
                          "tools": [t.to_dict() for t in ts.tools], "losses_per_target": counts}))
    else:
        _say(toolset_text(ts, counts))


@schemas.command(short_help="Convert a tool set to another provider's format; report the losses.")
@click.argument("source")
@click.option("--to", "target", type=click.Choice(TARGETS), required=True)
@click.option("--profile", type=click.Choice(list(PROFILES)), default="faithful",
              help="faithful: the best conversion; cline: what Cline 3.x's converters emit")
@click.option("--format", "fmt", type=click.Choice(["raw", "json"]), default="raw",
              help="raw: the tools on stdout, losses on stderr; json: one envelope with both")
@db_option
def convert(source: str, target: str, profile: str, fmt: str, db_url: str | None) -> None:
    """Convert a tool set to another provider's format and report what was lost. SOURCE: a
    file (- for standard input), turn:<id>, session:<id>, mcp:NAME[@ID] or
    mcp:NAME@session:<id>."""
    ts = _load(source, db_url)
    try:
        tools, losses = convert_tools(ts.tools, target, profile)
    except (UnsupportedTarget, SchemaError, RecursionError) as exc:
        raise SchemasError(str(exc)) from exc
    if fmt == "json":
        _say(_dump({"source": ts.source, "from": ts.format, "to": target, "profile": profile,
                          "tools": tools, "losses": [l.to_dict() for l in losses]}))
        return
    _say(_dump(tools))
    for line in loss_lines(losses):
        _say(line, err=True)
    _say(f"{count(len(tools), 'tool')}, {count(len(losses), 'loss', 'losses')}", err=True)


@schemas.command()
@click.argument("a")
@click.argument("b")
@click.option("--format", "fmt", type=click.Choice(["text", "json", "markdown"]), default="text",
              show_default=True)
@db_option
def diff(a: str, b: str, fmt: str, db_url: str | None) -> None:
    """Diff tool set A (before) against B (after). Exit 1 when a change is breaking.

    A and B: each a file (any format; - for standard input, once), turn:<id>, session:<id>, mcp:NAME[@ID] or
    mcp:NAME@session:<id> (see `tooltap schemas --help`)."""
    if a == b == "-":
        raise click.UsageError("standard input can be read once: give A or B as a file")
    ta, tb = _load(a, db_url), _load(b, db_url)
    try:
        result = diff_toolsets(ta.tools, tb.tools)
    except (SchemaError, RecursionError) as exc:
        raise SchemasError(str(exc)) from exc
    if fmt == "json":
        _say(_dump({"a": {"source": a, "format": ta.format}, "b": {"source": b, "format": tb.format}, **result}))
    elif fmt == "markdown":
        _say(diff_markdown(result, a, b))
    else:
        _say(diff_text(result, a, b))
    sys.exit(1 if result["breaking"] else 0)
