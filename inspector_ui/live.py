"""`GET /_tooltap/api/live`: the LiveHub's events as server-sent events.

Event names are the hub's (`turn_started`, `turn_growing`, `turn_finished`,
`turn_stored`), data is the event as JSON. The page scripts decide what to draw.
"""

from __future__ import annotations

import asyncio
import json

import anyio
from fastapi import APIRouter, Request
from sse_starlette.sse import EventSourceResponse

router = APIRouter()


# A stop signal ends each live stream as a stream that finished (its generator returns),
# not one cut off: uvicorn would log an ERROR for every inspector tab left open.
WAIT_SECONDS = 0.25
GRACE_SECONDS = 1.0


@router.get("/live")
async def live(request: Request):
    hub = request.app.state.tooltap.live
    stopping = anyio.Event()

    async def events():
        # Subscribed here, not in the endpoint: a stream ended before its first item (a
        # client gone, a HEAD) never runs the `finally`, and its watcher would stay, making
        # every forwarded turn do live work for nobody.
        queue = hub.subscribe()
        try:
            yield {"event": "hello", "data": "{}"}  # lets a page know it is connected
            while not stopping.is_set():
                try:
                    event = await asyncio.wait_for(queue.get(), timeout=WAIT_SECONDS)
                except asyncio.TimeoutError:
                    if await request.is_disconnected():
                        return
                    continue
                kind = event.get("type") or event.get("event") or "message"
                yield {"event": kind, "data": json.dumps(event, ensure_ascii=False)}
        finally:
            hub.unsubscribe(queue)

    return EventSourceResponse(events(), ping=15, headers={"cache-control": "no-store"},
                               shutdown_event=stopping, shutdown_grace_period=GRACE_SECONDS)
