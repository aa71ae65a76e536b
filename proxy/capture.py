"""Capture: what the hot path records about one exchange while the bytes pass through.

The forwarder calls `feed()` with each network chunk *after* it has been written to the
client. Feeding keeps the exact bytes (in memory up to a limit, then in a temporary file,
so a long stream costs flat memory), their sha256 and a timeline of chunk arrivals.
`finish()` returns a `TurnRecord`: plain data that the store's writer thread turns into
rows, off the request path. Decoding an event stream into the provider's non-streaming
response (`StreamAssembly`) waits for the writer too, unless someone watches the turn
live in the inspector: then it runs as the chunks pass, to show the text growing.
"""

from __future__ import annotations

import io
import os
import re
import tempfile
import time
import zlib
from dataclasses import dataclass, field
from typing import Any

import orjson

from . import apis
from .live import GROW_SECONDS, LiveHub
from .secrets import redact_headers
from .store.sessions import session_key
from .sse import SSEDecoder, data_only, named_events

RAW_IN_MEMORY = 2 * 1024 * 1024
TIMELINE_MAX = 4096  # chunk arrivals kept per turn; later ones are dropped from the timeline only
CLOSING_TAIL = 4096  # bytes read back, on a client's hang-up, to find the stream's closing event
CLOSING_DECODE_MAX = 8 << 20  # a compressed stream decoded, on a hang-up, to find it (on the event loop)


@dataclass
class TurnRecord:
    """One exchange, as the store receives it. Secrets are already redacted."""

    started_at: float  # unix time
    method: str
    path: str  # as the client asked, query included (redacted)
    upstream: str  # redacted upstream base URL
    request_headers: list  # as they came until Capture.finish() fingerprints their secrets
    request_body: bytes
    session_hint: str | None = None  # X-Tooltap-Session
    api: str = "other"
    http_status: int | None = None
    response_headers: list = field(default_factory=list)  # likewise
    status: str = "ok"
    error: str | None = None
    stream: bool = False
    ttft_ms: float | None = None
    duration_ms: float | None = None
    raw: bytes | str = b""  # exact bytes sent to the client, or the path of a file holding them
    raw_size: int = 0
    raw_sha256: str = ""  # worked out by the writer when empty (off the hot path)
    timeline: list[list[float]] = field(default_factory=list)  # [byte offset, ms since start]
    response: dict[str, Any] | None = None  # assembled from the stream; None: parse `raw` later
    stream_error: dict[str, Any] | None = None
    unparsed_events: int = 0
    live_id: str | None = None  # names the turn in live events until it has a database id
    seq: int = 0  # the writer process's receipt number (0: none)
    uid: str = ""  # names the turn for good (turns.uid); given by the journal unless set here
    route: str | None = ""  # the prefix of `path` that chose a named upstream ("/claude"); None: not known

    def iter_raw(self, size: int = 1 << 20):
        if isinstance(self.raw, bytes):
            yield self.raw
            return
        with open(self.raw, "rb") as f:
            while chunk := f.read(size):
                yield chunk

    def raw_bytes(self) -> bytes:
        return b"".join(self.iter_raw())

    def body(self):
        """The request body as the writer may read it without a copy (journal.JournaledTurn:
        possibly a `store.resent.Spliced`)."""
        return self.request_body

    def release(self) -> None:
        """The raw bytes are stored: delete their temporary file, if any."""
        if isinstance(self.raw, str):
            try:
                os.unlink(self.raw)
            except FileNotFoundError:
                pass


class RawBuffer:
    """A response's exact bytes: in memory up to RAW_IN_MEMORY, then in a named temporary
    file, so a long stream costs flat memory and the writer can take the file by name."""

    def __init__(self) -> None:
        self._memory: io.BytesIO | None = io.BytesIO()
        self._file = None
        self._path: str | None = None

    def write(self, chunk: bytes) -> None:
        if self._memory is not None:
            if self._memory.tell() + len(chunk) <= RAW_IN_MEMORY:
                self._memory.write(chunk)
                return
            fd, self._path = tempfile.mkstemp(prefix="tooltap-raw-")
            self._file = os.fdopen(fd, "wb")
            self._file.write(self._memory.getbuffer())
            self._memory = None
        self._file.write(chunk)

    def tail(self, n: int) -> bytes:
        """The last `n` bytes written (all of them, if fewer)."""
        if self._memory is not None:
            with self._memory.getbuffer() as view:
                return bytes(view[-n:])
        self._file.flush()
        end = self._file.tell()
        return os.pread(self._file.fileno(), n, max(0, end - n))  # mkstemp's descriptor reads too

    def chunks(self, size: int = 1 << 16):
        """What was written so far, in pieces of `size` bytes."""
        if self._memory is not None:
            with self._memory.getbuffer() as view:
                for i in range(0, len(view), size):
                    yield bytes(view[i:i + size])
            return
        self._file.flush()
        end, at = self._file.tell(), 0
        while at < end:
            piece = os.pread(self._file.fileno(), min(size, end - at), at)
            if not piece:
                return
            yield piece
            at += len(piece)

    def hand_over(self) -> bytes | str:
        """The bytes, or the path of the closed file that holds them."""
        if self._memory is not None:
            return self._memory.getvalue()
        self._file.close()
        return self._path

    def discard(self) -> None:
        if self._file is not None:
            self._file.close()
            os.unlink(self._path)
        self._memory, self._file = io.BytesIO(), None


def codings(content_encoding: str | None) -> list[str]:
    """The codings a Content-Encoding value names, in the order they were applied:
    case-insensitive (RFC 9110), `identity` and empty members left out."""
    if not content_encoding:
        return []
    return [c for c in (part.strip().lower() for part in content_encoding.split(",")) if c and c != "identity"]


def header_values(headers, name: str) -> str | None:
    """Every value of a header, joined as one list (`name` lower-case): a header sent on
    several lines, such as stacked codings, reads as one."""
    values = [v for k, v in headers if k.lower() == name]
    return ", ".join(values) if values else None


class Decompressor:
    """Undo a Content-Encoding chunk by chunk, for capture and replay only; the client
    gets the bytes as sent. Stacked codings (`deflate, gzip`) are undone last first; none
    (`identity`) gives the bytes back."""

    def __init__(self, encoding: str | None) -> None:
        self.encoding = encoding
        self.steps = [self._step(c, encoding) for c in reversed(codings(encoding))]

    @staticmethod
    def _step(coding: str, encoding: str | None):
        if coding in ("gzip", "x-gzip"):
            return zlib.decompressobj(16 + zlib.MAX_WBITS).decompress
        if coding == "deflate":
            return zlib.decompressobj().decompress
        if coding == "br":
            import brotli

            return brotli.Decompressor().process
        if coding == "zstd":
            import zstandard

            return zstandard.ZstdDecompressor().decompressobj().decompress
        raise ValueError(f"unsupported content-encoding {encoding!r}")

    def __call__(self, chunk: bytes) -> bytes:
        for step in self.steps:
            chunk = step(chunk)
        return chunk


class TooLarge(ValueError):
    pass


def decompress(data: bytes, encoding: str | None, limit: int | None = None) -> bytes:
    """`data` decoded. Past `limit` decoded bytes, TooLarge, before more is decoded: a few
    hundred bytes of br or zstd can hold gigabytes."""
    if limit is None:
        return Decompressor(encoding)(data)
    Decompressor(encoding)  # an unsupported coding says so, as unbounded
    for coding in reversed(codings(encoding)):
        if coding == "br":
            import brotli

            d = brotli.Decompressor()
            out = d.process(data, output_buffer_limit=limit + 1)
            more = not d.can_accept_more_data()
        elif coding == "zstd":
            import zstandard

            reader, pieces, size = zstandard.ZstdDecompressor().stream_reader(data), [], 0
            while size <= limit and (piece := reader.read(limit + 1 - size)):
                pieces.append(piece)
                size += len(piece)
            out, more = b"".join(pieces), False
        else:  # gzip, deflate
            d = zlib.decompressobj(16 + zlib.MAX_WBITS if coding in ("gzip", "x-gzip") else zlib.MAX_WBITS)
            out = d.decompress(data, limit + 1)
            more = bool(d.unconsumed_tail)
        if more or len(out) > limit:
            raise TooLarge(f"more than {limit} bytes once decompressed")
        data = out
    return data


class StreamAssembly:
    """An event stream's bytes in, the provider's non-streaming response out: undo the
    content encoding, decode SSE, feed the wire API's assembler. Never raises: what cannot
    be decoded is reported in `error` and the raw bytes stay the record."""

    def __init__(self, api: apis.WireAPI, content_encoding: str | None) -> None:
        self.api = api
        self.error: str | None = None
        self.events = 0  # none in a whole stream: it was no event stream at all (flagged)
        self._sse: SSEDecoder | None = SSEDecoder()
        self._assembler = api.new_assembler()
        self._decompress = None
        try:
            d = Decompressor(content_encoding)
            self._decompress = d if d.steps else None
        except Exception as exc:
            self._fail(exc)

    def feed(self, chunk: bytes) -> None:
        if self._sse is None:
            return
        try:
            for event in self._sse.feed(self._decompress(chunk) if self._decompress else chunk):
                self.events += 1
                self._assembler.feed(event)
        except Exception as exc:
            self._fail(exc)

    def feed_stream(self, stream: bytes) -> None:
        """A whole stream at once. A stream of simple events (one data line each, and
        perhaps an event line: sse.data_only, sse.named_events) skips the SSE decoder when
        the assembler can take their data undecoded."""
        assembler, events, feed = self._assembler, None, None
        if self._decompress is None and self._sse is not None:
            if hasattr(assembler, "feed_data"):
                events, feed = data_only(stream), assembler.feed_data
            elif hasattr(assembler, "feed_events"):
                events, feed = named_events(stream), assembler.feed_events
        if events is None:
            self.feed(stream)
            return
        self.events += len(events)
        try:
            feed(events)
        except Exception as exc:
            self._fail(exc)

    def text(self) -> str:
        return self.api.text(self._assembler.result())

    def model(self) -> str | None:
        """The model the stream names so far (None until it does): the stored turn's `model`."""
        return self.api.model({}, self._assembler.result())

    def finish(self, rec: "TurnRecord") -> None:
        """Close the stream and put the response (and any mid-stream error) on `rec`."""
        if self._sse is not None:
            try:
                for event in self._sse.close():
                    self.events += 1
                    self._assembler.feed(event)
            except Exception as exc:
                self._fail(exc)
        try:
            rec.response = self._assembler.result()
            rec.stream_error = self._assembler.error
            rec.unparsed_events = len(getattr(self._assembler, "unparsed", ()) or ())
        except Exception as exc:
            self._fail(exc)
        if rec.unparsed_events:
            self.error = "; ".join(filter(None, [
                self.error, f"capture: {rec.unparsed_events} event(s) were not JSON (kept in the raw bytes)"]))
        if not self.events and not self.error and rec.raw_size:
            self.error = f"capture: no events in the {rec.raw_size}-byte event stream (kept in the raw bytes)"
        if self.error:
            rec.error = f"{rec.error}; {self.error}" if rec.error else self.error

    def _fail(self, exc: Exception) -> None:
        self.error = f"capture: {type(exc).__name__}: {exc}"
        self._sse = None


def assemble(rec: "TurnRecord", api: apis.WireAPI, content_encoding: str | None) -> None:
    """Assemble a recorded stream after the fact, from its raw bytes (the writer does
    this for every stream nobody watched live)."""
    assembly = StreamAssembly(api, content_encoding)
    if isinstance(rec.raw, bytes):
        assembly.feed_stream(rec.raw)
    else:  # a file: in pieces
        for chunk in rec.iter_raw(64 * 1024):
            assembly.feed(chunk)
    assembly.finish(rec)
    if rec.stream_error and rec.status == "ok":
        rec.status = "upstream_error"


_MODEL_IN_PATH = re.compile(r"/models/([^/:?]+)")
MODEL_PARSE_MAX = 2 << 20  # the live view reads a larger body's model once it is stored


def model_in_path(path: str) -> str | None:
    """Gemini names the model in the URL (`/v1beta/models/gemini-2.5-pro:generateContent`)."""
    m = _MODEL_IN_PATH.search(path)
    return m.group(1) if m else None


def request_model(api: apis.WireAPI | None, rec: TurnRecord) -> str | None:
    """The model a request names, as the store will read it: the body's, as the wire API
    reads it, else Gemini's path. It parses the body: for the live view only, once a turn,
    while someone watches, and only a body of at most MODEL_PARSE_MAX (on the event loop).
    A body still arriving (a large one goes upstream part by part) names none yet."""
    request = None
    if rec.request_body and len(rec.request_body) <= MODEL_PARSE_MAX:
        try:
            request = orjson.loads(rec.request_body)
        except ValueError:  # not JSON, or not whole yet
            pass
    return model_of(api, request if isinstance(request, dict) else None, None, rec.path)


def model_of(api: apis.WireAPI | None, request: dict | None, response: Any, path: str) -> str | None:
    """A turn's model: the answer's or the request's, as its wire API reads them, else
    the one Gemini names in the path."""
    model = None
    if request is not None:
        model = (api.model(request, response) if api is not None else None) or request.get("model")
    return model if isinstance(model, str) and model else model_in_path(path)


class Capture:
    """What the hot path keeps while a response passes: cheap work per chunk only.
    Assembly waits for the writer, unless someone watches the turn live."""

    def __init__(self, record: TurnRecord, api: apis.WireAPI | None, live: LiveHub | None = None) -> None:
        self.record = record
        self.api = api
        self.live = live
        self._last_live = 0.0
        self._live_model: str | None = None
        self._t0 = time.perf_counter()
        self._raw = RawBuffer()
        self._raw_ok = True
        self._size = 0
        self._assembly: StreamAssembly | None = None  # only while watched live
        self._encoding: str | None = None  # the response's Content-Encoding

    def elapsed_ms(self) -> float:
        return (time.perf_counter() - self._t0) * 1000

    def response_started(self, status: int, headers: list[tuple[str, str]], content_type: str) -> None:
        """`headers` as they came: their secrets are fingerprinted by finish() (as the
        request's are), after the stream rather than before its first byte, and before
        anything is stored."""
        rec = self.record
        rec.http_status = status
        rec.response_headers = headers
        rec.stream = content_type.startswith("text/event-stream")
        # Every line of the header: codings may be stacked on several.
        content_encoding = self._encoding = header_values(headers, "content-encoding")
        if self.live is not None and self.live.watched:
            rec.live_id = self.live.new_id()
            if rec.stream and self.api is not None:
                self._assembly = StreamAssembly(self.api, content_encoding)
            # The session is known this early only when the client names it (the writer
            # threads the others). A stream names its model as it comes (turn_growing); a
            # JSON answer has no such events: its request names the model, read once here.
            self.live.publish({"type": "turn_started", "live_id": rec.live_id, "path": rec.path,
                               "api": rec.api, "method": rec.method, "http_status": status,
                               "stream": rec.stream, "session_id": session_key(rec.session_hint),
                               "model": None if rec.stream else request_model(self.api, rec)})

    def feed(self, chunk: bytes) -> None:
        """Never raises: a capture that fails (a full disk) is flagged, the stream goes on."""
        rec = self.record
        at = (time.perf_counter() - self._t0) * 1000
        if rec.ttft_ms is None:
            rec.ttft_ms = at
        if len(rec.timeline) < TIMELINE_MAX:
            rec.timeline.append([self._size, round(at, 3)])
        self._size += len(chunk)
        if self._raw_ok:
            try:
                self._raw.write(chunk)
            except OSError as exc:  # the temporary file's disk is full
                rec.error = f"capture: raw bytes not kept ({exc}); the stream itself was unaffected"
                self._raw_ok = False
                self._raw.discard()
        if self._assembly is not None:
            self._assembly.feed(chunk)
            now = time.perf_counter()
            if now - self._last_live >= GROW_SECONDS and self.live.watched:
                self._last_live = now
                if self._live_model is None:  # named once, in the stream's first events
                    self._live_model = self._assembly.model()
                self.live.publish({"type": "turn_growing", "live_id": rec.live_id, "model": self._live_model,
                                   "text": self._assembly.text(), "bytes": self._size})

    def answer_closed(self) -> bool:
        """The client has the stream's closing event (`[DONE]`, `message_stop`...): the
        whole answer, whatever follows it on the wire."""
        if not (self.record.stream and self._raw_ok and self.api is not None):
            return False
        return self.api.stream_closed(self._decoded_tail())

    def _decoded_tail(self) -> bytes:
        """The stream's last CLOSING_TAIL bytes as the client's SDK read them: decoded.
        A compressed stream's end does not decode alone, so it is decoded from its
        first byte, here rather than chunk by chunk as it passed: only on a hang-up."""
        if not codings(self._encoding):
            return self._raw.tail(CLOSING_TAIL)
        if self._size > CLOSING_DECODE_MAX:
            return b""  # too long to decode on the event loop: taken for a client that gave up
        tail = b""
        try:
            decode = Decompressor(self._encoding)
            for chunk in self._raw.chunks():
                out = decode(chunk)
                tail = out[-CLOSING_TAIL:] if len(out) >= CLOSING_TAIL else (tail + out)[-CLOSING_TAIL:]
        except Exception:  # an unknown coding, damaged bytes: no closing event to be sure of
            return b""
        return tail

    def finish(self, status: str | None = None, error: str | None = None) -> TurnRecord:
        rec = self.record
        rec.duration_ms = self.elapsed_ms()
        rec.raw_size = self._size  # before the assembly's check of it; its sha256 is the writer's work
        if self._assembly is not None:
            self._assembly.finish(rec)
        if error:
            rec.error = error if not rec.error else f"{error}; {rec.error}"
        if status:
            rec.status = status
        elif (rec.http_status or 0) >= 400 or rec.stream_error:
            rec.status = "upstream_error"
        rec.request_headers = redact_headers(rec.request_headers)
        rec.response_headers = redact_headers(rec.response_headers)
        rec.raw = self._raw.hand_over()  # the writer stores it, then releases it
        if rec.live_id is not None:
            self.live.publish({"type": "turn_finished", "live_id": rec.live_id, "status": rec.status})
        return rec
