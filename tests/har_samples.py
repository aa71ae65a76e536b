"""A HAR as mitmproxy's `save.har` writes one, by hand from the format's facts: headers as
{name, value}, bodies as decoded text (the Content-Encoding header kept), `connect` and
`ssl` null on a reused connection, startedDateTime with a +00:00 offset, keys in clear.

The agent is Cline without native tool calling: it writes its calls as XML in the reply,
and the next request carries their results."""

from __future__ import annotations

import json

KEY = "sk-proj-abcdefghijklmnopqrstuvwxyz0123"
SYSTEM = {"role": "system", "content": "You are Cline, a highly skilled software engineer."}
TASK = {"role": "user", "content": "<task>\nweather in Paris tomorrow?\n</task>"}
REPLY = ("Let me check.\n<use_mcp_tool>\n<server_name>weather</server_name>\n<tool_name>get_forecast</tool_name>\n"
         "<arguments>\n{\"latitude\": 48.85, \"longitude\": 2.35}\n</arguments>\n</use_mcp_tool>")
RESULT = "[use_mcp_tool for 'weather'] Result:\nSunny, 24°C"
STREAM = "".join(
    f"data: {json.dumps(chunk, ensure_ascii=False)}\n\n" for chunk in [
        {"id": "c2", "object": "chat.completion.chunk", "model": "gpt-4o-2024-08-06",
         "choices": [{"index": 0, "delta": {"role": "assistant", "content": "Sunny, "}, "finish_reason": None}]},
        {"id": "c2", "object": "chat.completion.chunk", "model": "gpt-4o-2024-08-06",
         "choices": [{"index": 0, "delta": {"content": "24°C tomorrow."}, "finish_reason": "stop"}]},
        {"id": "c2", "object": "chat.completion.chunk", "model": "gpt-4o-2024-08-06", "choices": [],
         "usage": {"prompt_tokens": 120, "completion_tokens": 6, "total_tokens": 126}},
    ]) + "data: [DONE]\n\n"


def _headers(**values: str) -> list[dict]:
    return [{"name": k.replace("_", "-"), "value": v} for k, v in values.items()]


def _entry(started: str, method: str, url: str, request: dict | None, status: int, response_headers: list[dict],
           text: str, timings: dict) -> dict:
    body = json.dumps(request) if request is not None else ""
    entry = {
        "startedDateTime": started,
        "time": sum(v for v in timings.values() if v is not None and v >= 0),
        "request": {
            "method": method, "url": url, "httpVersion": "HTTP/1.1", "cookies": [],
            "headers": _headers(host="api.openai.com", authorization=f"Bearer {KEY}", content_type="application/json",
                                user_agent="OpenAI/JS 4.83.0"),
            "queryString": [], "headersSize": 250, "bodySize": len(body.encode()),
        },
        "response": {
            "status": status, "statusText": "OK", "httpVersion": "HTTP/1.1", "cookies": [],
            "headers": response_headers,
            "content": {"size": len(text.encode()), "compression": 0, "mimeType": response_headers[0]["value"],
                        "text": text},
            "redirectURL": "", "headersSize": 120, "bodySize": len(text.encode()),
        },
        "cache": {},
        "timings": timings,
        "serverIPAddress": "162.159.140.245",
    }
    if request is not None:
        entry["request"]["postData"] = {"mimeType": "application/json", "text": body, "params": []}
    return entry


def mitmproxy_har() -> dict:
    first = {"model": "gpt-4o", "messages": [SYSTEM, TASK]}
    second = {"model": "gpt-4o", "stream": True, "stream_options": {"include_usage": True}, "messages": [
        SYSTEM, TASK, {"role": "assistant", "content": REPLY},
        {"role": "user", "content": [{"type": "text", "text": RESULT}]}]}
    completion = {"id": "chatcmpl-1", "object": "chat.completion", "model": "gpt-4o-2024-08-06",
                  "choices": [{"index": 0, "message": {"role": "assistant", "content": REPLY}, "finish_reason": "stop"}],
                  "usage": {"prompt_tokens": 50, "completion_tokens": 40, "total_tokens": 90}}
    json_headers = _headers(content_type="application/json")
    return {"log": {
        "version": "1.2",
        "creator": {"name": "mitmproxy exporthar", "version": "0.1", "comment": "mitmproxy version 12.1.1"},
        "pages": [],
        "entries": [
            _entry("2025-06-01T10:00:00.100000+00:00", "GET", "https://api.openai.com/v1/models", None, 200,
                   json_headers, '{"object": "list", "data": []}',
                   {"connect": 20.0, "ssl": 15.0, "send": 0.2, "receive": 1.0, "wait": 80.0}),
            _entry("2025-06-01T10:00:01.000000+00:00", "POST", "https://api.openai.com/v1/chat/completions", first,
                   200, json_headers, json.dumps(completion),
                   {"connect": None, "ssl": None, "send": 1.5, "receive": 3.5, "wait": 900.0}),
            _entry("2025-06-01T10:00:05.000000+00:00", "POST", "https://api.openai.com/v1/chat/completions", second,
                   200, _headers(content_type="text/event-stream; charset=utf-8", content_encoding="gzip"), STREAM,
                   {"connect": None, "ssl": None, "send": 1.0, "receive": 250.0, "wait": 400.0}),
        ],
    }}
