"""`tooltap otel export`, and the `serve --otlp-endpoint` settings."""

from __future__ import annotations

import functools
import os

import click

from ..config import DEFAULT_DB
from . import OtelUnavailable, traces_url
from .live import CONTENT_ENV, ENDPOINT_ENV


class OtelError(click.ClickException):
    exit_code = 2  # the environment's problem (no SDK, no collector), not a finding


def _endpoint(ctx, param, value: str | None) -> str | None:
    """A collector's URL is checked at the start, not at the first export, where its
    failure would only reach the writer's log."""
    if value:
        try:
            traces_url(value)
        except ValueError as exc:
            raise click.BadParameter(str(exc)) from None
    return value


endpoint_option = click.option(
    "--otlp-endpoint", "endpoint", envvar="OTEL_EXPORTER_OTLP_ENDPOINT", show_envvar=True, metavar="URL", default=None,
    callback=_endpoint,
    help="An OTLP/HTTP collector: its base URL (/v1/traces is added) or its traces URL.")
content_option = click.option(
    "--otlp-content", "content", is_flag=True, show_envvar=True,
    envvar="OTEL_INSTRUMENTATION_GENAI_CAPTURE_MESSAGE_CONTENT",
    help="Also send messages, system instructions, tool definitions and tool-call arguments and "
         "results (sensitive: off by default, as the GenAI conventions require).")


def _require_sdk() -> None:
    from .sdk import require

    try:
        require()
    except OtelUnavailable as exc:
        raise OtelError(str(exc)) from None


def configure_serve(endpoint: str | None, content: bool) -> str | None:
    """For `tooltap serve`: check the SDK is there and hand the settings to the writer
    process (spawned: it reads them from its environment). Returns the traces URL."""
    if not endpoint:
        os.environ.pop(ENDPOINT_ENV, None)
        return None
    _require_sdk()
    url = traces_url(endpoint)
    os.environ[ENDPOINT_ENV] = url
    os.environ[CONTENT_ENV] = "1" if content else ""
    return url


def otlp_options(command):
    """`--otlp-endpoint` and `--otlp-content` for `tooltap serve`, handled here so the
    command itself needs no change: the SDK is checked (one line and exit 2 when it is
    missing) and the settings handed on before the command runs."""

    @functools.wraps(command)
    def run(*args, endpoint=None, content=False, **kwargs):
        url = configure_serve(endpoint, content)
        if url:
            click.echo(f"tooltap: spans of stored turns to {url}{' (with content)' if content else ''}")
        return command(*args, **kwargs)

    return endpoint_option(content_option(run))


@click.group(short_help="Stored turns as OpenTelemetry GenAI spans.")
def otel() -> None:
    """OpenTelemetry: stored turns as GenAI spans for Jaeger, Tempo, Langfuse, Phoenix..."""


@otel.command("export", short_help="Send stored sessions to an OTLP collector, a trace each.")
@click.argument("session_ids", nargs=-1, metavar="[SESSION ...]")
@click.option("--db", "db_url", envvar="TOOLTAP_DB", show_envvar=True, default=DEFAULT_DB, show_default=True,
              metavar="URL",
              help="The tooltap database to read.")
@endpoint_option
@content_option
def export_cmd(session_ids, db_url, endpoint, content) -> None:
    """Send stored sessions (default: all) to an OTLP collector, one trace per session.

    Sending a session again gives the same trace and span ids."""
    from ..cli import on_interrupt
    from ..store.db import DatabaseUnavailable, open_database
    from ..store.read import Reader
    from .sdk import ExportFailed, send
    from .source import session_ids as stored_ids, session_turns
    from .spans import session_spans

    if not endpoint:
        raise click.UsageError("give --otlp-endpoint URL (or set OTEL_EXPORTER_OTLP_ENDPOINT)")
    on_interrupt("the spans sent before it are at the collector")
    _require_sdk()
    try:
        engine = open_database(db_url, create=False)
    except DatabaseUnavailable as exc:
        raise OtelError(str(exc)) from None
    reader = Reader(engine)
    try:  # a session id may be given by its first characters
        ids = list(dict.fromkeys(reader.full_session_id(i) for i in session_ids)) or stored_ids(engine)
    except LookupError as exc:
        raise OtelError(str(exc)) from None
    url = traces_url(endpoint)

    traced = 0

    def spans():  # one session in memory at a time
        nonlocal traced
        for session_id in ids:
            found = False
            for span in session_spans(session_turns(engine, session_id, content), content):
                found = True
                yield span
            traced += found

    try:
        sent = send(spans(), url)
    except ExportFailed as exc:
        raise OtelError(str(exc)) from None
    untraced = len(ids) - traced
    click.echo(f"sent {sent} span(s) of {traced} session(s) to {url}"
               + (f"; {untraced} session(s) held no model turn to trace" if untraced else ""))
