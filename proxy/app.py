"""The tooltap ASGI application: `/_tooltap/...` is tooltap's own, everything else is forwarded."""

from __future__ import annotations

import asyncio
import gc
import logging
import time
from contextlib import asynccontextmanager

from .config import RESERVED_PREFIX, Settings
from .forward import Forwarder, StreamCut, make_client
from .live import LiveHub
from .store.process import WriterProcess
from .store.shards import Writers
from .store.writer import Writer

log = logging.getLogger("tooltap")


class TooltapApp:
    """Dispatches on the path before anything else runs, so a forwarded request costs one
    string comparison more than talking to the upstream directly."""

    def __init__(self, settings: Settings, writer: Writer | None = None):
        from inspector_ui import create_inspector

        self.settings = settings
        self.live = LiveHub()
        self.writer = writer or _writer(settings, self.live)
        self.client = None
        self.forwarder: Forwarder | None = None
        # Set by the server when a stop begins: the monotonic time by which the process
        # must be gone, so the writer gets what is left of the shutdown grace.
        self.stop_by: float | None = None
        self.mcp = _mcp_proxy(settings)  # None unless --mcp NAME=URL
        self.inspector = create_inspector(self, lifespan=self._lifespan)

    @asynccontextmanager
    async def _lifespan(self, _app):
        self.writer.start()
        self.client = make_client(self.settings)
        self.forwarder = Forwarder(self.settings, self.client, self.writer.submit, self.live)
        if self.mcp is not None:
            await self.mcp.start()
        # What start-up made (modules, the app, the database's metadata) lives as long as
        # the process: out of the collector's sight, or every full collection walks it
        # again (~120 ms for ~110,000 objects here: a pause for whichever request is running).
        gc.collect()  # start-up's garbage first: frozen, it would never be freed
        gc.freeze()
        try:
            yield
        finally:
            if self.mcp is not None:
                await self.mcp.close()
            await self.client.close()
            # In a thread: the live stream and anything else still on the loop keep going.
            await asyncio.to_thread(self.writer.close, self._writer_time())

    def _writer_time(self) -> float:
        """Seconds the writer may take to store what it holds before the rest is spooled."""
        if self.stop_by is None:
            return 30.0
        return max(0.5, self.stop_by - time.monotonic())

    async def __call__(self, scope, receive, send):
        if scope["type"] == "http":
            path = scope["path"]
            if path == RESERVED_PREFIX or path.startswith(RESERVED_PREFIX + "/"):
                return await self.inspector(scope, receive, send)
            if self.mcp is not None and self.mcp.serves(path):
                return await self.mcp(scope, receive, send)
            if path == "/" and scope["method"] in ("GET", "HEAD") and _wants_html(scope):
                return await _redirect(send, RESERVED_PREFIX + "/")
            if path == "/favicon.ico" and _browser_fetches_image(scope):
                # Asked by a browser showing the inspector's JSON or raw bytes: not the
                # upstream's business, and no turn to record.
                return await _no_icon(send)
            return await self.forwarder(scope, receive, send)
        return await self.inspector(scope, receive, send)  # lifespan, websocket


def _writer(settings: Settings, live: LiveHub):
    if settings.writers > 1:
        return Writers(settings.db_url, settings.spool_file(), settings.writers, live=live)
    return WriterProcess(settings.db_url, spool_path=settings.spool_file(), live=live)


def _mcp_proxy(settings: Settings):
    if not settings.mcp_servers:
        return None
    from .mcp.http import McpHttpProxy
    from .mcp.store import Recorder

    return McpHttpProxy(settings.mcp_servers, Recorder(settings.db_url))


def _wants_html(scope) -> bool:
    for k, v in scope["headers"]:
        if k == b"accept":
            return b"text/html" in v
    return False


def _browser_fetches_image(scope) -> bool:
    return scope["method"] == "GET" and any(k == b"sec-fetch-dest" and v == b"image" for k, v in scope["headers"])


async def _no_icon(send) -> None:
    await send({"type": "http.response.start", "status": 204,
                "headers": [(b"cache-control", b"max-age=86400")]})
    await send({"type": "http.response.body", "body": b""})


async def _redirect(send, location: str) -> None:
    await send({"type": "http.response.start", "status": 307,
                "headers": [(b"location", location.encode()), (b"content-length", b"0")]})
    await send({"type": "http.response.body", "body": b""})


class _QuietStreamCuts(logging.Filter):
    """A stream cut on purpose (the upstream dropped it, or the shutdown grace ran out)
    ends by dropping the client's connection; uvicorn would log that as an application
    crash with a traceback. It is recorded as a turn instead."""

    def filter(self, record: logging.LogRecord) -> bool:
        return not (record.exc_info and isinstance(record.exc_info[1], StreamCut))


logging.getLogger("uvicorn.error").addFilter(_QuietStreamCuts())
