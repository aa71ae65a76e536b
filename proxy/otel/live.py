"""`tooltap serve --otlp-endpoint`: spans for each turn once it is stored.

This runs in the writer process (store/process.py), which already works off the request
path at a lower priority. The writer hands over the ids of the turns it just committed
(a queue put, never a wait); a thread here reads them back, builds their spans and gives
them to the SDK's batch processor, whose own thread sends them. A collector that is slow
or down costs that thread's time only: the proxy answers and the writer stores as
before, and spans the processor cannot hold are dropped (`tooltap otel export` sends a
session again, with the same ids).

A turn's tool calls are sent when the agent's next request is stored: that request
carries their results, and its start closes the time the agent spent running them. Calls
that no request answers go out after PENDING_SECONDS, or when tooltap stops.

The writer process is spawned, so the settings reach it through its environment:
TOOLTAP_OTLP_ENDPOINT (the traces URL) and TOOLTAP_OTLP_CONTENT ("1": with content),
set by `tooltap serve`.
"""

from __future__ import annotations

import logging
import os
import queue
import threading
import time
from typing import Any

from . import OtelUnavailable
from .spans import chat_span, exportable, tool_spans

log = logging.getLogger("tooltap.otel")

ENDPOINT_ENV = "TOOLTAP_OTLP_ENDPOINT"
CONTENT_ENV = "TOOLTAP_OTLP_CONTENT"
QUEUE_MAX = 100_000  # turn ids waiting to be read back; past it, the newest are not exported
PENDING_SECONDS = 600.0
SCHEDULE_MS = 1000  # the batch processor's delay, unless OTEL_BSP_SCHEDULE_DELAY says otherwise
CLOSE_SECONDS = 2.0  # what stopping may cost, whatever the collector does
_STOP = object()


def attach_from_environment(writer) -> "LiveExport | None":
    """Export `writer`'s stored turns when TOOLTAP_OTLP_ENDPOINT is set. Never raises:
    telemetry that cannot start is logged, and storing goes on."""
    url = os.environ.get(ENDPOINT_ENV, "").strip()
    if not url:
        return None
    try:
        export = LiveExport(writer.db_url, url, content=os.environ.get(CONTENT_ENV) == "1")
    except OtelUnavailable as exc:
        log.error("%s; turns are stored but not exported", exc)
        return None
    except Exception:
        log.exception("OpenTelemetry export could not start; turns are stored but not exported")
        return None
    writer.on_stored = export.stored
    export.start()
    import atexit

    atexit.register(export.close)  # the writer process exits when tooltap stops
    return export


class LiveExport:
    def __init__(self, db_url: str, url: str, content: bool = False):
        from opentelemetry.sdk.trace.export import BatchSpanProcessor

        from .sdk import Converter, exporter

        self.db_url, self.url, self.content = db_url, url, content
        self.converter = Converter()
        delay = None if os.environ.get("OTEL_BSP_SCHEDULE_DELAY") else SCHEDULE_MS
        self.processor = BatchSpanProcessor(_Watched(exporter(url), url), schedule_delay_millis=delay)
        self.sent_turns = 0
        self._queue: queue.Queue = queue.Queue(QUEUE_MAX)
        self._pending: dict[int, float] = {}  # turn id -> when its calls began waiting for an answer
        self._thread = threading.Thread(target=self._run, name="tooltap-otel", daemon=True)
        self._dropped = 0
        self._closed = False

    def start(self) -> None:
        self._thread.start()
        log.info("OpenTelemetry: spans of stored turns go to %s%s", self.url,
                 " (with content)" if self.content else "")

    def stored(self, events: list[dict[str, Any]]) -> None:
        """The writer committed these turns (its `on_stored` hook): never blocks, never raises."""
        for event in events:
            try:
                self._queue.put_nowait(event["turn_id"])
            except queue.Full:
                self._dropped += 1
                if self._dropped == 1 or self._dropped % 10_000 == 0:
                    log.warning("OpenTelemetry export is behind: %d turn(s) not exported "
                                "(`tooltap otel export` can send them)", self._dropped)
            except Exception:
                pass

    def close(self, timeout: float = CLOSE_SECONDS) -> None:
        """Send what is pending, within `timeout` seconds; what a dead collector still
        holds then is dropped (the turns themselves are stored)."""
        if self._closed:
            return
        self._closed = True
        deadline = time.monotonic() + timeout
        if self._thread.is_alive():
            try:
                self._queue.put(_STOP, timeout=0.1)
            except queue.Full:  # far behind: what waits is dropped with the thread
                pass
            self._thread.join(max(0.1, (deadline - time.monotonic()) / 2))
        stopper = threading.Thread(target=self.processor.shutdown, name="tooltap-otel-stop", daemon=True)
        stopper.start()
        stopper.join(max(0.1, deadline - time.monotonic()))

    # -- the export thread ----------------------------------------------------------------

    def _run(self) -> None:
        from ..store.db import make_engine

        engine = make_engine(self.db_url)
        try:
            while True:
                ids, stopping = self._take()
                try:
                    self._export(engine, ids, stopping)
                except Exception:  # telemetry must outlive any bug or database hiccup
                    log.exception("OpenTelemetry export of %d turn(s) failed", len(ids))
                if stopping:
                    return
        finally:
            engine.dispose()

    def _take(self) -> tuple[list[int], bool]:
        ids: list[int] = []
        try:
            item = self._queue.get(timeout=min(PENDING_SECONDS, 60.0))
        except queue.Empty:
            return ids, False
        while True:
            if item is _STOP:
                return ids, True
            ids.append(item)
            try:
                item = self._queue.get_nowait()
            except queue.Empty:
                return ids, False

    def _export(self, engine, ids: list[int], stopping: bool) -> None:
        from .source import turns_by_id

        turns = [t for t in turns_by_id(engine, ids, self.content) if exportable(t)]
        for turn in turns:
            self._emit([chat_span(turn, self.content)])
            if turn.calls:
                self._pending[turn.id] = time.monotonic()
        self.sent_turns += len(turns)
        # Calls answered by these turns, calls nobody answered in time, and (stopping) all.
        now = time.monotonic()
        due = {t.parent_id for t in turns if t.parent_id in self._pending}
        due |= {i for i, since in self._pending.items() if stopping or now - since > PENDING_SECONDS}
        if due:
            for turn in turns_by_id(engine, due, self.content):
                self._emit(tool_spans(turn, self.content))
                self._pending.pop(turn.id, None)

    def _emit(self, records) -> None:
        for record in records:
            self.processor.on_end(self.converter.readable(record))


class _Watched:
    """The SDK's exporter, reporting failures once a minute in our words rather than
    once a batch in its own."""

    QUIET_SECONDS = 60.0

    def __init__(self, exporter, url: str) -> None:
        self.exporter, self.url = exporter, url
        self.failed = 0
        self._said = 0.0
        logging.getLogger("opentelemetry.exporter").setLevel(logging.CRITICAL)

    def export(self, spans):
        from opentelemetry.sdk.trace.export import SpanExportResult

        try:
            result = self.exporter.export(spans)
        except Exception as exc:
            result, reason = SpanExportResult.FAILURE, f"{type(exc).__name__}: {exc}"
        else:
            reason = None
        if result != SpanExportResult.SUCCESS:
            self.failed += len(spans)
            now = time.monotonic()
            if now - self._said > self.QUIET_SECONDS:
                self._said = now
                log.warning("OpenTelemetry: the collector at %s did not take %d span(s) so far%s; "
                            "the turns are stored (`tooltap otel export` sends them again)",
                            self.url, self.failed, f" ({reason})" if reason else "")
        return result

    def shutdown(self) -> None:
        self.exporter.shutdown()

    def force_flush(self, timeout_millis: int = 30000) -> bool:
        return True
