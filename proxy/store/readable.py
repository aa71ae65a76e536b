"""Readable copies of what the SQL views show but the store keeps compressed.

Messages and responses live zlib-compressed (content.py), which no SQL view can open in
SQLite. The reply's text is what people look for most, so each turn also keeps it as
plain text (`turns.response_text`, shown by `turns_v`), cut at REPLY_MAX characters;
the whole response stays in the compressed column.
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
