"""A minimal streaming upstream for the benchmarks: a raw ASGI app under uvicorn with
uvloop and httptools, run in its own process so it is not the bottleneck.

    python bench/upstream.py --port 9100

Any POST answers an OpenAI `chat.completion.chunk` event stream, prebuilt once per shape:
  ?n=200&size=150   n events of about `size` bytes each, one ASGI body message per event
                    (the first half content deltas, the second half one tool call's
                    argument fragments, then finish_reason, usage and `data: [DONE]`)
  ?mb=50            about 50 MB of the same events, sent in ~64 KB messages
  ?mb=50&raw=1      about 50 MB of opaque bytes (application/octet-stream), 64 KB messages
The request body is read and ignored.
"""

from __future__ import annotations

import argparse
import json
from functools import lru_cache
from urllib.parse import parse_qs

CREATED = 1_700_000_000
MODEL = "bench-model"
DEFAULT = {"n": 200, "size": 150}  # the stream a request without ?n=&size= gets
SSE_HEADERS = [(b"content-type", b"text/event-stream"), (b"cache-control", b"no-cache")]


def _event(obj) -> bytes:
    return b"data: " + json.dumps(obj, separators=(",", ":")).encode() + b"\n\n"


def _chunk(delta: dict, finish=None, **extra) -> dict:
    return {"id": "chatcmpl-bench", "object": "chat.completion.chunk", "created": CREATED, "model": MODEL,
            "choices": [{"index": 0, "delta": delta, "finish_reason": finish}], **extra}


def _pad(make, size: int) -> bytes:
    """The event `make(text)` with `text` grown until the event is about `size` bytes."""
    base = _event(make(""))
    return _event(make("x" * max(1, size - len(base))))


@lru_cache(maxsize=32)
def chat_stream(n: int, size: int) -> tuple[bytes, ...]:
    """n events: role, content deltas, a tool call whose arguments arrive in fragments,
    the finish, a usage chunk and [DONE] (the last three count towards n)."""
    n = max(n, 6)
    body = n - 3
    content_events = body // 2
    events = [_event(_chunk({"role": "assistant", "content": ""}))]
    events += [_pad(lambda t: _chunk({"content": t}), size) for _ in range(content_events - 1)]
    tool_events = body - content_events
    events.append(_event(_chunk({"tool_calls": [{"index": 0, "id": "call_bench", "type": "function",
                                                  "function": {"name": "write_file", "arguments": '{"text":"'}}]})))
    events += [_pad(lambda t: _chunk({"tool_calls": [{"index": 0, "function": {"arguments": t}}]}), size)
               for _ in range(tool_events - 1)]
    events[-1] = _event(_chunk({"tool_calls": [{"index": 0, "function": {"arguments": '"}'}}]}))
    events.append(_event(_chunk({}, "tool_calls")))
    events.append(_event({**_chunk({}), "choices": [],
                          "usage": {"prompt_tokens": 1000, "completion_tokens": n, "total_tokens": 1000 + n}}))
    events.append(b"data: [DONE]\n\n")
    return tuple(events)


@lru_cache(maxsize=4)
def big_stream(mb: int, raw: bool, block: int = 64 * 1024) -> tuple[tuple[bytes, ...], bytes, bytes]:
    """(head, repeated block, repeat count as bytes, tail) for an ~mb MB stream."""
    if raw:
        unit = bytes(range(256)) * (block // 256)
        head, tail = b"", b""
    else:
        ev = _pad(lambda t: _chunk({"content": t}), 150)
        unit = ev * (block // len(ev))
        head = _event(_chunk({"role": "assistant", "content": ""}))
        tail = _event(_chunk({}, "stop")) + b"data: [DONE]\n\n"
    return head, unit, (mb * 1024 * 1024) // len(unit), tail


async def app(scope, receive, send):
    if scope["type"] == "lifespan":
        while True:
            msg = await receive()
            if msg["type"] == "lifespan.startup":
                await send({"type": "lifespan.startup.complete"})
            elif msg["type"] == "lifespan.shutdown":
                await send({"type": "lifespan.shutdown.complete"})
                return
    if scope["type"] != "http":
        return
    while True:  # read (and drop) the request body
        msg = await receive()
        if msg["type"] != "http.request" or not msg.get("more_body"):
            break
    q = {k: v[0] for k, v in parse_qs(scope["query_string"].decode()).items()}
    if "mb" in q:
        raw = q.get("raw") == "1"
        head, unit, count, tail = big_stream(int(q["mb"]), raw)
        headers = [(b"content-type", b"application/octet-stream")] if raw else SSE_HEADERS
        await send({"type": "http.response.start", "status": 200, "headers": headers})
        if head:
            await send({"type": "http.response.body", "body": head, "more_body": True})
        for _ in range(count):
            await send({"type": "http.response.body", "body": unit, "more_body": True})
        await send({"type": "http.response.body", "body": tail, "more_body": False})
        return
    events = chat_stream(int(q.get("n", DEFAULT["n"])), int(q.get("size", DEFAULT["size"])))
    await send({"type": "http.response.start", "status": 200, "headers": SSE_HEADERS})
    for ev in events:
        await send({"type": "http.response.body", "body": ev, "more_body": True})
    await send({"type": "http.response.body", "body": b"", "more_body": False})


def main() -> None:
    import uvicorn

    p = argparse.ArgumentParser()
    p.add_argument("--port", type=int, required=True)
    p.add_argument("--events", type=int, default=200, help="events per stream when the query names none "
                   "(a gateway such as LiteLLM drops the query string)")
    p.add_argument("--size", type=int, default=150, help="bytes per event when the query names none")
    a = p.parse_args()
    DEFAULT.update(n=a.events, size=a.size)
    uvicorn.run(app, host="127.0.0.1", port=a.port, loop="uvloop", http="httptools", log_level="warning",
                access_log=False, server_header=False, date_header=False, lifespan="on")


if __name__ == "__main__":
    main()
