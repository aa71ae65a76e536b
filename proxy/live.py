"""Live events for the inspector: turns starting, growing and landing in the database.

A fan-out from the proxy to whoever watches (the inspector's server-sent events). It
costs nothing when nobody watches: the capture checks `hub.watched` before building an
event, and a growing turn publishes its text at most every `GROW_SECONDS`. Slow
watchers lose old events, never slow the proxy.
"""

from __future__ import annotations

import asyncio
import itertools
from typing import Any

GROW_SECONDS = 0.15
QUEUE_MAX = 500


class LiveHub:
    def __init__(self) -> None:
        self._watchers: set[asyncio.Queue] = set()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._ids = itertools.count(1)

    @property
    def watched(self) -> bool:
        return bool(self._watchers)

    def new_id(self) -> str:
        return f"live-{next(self._ids)}"

    def subscribe(self) -> asyncio.Queue:
        self._loop = asyncio.get_running_loop()
        q: asyncio.Queue = asyncio.Queue(QUEUE_MAX)
        self._watchers.add(q)
        return q

    def unsubscribe(self, q: asyncio.Queue) -> None:
        self._watchers.discard(q)

    def publish(self, event: dict[str, Any]) -> None:
        """From the event loop's thread."""
        for q in list(self._watchers):
            if q.full():
                q.get_nowait()  # drop the oldest: a stalled tab must not grow without bound
            q.put_nowait(event)

    def publish_threadsafe(self, event: dict[str, Any]) -> None:
        """From another thread (the store's writer)."""
        if self._watchers and self._loop is not None and not self._loop.is_closed():
            self._loop.call_soon_threadsafe(self.publish, event)
