"""A real OTLP/HTTP trace receiver for tests: a tiny HTTP server on a free loopback port
that decodes each request with the official protobuf definitions (opentelemetry-proto),
as a collector would."""

from __future__ import annotations

import gzip
import threading
import time
import zlib
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
    ExportTraceServiceRequest,
    ExportTraceServiceResponse,
)
from opentelemetry.proto.common.v1.common_pb2 import AnyValue


@dataclass
class Span:
    name: str
    trace_id: str  # hex, as backends show it
    span_id: str
    parent_span_id: str  # "" for a root span
    kind: int
    start_ns: int
    end_ns: int
    attributes: dict
    status_code: int
    status_message: str
    resource: dict
    scope: str


def _value(v: AnyValue):
    kind = v.WhichOneof("value")
    if kind == "array_value":
        return [_value(x) for x in v.array_value.values]
    if kind == "kvlist_value":
        return {kv.key: _value(kv.value) for kv in v.kvlist_value.values}
    return getattr(v, kind) if kind else None


class OtlpReceiver:
    def __init__(self) -> None:
        self.spans: list[Span] = []
        self.requests = 0
        self._lock = threading.Lock()
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self):  # noqa: N802 - the http.server API
                body = self.rfile.read(int(self.headers.get("content-length", 0)))
                encoding = (self.headers.get("content-encoding") or "").lower()
                if encoding == "gzip":
                    body = gzip.decompress(body)
                elif encoding == "deflate":
                    body = zlib.decompress(body)
                if self.path != "/v1/traces" or self.headers.get("content-type") != "application/x-protobuf":
                    self.send_response(404)
                    self.end_headers()
                    return
                request = ExportTraceServiceRequest()
                request.ParseFromString(body)
                receiver._add(request)
                answer = ExportTraceServiceResponse().SerializeToString()
                self.send_response(200)
                self.send_header("content-type", "application/x-protobuf")
                self.send_header("content-length", str(len(answer)))
                self.end_headers()
                self.wfile.write(answer)

            def log_message(self, *args):  # quiet
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server.server_address[1]}"

    def _add(self, request: ExportTraceServiceRequest) -> None:
        with self._lock:
            self.requests += 1
            for rs in request.resource_spans:
                resource = {kv.key: _value(kv.value) for kv in rs.resource.attributes}
                for ss in rs.scope_spans:
                    for s in ss.spans:
                        self.spans.append(Span(
                            name=s.name, trace_id=s.trace_id.hex(), span_id=s.span_id.hex(),
                            parent_span_id=s.parent_span_id.hex(), kind=s.kind,
                            start_ns=s.start_time_unix_nano, end_ns=s.end_time_unix_nano,
                            attributes={kv.key: _value(kv.value) for kv in s.attributes},
                            status_code=s.status.code, status_message=s.status.message,
                            resource=resource, scope=ss.scope.name,
                        ))

    def wait_for(self, count: int, timeout: float = 15.0) -> list[Span]:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            with self._lock:
                if len(self.spans) >= count:
                    return list(self.spans)
            time.sleep(0.05)
        with self._lock:
            return list(self.spans)

    def __enter__(self) -> "OtlpReceiver":
        self.thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self.server.shutdown()
        self.server.server_close()
