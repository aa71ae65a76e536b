"""The official OpenTelemetry SDK's side: span records as finished SDK spans, sent by its
OTLP/HTTP (protobuf) exporter.

Stored turns are finished work with known ids and times, not code running now: each
becomes a `ReadableSpan` built directly, which the SDK's batch processor and exporter
take like any span that ended.
"""

from __future__ import annotations

import logging
import os
import re
from importlib.metadata import PackageNotFoundError, version
from typing import Iterable

from . import INSTALL_HINT, OtelUnavailable
from .spans import CLIENT, SpanRecord

EXPORT_TIMEOUT = 5.0  # seconds per export request, retries included
BATCH = 512  # spans per request, as the SDK's batch processor sends them


def require() -> None:
    """Raise OtelUnavailable, whose message says what to install, when the SDK is missing."""
    try:
        import opentelemetry.exporter.otlp.proto.http.trace_exporter  # noqa: F401
        import opentelemetry.sdk.trace  # noqa: F401
    except ImportError as exc:
        raise OtelUnavailable(INSTALL_HINT) from exc


def _version() -> str:
    try:
        return version("tooltap")
    except PackageNotFoundError:
        return "0"


class Converter:
    """Span records to SDK spans, with tooltap's resource and instrumentation scope."""

    def __init__(self) -> None:
        require()
        from opentelemetry.sdk.resources import Resource
        from opentelemetry.sdk.util.instrumentation import InstrumentationScope

        # Resource.create also reads OTEL_SERVICE_NAME and OTEL_RESOURCE_ATTRIBUTES.
        self.resource = Resource.create({"service.name": "tooltap", "service.version": _version()})
        self.scope = InstrumentationScope("tooltap", _version())

    def readable(self, record: SpanRecord):
        from opentelemetry.sdk.trace import ReadableSpan
        from opentelemetry.trace import SpanContext, SpanKind, Status, StatusCode, TraceFlags

        sampled = TraceFlags(TraceFlags.SAMPLED)
        parent = None
        if record.parent_span_id is not None:
            parent = SpanContext(record.trace_id, record.parent_span_id, is_remote=False, trace_flags=sampled)
        return ReadableSpan(
            name=record.name,
            context=SpanContext(record.trace_id, record.span_id, is_remote=False, trace_flags=sampled),
            parent=parent,
            resource=self.resource,
            attributes=record.attributes,
            kind=SpanKind.CLIENT if record.kind == CLIENT else SpanKind.INTERNAL,
            status=Status(StatusCode.ERROR, record.error) if record.error else Status(StatusCode.UNSET),
            start_time=record.start_ns,
            end_time=record.end_ns,
            instrumentation_scope=self.scope,
        )


def exporter(url: str):
    """The SDK's OTLP/HTTP protobuf exporter; headers, compression, certificates and the
    timeout (else EXPORT_TIMEOUT) come from the usual OTEL_EXPORTER_OTLP_* variables."""
    require()
    from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter

    given = os.environ.get("OTEL_EXPORTER_OTLP_TRACES_TIMEOUT") or os.environ.get("OTEL_EXPORTER_OTLP_TIMEOUT")
    return OTLPSpanExporter(endpoint=url, timeout=None if given else EXPORT_TIMEOUT)


class ExportFailed(RuntimeError):
    pass


def send(records: Iterable[SpanRecord], url: str) -> int:
    """Send span records now, in batches, and say how many went; ExportFailed (with the
    exporter's own reason) when the collector does not take them."""
    from opentelemetry.sdk.trace.export import SpanExportResult

    _reachable(url)
    converter, exp = Converter(), exporter(url)
    heard = _Heard()
    otel_log = logging.getLogger("opentelemetry")
    otel_log.addHandler(heard)
    propagate, otel_log.propagate = otel_log.propagate, False  # our one line says it
    sent = 0
    try:
        batch: list = []
        for record in records:
            batch.append(converter.readable(record))
            if len(batch) == BATCH:
                sent += _send(exp, batch, url, heard, SpanExportResult.SUCCESS)
                batch = []
        if batch:
            sent += _send(exp, batch, url, heard, SpanExportResult.SUCCESS)
    finally:
        exp.shutdown()
        otel_log.removeHandler(heard)
        otel_log.propagate = propagate
    return sent


def _reachable(url: str) -> None:
    """A collector that is not there said at once, and why: the exporter retries for
    seconds, then names no cause ("timeout, max retries or shutdown")."""
    import socket
    from urllib.parse import urlsplit

    parts = urlsplit(url)
    port = parts.port or (443 if parts.scheme == "https" else 80)
    try:
        socket.create_connection((parts.hostname, port), timeout=EXPORT_TIMEOUT).close()
    except OSError as exc:
        raise ExportFailed(f"no collector answers at {url} ({exc.strerror or exc}): start it, or give the "
                           "--otlp-endpoint it listens on") from None


def _send(exp, batch: list, url: str, heard: "_Heard", success) -> int:
    heard.begin()
    if exp.export(batch) != success:
        raise ExportFailed(f"the collector at {url} did not take the spans"
                           + (f" ({heard.last})" if heard.last else ""))
    return len(batch)


class _Heard(logging.Handler):
    """Keeps the exporter's last complaint, to say why in one line."""

    def __init__(self) -> None:
        super().__init__(logging.WARNING)
        self.begin()

    def begin(self) -> None:
        """A new batch: what was said of the one before is no cause of this one's end."""
        self.last: str | None = None
        self._transient: str | None = None  # the status a retried answer had (a 503)

    def emit(self, record: logging.LogRecord) -> None:
        said = record.getMessage().splitlines()[0][:300]
        transient = _TRANSIENT.match(said)
        if transient:
            self._transient = transient.group(1)
        # The exporter's last word after its retries names no cause, and an older one gives up
        # after its last "retrying": the answers it retried name it.
        self.last = (f"{self._transient}, still after retries"
                     if self._transient and (transient or _GAVE_UP in said) else said)


_TRANSIENT = re.compile(r"Transient error (.+?) encountered while exporting")
_GAVE_UP = "max retries or shutdown"
