"""Readable copies of what the SQL views show but the store keeps compressed.

Messages and responses live zlib-compressed (content.py), which no SQL view can open in
SQLite. The reply's text is what people look for most, so each turn also keeps it as
plain text (`turns.response_text`, shown by `turns_v`), cut at REPLY_MAX characters;
the whole response stays in the compressed column. An upstream's error message goes into
the turn's `error`, where a query for what went wrong looks.
"""

from __future__ import annotations

from typing import Any

from .. import apis
from .content import text_safe

REPLY_MAX = 64 * 1024


def reply_text(api_name: str, response: Any) -> str | None:
    """The assistant's text in a stored response, or None (no response, no text)."""
    api = apis.by_name(api_name)
    if api is None or not isinstance(response, dict):
        return None
    try:
        text = api.text(response)
    except Exception:  # a response of an unexpected shape has no readable text
        return None
    if isinstance(text, list):  # content given as parts by some OpenAI-compatible servers
        text = "".join(p.get("text", "") for p in text if isinstance(p, dict) and isinstance(p.get("text"), str))
    if not isinstance(text, str) or not text:
        return None
    return text_safe(text[:REPLY_MAX])


def upstream_message(response: Any, stream_error: Any) -> str | None:
    """What the provider said went wrong: `error.message` in OpenAI's, Anthropic's and
    Gemini's error bodies alike (or in a mid-stream error event)."""
    if isinstance(stream_error, dict) and isinstance(stream_error.get("message"), str):
        return stream_error["message"]  # an event's error object itself
    for body in (stream_error, response):
        error = body.get("error") if isinstance(body, dict) else None
        if isinstance(error, dict) and isinstance(error.get("message"), str):
            return error["message"]
        if isinstance(error, str):
            return error
    return None


def upstream_note(http_status: int | None, response: Any, stream_error: Any) -> str | None:
    """An upstream error turn's message as its `error` says it, or None without one."""
    message = upstream_message(response, stream_error)
    if message is None:
        return None
    said = text_safe(message[:REPLY_MAX])
    if stream_error:
        return f"the upstream's stream reported an error: {said}"
    return f"{http_status or 'an error'} from the upstream: {said}"
