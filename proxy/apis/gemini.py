"""Google Gemini (`POST .../models/<model>:generateContent` and `:streamGenerateContent`).

With `?alt=sse` every event is a whole `GenerateContentResponse` holding the next parts of
each candidate; there is no `[DONE]`. The assembler appends the parts per candidate and
merges adjacent text chunks back into the single part the non-streaming endpoint returns.
A non-streaming response is one such chunk, so feeding it alone gives it back.
"""

from __future__ import annotations

import json
from typing import Any

from ..sse import Event
from . import register
from .base import RequestKeys, ToolCall, WireAPIBase

_TEXT_KEYS = {"text", "thought", "thoughtSignature"}
_PLAIN_TEXT_KEYS = {"text", "thought"}


class _Candidate:
    """One candidate's parts so far. A text part keeps its chunks in a list (joined in
    build) so appending a chunk stays O(1)."""

    __slots__ = ("index", "role", "parts", "texts", "fields")

    def __init__(self, index: int | None) -> None:
        self.index = index
        self.role: str | None = None
        self.parts: list[dict[str, Any]] = []
        self.texts: list[list[str] | None] = []  # per part: text chunks, None for non-text parts
        self.fields: dict[str, Any] = {}  # finishReason, safetyRatings, ...: the latest wins

    def add_part(self, part: dict[str, Any]) -> None:
        keys = part.keys()
        is_text = "text" in part and keys <= _TEXT_KEYS
        # Only a plain text chunk continues the previous text part. A chunk carrying a
        # thoughtSignature (or anything else) starts its own part, so the signature stays
        # on exactly the part it came with.
        if (
            is_text
            and keys <= _PLAIN_TEXT_KEYS
            and self.texts
            and self.texts[-1] is not None
            and bool(self.parts[-1].get("thought")) == bool(part.get("thought"))
        ):
            self.texts[-1].append(part["text"])
            return
        self.parts.append(part)
        self.texts.append([part["text"]] if is_text else None)

    def build(self) -> dict[str, Any]:
        parts = [
            dict(part) if chunks is None or len(chunks) == 1 else {**part, "text": "".join(chunks)}
            for part, chunks in zip(self.parts, self.texts)
        ]
        content: dict[str, Any] = {"parts": parts}
        if self.role is not None:
            content["role"] = self.role
        out: dict[str, Any] = {"content": content, **self.fields}
        if self.index is not None:
            out["index"] = self.index
        return out


class GeminiAssembler:
    def __init__(self) -> None:
        self.error: dict[str, Any] | None = None
        self._candidates: dict[int, _Candidate] = {}
        self._top: dict[str, Any] = {}  # usageMetadata, modelVersion, responseId, ...: latest wins

    def feed(self, event: Event) -> None:
        try:
            payload = json.loads(event.data)
        except ValueError:
            return
        # Without alt=sse the stream is one JSON array of chunks; accept that shape too.
        for chunk in payload if isinstance(payload, list) else [payload]:
            if isinstance(chunk, dict):
                self._chunk(chunk)

    def _chunk(self, chunk: dict[str, Any]) -> None:
        if "error" in chunk:
            self.error = chunk["error"]
            return
        for key, value in chunk.items():
            if key == "candidates":
                for position, candidate in enumerate(value or []):
                    if isinstance(candidate, dict):
                        self._candidate(position, candidate)
            else:
                self._top[key] = value

    def _candidate(self, position: int, data: dict[str, Any]) -> None:
        index = data.get("index")
        key = index if isinstance(index, int) else position
        candidate = self._candidates.get(key)
        if candidate is None:
            candidate = self._candidates[key] = _Candidate(index)
        for field, value in data.items():
            if field == "content":
                content = value or {}
                candidate.role = content.get("role", candidate.role)
                for part in content.get("parts") or []:
                    if isinstance(part, dict):
                        candidate.add_part(part)
            elif field != "index":
                candidate.fields[field] = value

    def result(self) -> dict[str, Any]:
        response: dict[str, Any] = {}
        if self._candidates:
            response["candidates"] = [self._candidates[k].build() for k in sorted(self._candidates)]
        response.update(self._top)
        return response


class Gemini(WireAPIBase):
    name = "gemini"
    keys = RequestKeys(messages="contents", system="systemInstruction", tools="tools")
    assembler = GeminiAssembler

    def matches(self, method: str, path: str) -> bool:
        return method == "POST" and path.endswith((":generateContent", ":streamGenerateContent"))

    def tool_calls(self, response: dict[str, Any]) -> list[ToolCall]:
        calls: list[ToolCall] = []
        for position, candidate in enumerate(response.get("candidates") or []):
            choice = candidate.get("index", position)
            for part in (candidate.get("content") or {}).get("parts") or []:
                call = part.get("functionCall") if isinstance(part, dict) else None
                if isinstance(call, dict):
                    calls.append(
                        ToolCall.from_object(len(calls), call.get("id"), call.get("name") or "", call.get("args", {}), choice)
                    )
        return calls

    def usage(self, response: dict[str, Any]) -> dict[str, Any] | None:
        return response.get("usageMetadata")

    def model(self, request: dict[str, Any], response: dict[str, Any] | None) -> str | None:
        # The model is named in the URL, not the body; the response reports its version.
        return (response or {}).get("modelVersion") or request.get("model")

    def text(self, response: dict[str, Any]) -> str:
        candidates = response.get("candidates") or [{}]
        parts = (candidates[0].get("content") or {}).get("parts") or []
        return "".join(p.get("text", "") for p in parts if not p.get("thought"))


API = register(Gemini())
