"""Incremental Server-Sent Events decoder: bytes in, events out.

Follows the WHATWG event-stream rules: lines end in LF, CR or CRLF (and a network chunk
may end between the CR and the LF), `:` starts a comment, one space after the field colon
is dropped, `data` lines of one event join with LF, a blank line dispatches. Lines are
split on bytes, never with str.splitlines, which would also split on U+2028 inside JSON.
Unlike the browser algorithm, a last event with no blank line after it is still
dispatched by `close()`: llama.cpp ends its streams that way.
"""

from __future__ import annotations

import re
from typing import NamedTuple


class Event(NamedTuple):  # a tuple: cheap to build, one per event on every stream
    data: str
    event: str = "message"
    id: str | None = None
    retry: int | None = None


_new_event = tuple.__new__  # Event(...) by keyword costs several times more, once per event


class SSEDecoder:
    def __init__(self) -> None:
        self._pending: list[bytes] = []  # the start of a line still arriving (no CR/LF in it)
        self._skip_lf = False  # the previous chunk ended in CR: a leading LF belongs to it
        self._first_line = True  # a UTF-8 BOM may open the stream
        self._data: list[str] = []
        self._event = ""
        self._id: str | None = None
        self._retry: int | None = None
        self.comments = 0

    def feed(self, chunk: bytes) -> list[Event]:
        if self._skip_lf and chunk:
            self._skip_lf = False
            if chunk[:1] == b"\n":
                chunk = chunk[1:]
        if not chunk:  # an empty read must not forget a pending CR
            return []
        if b"\n" not in chunk and b"\r" not in chunk:
            # A long line arriving in many reads: park the piece, no copy and no rescan.
            self._pending.append(chunk)
            return []
        if self._pending:
            self._pending.append(chunk)
            buf = b"".join(self._pending)
            self._pending = []
        else:
            buf = chunk
        events: list[Event] = []
        if b"\r" not in buf:  # LF-only, as nearly every server sends: split in one call
            lines = buf.split(b"\n")
            rest = lines.pop()
            if self._first_line and lines:
                event = self._line(lines.pop(0))  # a BOM may open it
                if event is not None:
                    events.append(event)
            data = self._data
            for line in lines:  # data lines and blank ones inline: the rest of a stream
                if line[:6] == b"data: ":  # the space dropped before decoding: one copy, not two
                    data.append(line[6:].decode("utf-8", errors="replace"))
                    continue
                if line[:5] == b"data:":
                    data.append(line[5:].decode("utf-8", errors="replace"))
                    continue
                event = self._dispatch() if not line else self._line(line)
                if event is not None:
                    events.append(event)
                    data = self._data
            if rest:
                self._pending.append(rest)
            return events
        start = 0
        n = len(buf)
        lf = cr = -2  # next LF / CR at or after start; -1: none left; -2: not searched yet
        while start < n:
            if lf != -1 and lf < start:
                lf = buf.find(b"\n", start)
            if cr != -1 and cr < start:
                cr = buf.find(b"\r", start)
            if cr >= 0 and (lf < 0 or cr < lf):
                end, nxt = cr, cr + 1
                if nxt < n and buf[nxt] == 0x0A:
                    nxt += 1
                elif nxt == n:
                    self._skip_lf = True
            elif lf >= 0:
                end, nxt = lf, lf + 1
            else:
                break
            event = self._line(buf[start:end])
            if event is not None:
                events.append(event)
            start = nxt
        if start < n:
            self._pending.append(buf[start:])
        return events

    def close(self) -> list[Event]:
        """End of stream: dispatch what is pending, even without a final blank line."""
        events = []
        if self._pending:
            event = self._line(b"".join(self._pending))
            self._pending = []
            if event is not None:
                events.append(event)
        event = self._dispatch()
        if event is not None:
            events.append(event)
        return events

    def _line(self, raw: bytes) -> Event | None:
        if self._first_line:
            self._first_line = False
            if raw.startswith(b"\xef\xbb\xbf"):  # WHATWG: one leading BOM is dropped
                raw = raw[3:]
        if not raw:
            return self._dispatch()
        if raw.startswith(b"data:"):  # the common line, without the general field parsing
            value = raw[5:].decode("utf-8", errors="replace")
            self._data.append(value[1:] if value[:1] == " " else value)
            return None
        # Decoding per whole line keeps a UTF-8 character split across chunks intact.
        line = raw.decode("utf-8", errors="replace")
        if line[0] == ":":
            self.comments += 1
            return None
        field, sep, value = line.partition(":")
        if sep and value[:1] == " ":
            value = value[1:]
        if field == "data":
            self._data.append(value)
        elif field == "event":
            self._event = value
        elif field == "id":
            if "\0" not in value:
                self._id = value
        elif field == "retry":
            if value.isascii() and value.isdigit():  # "²".isdigit() is True too
                self._retry = int(value)
        return None

    def _dispatch(self) -> Event | None:
        if not self._data:  # a block with no data line dispatches nothing
            self._event = ""
            return None
        event = _new_event(Event, ("\n".join(self._data), self._event or "message", self._id, self._retry))
        self._data = []
        self._event = ""
        self._retry = None
        return event


def last_event(tail: bytes) -> Event | None:
    """The last event of a stream's last bytes, if they end with it whole (its blank line
    came); None if they stop within an event. The bytes may begin anywhere in the stream."""
    decoder = SSEDecoder()
    events = decoder.feed(tail)
    return events[-1] if events and not decoder.close() else None


def data_only(stream: bytes) -> list[bytes] | None:
    """The data of every event of a whole stream made of one-line `data: ` events only,
    each ended by a blank line, LF line ends (as nearly every OpenAI-compatible server
    sends them): what SSEDecoder would give, found in one split and not yet decoded to
    text. Comment lines before the first event (keep-alive pings: DeepSeek, OpenRouter)
    dispatch nothing and are passed over; a stream cut short ends with what its last
    event got, as the decoder's close() gives it. None for any other stream, which
    takes the decoder."""
    stream = _after_comments(stream)
    if stream is None:
        return None
    if not stream:
        return []
    if not stream.startswith(b"data: ") or b"\r" in stream:
        return None
    end = 2 if stream.endswith(b"\n\n") else 1 if stream.endswith(b"\n") else 0  # 0, 1: cut short
    payloads = stream[6:len(stream) - end].split(b"\n\ndata: ")
    # Every line end accounted for by the events' own ends: no event has a second line.
    return payloads if stream.count(b"\n") == 2 * (len(payloads) - 1) + end else None


def named_events(stream: bytes) -> list[tuple[bytes, bytes]] | None:
    """As data_only, for a stream whose every event names its type on a line before its
    one data line (`event: NAME`, as Anthropic sends them): (type, data) pairs, both
    not yet decoded (an empty type means "message"); a stream cut short within its last
    data line ends with what that event got. None for any other stream."""
    stream = _after_comments(stream)
    if stream is None or b"\r" in stream or not _NAMED_EVENTS.fullmatch(stream):
        return None
    lines = stream.split(b"\n")  # event, data, blank, event, data, blank, ..., ""
    return list(zip([line[7:] for line in lines[0::3]], [line[6:] for line in lines[1::3]]))


_NAMED_EVENTS = re.compile(rb"(?:event: [^\n]*\ndata: [^\n]*\n\n)*(?:event: [^\n]*\ndata: [^\n]*\n?)?")


def _after_comments(stream: bytes) -> bytes | None:
    """The stream after the comment lines before its first event, each a block of its
    own; None if a comment line is one of an event's lines."""
    start = 0
    while stream.startswith(b":", start):
        end = stream.find(b"\n", start)
        if end < 0 or stream[end + 1:end + 2] != b"\n":
            return None
        start = end + 2
    return stream[start:] if start else stream
