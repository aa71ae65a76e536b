"""Limits on clients that hold connections without using them (slowloris, idle floods).

uvicorn closes a connection left idle between two requests, but it waits for ever for the
head of a first request and for a body that trickles in, and it accepts connections
until the process runs out of file descriptors, after which new agents get a reset and
nothing is logged. This is uvicorn's httptools protocol with timers and a cap:

- a request head must arrive within `head_timeout` seconds (counted from the connection,
  or from the first byte of a later request on a kept-alive one) and be at most
  `max_head_bytes`; else 408 (or 431) and the connection is closed;
- a request body gets `body_timeout` seconds plus one per `body_min_rate` bytes that
  came; else 408 and the connection is closed (the turn says so);
- at `max_connections`, a new connection pushes out the oldest idle one (one that never
  sent a whole request first, then kept-alive ones); with none idle it gets a 503.

What the limits do is logged, one line per kind at most every `LOG_EVERY` seconds.
"""

from __future__ import annotations

import asyncio
import logging
import weakref
from collections import Counter
from dataclasses import dataclass

from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

from .forward import HANG_UP, TIMED_OUT

log = logging.getLogger("tooltap")

LOG_EVERY = 10.0
LINGER = 2.0  # seconds a refused client may go on sending before the socket is closed


@dataclass(frozen=True)
class Limits:
    head_timeout: float = 10.0
    max_head_bytes: int = 256 * 1024
    body_timeout: float = 30.0
    body_min_rate: float = 16 * 1024  # bytes per second a body must keep up after body_timeout
    max_connections: int | None = None


def _reply(status: bytes, message: str) -> bytes:
    body = message.encode() + b"\n"
    return (b"HTTP/1.1 " + status + b"\r\ncontent-type: text/plain; charset=utf-8\r\n"
            b"content-length: " + str(len(body)).encode() + b"\r\nconnection: close\r\n\r\n" + body)


class GuardedHttpProtocol(HttpToolsProtocol):
    """uvicorn's protocol with a deadline on whatever the client owes: a head or a body.
    No timer runs while the app answers: a long stream is never cut for being long."""

    def __init__(self, *args, limits: Limits, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.limits = limits
        self.pool = _Pool.of(self.server_state, limits, self.loop)
        self._timer: asyncio.TimerHandle | None = None
        self._owed: str | None = None  # "head" | "body" | None
        self._since = 0.0
        self._bytes = 0  # of the head or body being received
        self._lingering = False

    # -- connection life -----------------------------------------------------------------

    def connection_made(self, transport) -> None:
        super().connection_made(transport)
        if self.pool.admit(self):
            self._expect("head")

    def connection_lost(self, exc) -> None:
        self._done_with_deadlines()
        self.pool.forget(self)
        cycle = self.cycle
        super().connection_lost(exc)
        if cycle is not None and cycle.disconnected:  # mid-request: the app's callbacks
            for hang_up in cycle.scope.get("extensions", {}).get(HANG_UP, ()):
                hang_up()

    def handle_websocket_upgrade(self) -> None:
        # Not forwarded (OpenAI Realtime, Gemini Live): a clear refusal rather than
        # uvicorn's websocket layer, which would log the address, `?key=` and all, and
        # hand the inspector a socket it only closes.
        self._refuse("websocket", b"501 Not Implemented", "tooltap does not forward WebSocket connections "
                     "(OpenAI Realtime, Gemini Live): connect this client to the provider directly")

    # -- the parser's events -------------------------------------------------------------

    def data_received(self, data: bytes) -> None:
        if self._lingering:
            return  # what a refused client still sends is read and dropped
        if self._owed == "head":
            self._bytes += len(data)
        super().data_received(data)
        if self._owed == "head" and self._bytes > self.limits.max_head_bytes:
            self._refuse("head_size", b"431 Request Header Fields Too Large",
                         f"request head over {self.limits.max_head_bytes} bytes")

    def on_message_begin(self) -> None:
        super().on_message_begin()
        if self._owed != "head":  # a later request on a kept-alive connection: from its first byte
            self._expect("head")

    def on_headers_complete(self) -> None:
        self.scope["extensions"] = {HANG_UP: []}  # before the request's cycle takes the scope
        super().on_headers_complete()
        self.pool.busy(self)
        self._expect("body")  # ended by on_message_complete (at once when there is none)

    def on_body(self, body: bytes) -> None:
        self._bytes += len(body)
        super().on_body(body)

    def on_message_complete(self) -> None:
        super().on_message_complete()
        self._expect(None)

    def on_response_complete(self) -> None:
        super().on_response_complete()
        if not self.transport.is_closing() and self._owed is None:
            self.pool.idle(self, served=True)

    # -- deadlines -----------------------------------------------------------------------

    def _expect(self, owed: str | None) -> None:
        """What the client owes from now. One timer a connection, set no later than the
        deadline: when it fires it checks what is owed then, and since when, and moves
        itself on if there is time left. Kept-alive requests that come and go within the
        head timeout set no timer at all, where one was set and cancelled for each head
        and body."""
        self._owed, self._since, self._bytes = owed, self.loop.time(), 0
        if owed is None:
            return
        due = self._since + self._allowed()
        if self._timer is not None and self._timer.when() > due:
            self._timer.cancel()
            self._timer = None
        if self._timer is None:
            self._timer = self.loop.call_at(due, self._expired)

    def _allowed(self) -> float:
        if self._owed == "head":
            return self.limits.head_timeout
        return self.limits.body_timeout + self._bytes / self.limits.body_min_rate  # more if it keeps coming

    def _done_with_deadlines(self) -> None:
        """The connection is closing or no longer HTTP's: nothing owed, no timer left."""
        self._expect(None)
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None

    def _expired(self) -> None:
        self._timer = None
        if self.transport.is_closing() or self._owed is None:
            return  # nothing owed now: the next head or body sets it again
        left = self._since + self._allowed() - self.loop.time()
        if left > 0.01:
            self._timer = self.loop.call_later(left, self._expired)
            return
        if self._owed == "body":
            why = (f"the client was too slow sending its request body ({self._bytes} bytes "
                   f"in {self.loop.time() - self._since:.0f} s); tooltap answered 408")
            if self.cycle is not None:
                self.cycle.scope.setdefault("extensions", {})[TIMED_OUT] = why
            self._refuse("body", b"408 Request Timeout", "request body too slow",
                         answer=self.cycle is None or not self.cycle.response_started)
        elif self._owed == "head":
            # Nothing at all: just close (a browser's spare connection, or a flood).
            self._refuse("head", b"408 Request Timeout", "request head too slow", answer=self._bytes > 0)

    def _refuse(self, kind: str, status: bytes, message: str, answer: bool = True) -> None:
        self._done_with_deadlines()
        self.pool.notes.add(kind)
        if not answer:
            self.transport.close()
            return
        self.transport.write(_reply(status, message))
        self._linger()

    def _linger(self) -> None:
        """Half-close and drain before closing. Closing a socket the client still writes to
        makes the kernel send a reset, and a reset can destroy the answer in the client's
        receive buffer before it reads it: the client would see a bare reset, not the 408."""
        if self.cycle is not None and not self.cycle.response_complete:
            self.cycle.disconnected = True  # the app sees the client gone and writes nothing more
            self.cycle.message_event.set()
        self._lingering = True
        try:
            self.transport.write_eof()
            self.transport.resume_reading()
        except (OSError, RuntimeError, NotImplementedError):
            self.transport.close()
            return
        self.loop.call_later(LINGER, self.transport.close)  # the client's own close ends it sooner


def report(server_state) -> None:
    """Log what the limits did and has not been logged yet (when the server stops)."""
    pool = _Pool._by_server.get(server_state)
    if pool is not None:
        pool.notes.flush_all()


class _Pool:
    """The connections of one server that run no request, oldest first, and the cap."""

    _by_server: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()

    @classmethod
    def of(cls, server_state, limits: Limits, loop) -> "_Pool":
        pool = cls._by_server.get(server_state)
        if pool is None:
            pool = cls._by_server[server_state] = cls(server_state.connections, limits, loop)
        return pool

    def __init__(self, connections: set, limits: Limits, loop) -> None:
        self.connections = connections
        self.cap = limits.max_connections
        self.unserved: dict[GuardedHttpProtocol, None] = {}  # never sent a whole request yet
        self.kept: dict[GuardedHttpProtocol, None] = {}  # kept alive between requests
        self.notes = _Notes(limits, loop)

    def admit(self, proto: GuardedHttpProtocol) -> bool:
        self.unserved[proto] = None
        if self.cap is None or len(self.connections) <= self.cap:
            return True
        victim = next((p for p in (*self.unserved, *self.kept) if p is not proto), None)
        if victim is not None:
            self.forget(victim)
            victim._done_with_deadlines()
            victim.transport.close()
            self.notes.add("evicted")
            return True
        self.forget(proto)
        proto._refuse("refused", b"503 Service Unavailable", "tooltap is at its connection limit")
        return False

    def busy(self, proto) -> None:
        self.forget(proto)

    def idle(self, proto, served: bool) -> None:
        (self.kept if served else self.unserved)[proto] = None

    def forget(self, proto) -> None:
        self.unserved.pop(proto, None)
        self.kept.pop(proto, None)


class _Notes:
    """Counts of what the limits did: each kind logged at once the first time, then at
    most once per LOG_EVERY seconds, so a flood of slow clients makes a few lines, not
    thousands."""

    TEXT = {
        "head": "sent no request head within {t:g} s",
        "head_size": "sent a request head over {b} bytes",
        "body": "sent a request body too slowly (under {r:g} KB/s after {bt:g} s)",
        "evicted": "were idle when the connection limit ({cap}) was reached, to make room",
        "refused": "arrived at the connection limit ({cap}) with every connection busy (answered 503)",
        "websocket": "asked for a WebSocket, which tooltap does not forward (answered 501)",
    }

    def __init__(self, limits: Limits, loop) -> None:
        self.limits = limits
        self.loop = loop
        self.counts: Counter[str] = Counter()
        self._quiet_until: dict[str, float] = {}
        self._pending: set[str] = set()

    def add(self, kind: str) -> None:
        self.counts[kind] += 1
        quiet_until = self._quiet_until.get(kind, 0.0)
        if self.loop.time() >= quiet_until:
            self._flush(kind)
        elif kind not in self._pending:
            self._pending.add(kind)
            self.loop.call_at(quiet_until, self._flush, kind)

    def flush_all(self) -> None:
        for kind in list(self.counts):
            self._flush(kind)

    def _flush(self, kind: str) -> None:
        self._pending.discard(kind)
        n = self.counts.pop(kind, 0)
        if not n:
            return
        self._quiet_until[kind] = self.loop.time() + LOG_EVERY
        lim = self.limits
        why = self.TEXT[kind].format(t=lim.head_timeout, b=lim.max_head_bytes, r=lim.body_min_rate / 1024,
                                     bt=lim.body_timeout, cap=lim.max_connections)
        log.warning("closed %d connection(s) that %s", n, why)
