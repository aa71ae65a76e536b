"""Per-request stage times inside a proxy process, for bench/breakdown.py.

perf_counter is CLOCK_MONOTONIC, shared by every process on the machine, so these times
line up with the client's. Wraps an ASGI app; the upstream request is timed by wrapping
the upstream client's `request` (tooltap and bare_proxy.py use the same client).
"""

from __future__ import annotations

import contextvars
import json
import time

_current: contextvars.ContextVar[list] = contextvars.ContextVar("stages")


def _timed(request):
    async def timed(*args, **kwargs):
        stages = _current.get(None)
        if stages is not None:
            stages.append(time.perf_counter())
        response = await request(*args, **kwargs)
        if stages is not None:
            stages.append(time.perf_counter())
        return response

    return timed


class Stages:
    def __init__(self, app, path: str):
        from proxy import upstream

        self.app = app
        self.out = open(path, "a", buffering=1)
        upstream.Client.request = _timed(upstream.Client.request)

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        stages = [time.perf_counter()]
        _current.set(stages)
        first = True

        async def timed_send(message):
            nonlocal first
            if first and message["type"] == "http.response.body":
                stages.append(time.perf_counter())
                await send(message)
                stages.append(time.perf_counter())
                first = False
            else:
                await send(message)

        await self.app(scope, receive, timed_send)
        if len(stages) == 5:
            self.out.write(json.dumps(stages) + "\n")
