"""OpenAI Responses (`POST .../responses`).

The stream is typed events (`event: <type>`, JSON with `type` and `sequence_number`, no
`[DONE]`). `response.completed` (or `.incomplete` / `.failed`) carries the whole final
Response, so a finished stream needs no assembly at all. The rest of this module exists
for streams that end early: the last known Response (`response.created` /
`.in_progress`) plus every output item, finished ones from `response.output_item.done`,
unfinished ones from `response.output_item.added` and the deltas received since.
"""

from __future__ import annotations

from typing import Any

from ..sse import Event
from . import register
from .base import RequestKeys, ToolCall, WireAPIBase, event_json


class _Piece:
    """A dict being streamed: its initial value plus, per string field, the deltas
    received (joined only when a result is asked for), plus items appended to list fields."""

    __slots__ = ("base", "deltas", "appended")

    def __init__(self, base: dict[str, Any]) -> None:
        self.base = dict(base)
        self.deltas: dict[str, list[str]] = {}
        self.appended: dict[str, list[Any]] = {}

    def add(self, field: str, delta: str) -> None:
        self.deltas.setdefault(field, []).append(delta)

    def set(self, field: str, value: Any) -> None:
        # A `.done` event states the whole value: it supersedes the deltas.
        self.base[field] = value
        self.deltas.pop(field, None)

    def build(self) -> dict[str, Any]:
        out = dict(self.base)
        for field, parts in self.deltas.items():
            out[field] = (out.get(field) or "") + "".join(parts)
        for field, items in self.appended.items():
            out[field] = list(out.get(field) or []) + items
        return out


class _Item(_Piece):
    """An output item still streaming: item-level string fields (`arguments`, `input`)
    plus its content parts and reasoning-summary parts, by index."""

    __slots__ = ("content", "summary")

    def __init__(self, base: dict[str, Any]) -> None:
        super().__init__(base)
        self.content: dict[int, _Piece] = {}
        self.summary: dict[int, _Piece] = {}

    def build(self) -> dict[str, Any]:
        out = super().build()
        if self.content:
            out["content"] = _merge_indexed(out.get("content"), self.content)
        if self.summary:
            out["summary"] = _merge_indexed(out.get("summary"), self.summary)
        return out


def _merge_indexed(initial: list[Any] | None, pieces: dict[int, _Piece]) -> list[Any]:
    merged = dict(enumerate(initial or []))
    merged.update((i, piece.build()) for i, piece in pieces.items())
    return [merged[i] for i in sorted(merged)]


# Content-part text: event type -> (field, part to create if `content_part.added` was
# missed). A `.delta` extends the field, a `.done` states it whole.
_OUTPUT_TEXT = {"type": "output_text", "text": "", "annotations": []}
_PART_TEXT = {
    "response.output_text.delta": ("text", _OUTPUT_TEXT),
    "response.output_text.done": ("text", _OUTPUT_TEXT),
    "response.refusal.delta": ("refusal", {"type": "refusal", "refusal": ""}),
    "response.refusal.done": ("refusal", {"type": "refusal", "refusal": ""}),
    "response.reasoning_text.delta": ("text", {"type": "reasoning_text", "text": ""}),
    "response.reasoning_text.done": ("text", {"type": "reasoning_text", "text": ""}),
}
# Item-level string deltas: event type -> field.
_ITEM_DELTAS = {
    "response.function_call_arguments.delta": "arguments",
    "response.custom_tool_call_input.delta": "input",
}
_ITEM_DONES = {
    "response.function_call_arguments.done": "arguments",
    "response.custom_tool_call_input.done": "input",
}
_LIFECYCLE = ("response.created", "response.queued", "response.in_progress")
_FINAL = ("response.completed", "response.incomplete", "response.failed")
_SENT_BACK = ("message", "function_call", "custom_tool_call")  # output items a later input may hold


class ResponsesAssembler:
    def __init__(self) -> None:
        self.error: dict[str, Any] | None = None
        self._response: dict[str, Any] = {}  # the latest lifecycle snapshot
        self._final: dict[str, Any] | None = None
        self._items: dict[int, _Item] = {}
        self._done: dict[int, dict[str, Any]] = {}

    def feed(self, event: Event) -> None:
        payload = event_json(event.data)
        if not isinstance(payload, dict):
            return
        kind = payload.get("type") or event.event
        if kind in _LIFECYCLE:
            self._response = dict(payload.get("response") or {})
        elif kind in _FINAL:
            self._final = dict(payload.get("response") or {})
            if kind == "response.failed" and self.error is None and self._final.get("error"):
                self.error = self._final["error"]
        elif kind == "error":
            # Documented shape: code/message/param at the top level; some servers nest
            # them under `error`.
            nested = payload.get("error")
            if isinstance(nested, dict):
                self.error = nested
            else:
                self.error = {k: v for k, v in payload.items() if k not in ("type", "sequence_number")}
        elif kind == "response.output_item.added":
            if isinstance(payload.get("item"), dict):
                self._items[payload.get("output_index", len(self._items))] = _Item(payload["item"])
        elif kind == "response.output_item.done":
            if isinstance(payload.get("item"), dict):
                self._done[payload.get("output_index", len(self._done))] = payload["item"]
        else:
            self._delta(kind, payload)

    def _item(self, payload: dict[str, Any]) -> _Item:
        index = payload.get("output_index", -1)
        item = self._items.get(index)
        if item is None:  # its `output_item.added` was missed: keep the deltas anyway
            item = self._items[index] = _Item({"id": payload.get("item_id")})
        return item

    def _delta(self, kind: str, payload: dict[str, Any]) -> None:
        if kind in _PART_TEXT:
            field, blank = _PART_TEXT[kind]
            part = self._item(payload).content.setdefault(payload.get("content_index", 0), _Piece(blank))
            if kind.endswith(".delta"):
                part.add(field, payload.get("delta", ""))
            elif field in payload:
                part.set(field, payload[field])
        elif kind in ("response.content_part.added", "response.content_part.done"):
            if isinstance(payload.get("part"), dict):
                self._item(payload).content[payload.get("content_index", 0)] = _Piece(payload["part"])
        elif kind == "response.output_text.annotation.added":
            content = self._item(payload).content
            part = content.setdefault(payload.get("content_index", 0), _Piece(_OUTPUT_TEXT))
            part.appended.setdefault("annotations", []).append(payload.get("annotation"))
        elif kind in _ITEM_DELTAS:
            self._item(payload).add(_ITEM_DELTAS[kind], payload.get("delta", ""))
        elif kind in _ITEM_DONES:
            field = _ITEM_DONES[kind]
            if field in payload:
                self._item(payload).set(field, payload[field])
        elif kind in ("response.reasoning_summary_part.added", "response.reasoning_summary_part.done"):
            if isinstance(payload.get("part"), dict):
                self._item(payload).summary[payload.get("summary_index", 0)] = _Piece(payload["part"])
        elif kind == "response.reasoning_summary_text.delta":
            summary = self._item(payload).summary
            part = summary.setdefault(payload.get("summary_index", 0), _Piece({"type": "summary_text", "text": ""}))
            part.add("text", payload.get("delta", ""))
        # Anything else (web search progress, audio, ...) changes nothing we keep.

    def _output(self) -> list[dict[str, Any]]:
        indices = sorted(self._items.keys() | self._done.keys())
        return [self._done[i] if i in self._done else self._items[i].build() for i in indices]

    def result(self) -> dict[str, Any]:
        if self._final is not None:
            response = dict(self._final)
            if response.get("output") is None:  # some servers leave it out: rebuild it
                response["output"] = self._output()
            return response
        response = dict(self._response)
        if self._items or self._done or "output" not in response:
            response["output"] = self._output()
        return response


class OpenAIResponses(WireAPIBase):
    name = "openai.responses"
    keys = RequestKeys(messages="input", system="instructions", tools="tools")
    assembler = ResponsesAssembler

    def short_input(self, value: Any) -> list[dict[str, Any]] | None:
        # `input: "text"`, the SDK's commonest call, is one user message.
        return [{"role": "user", "content": value}] if isinstance(value, str) else None

    def continues(self, request: dict[str, Any]) -> str | None:
        # The server holds the conversation so far: an earlier answer, or a conversation
        # (`conversation`: its id, or {"id": ...}); the request carries only what is new.
        return _id(request.get("previous_response_id")) or _conversation(request)

    def continue_id(self, request: dict[str, Any] | None, response: Any) -> str | None:
        # In a conversation, the next request names the conversation, else this answer.
        if not isinstance(response, dict):
            return None
        return _conversation(request or {}) or _conversation(response) or _id(response.get("id"))

    def written_out(self, request: dict[str, Any], earlier: list[tuple[dict, dict]]) -> dict[str, Any]:
        items: list[Any] = []
        for asked, answer in [*earlier, (request, {})]:
            items += self.short_input(asked.get("input")) or list(asked.get("input") or [])
            # An answer's output items are input items (the SDK's own way to continue
            # without a reference), less their ids: those name items the recording's server
            # held, and reasoning items are left out (an endpoint accepts only its own), so a
            # reasoning model refuses a `fc_` id sent without its `rs_` item. `call_id` pairs.
            items += [{k: v for k, v in i.items() if k != "id"} for i in answer.get("output") or []
                      if isinstance(i, dict) and i.get("type") in _SENT_BACK]
        body = {k: v for k, v in request.items() if k not in ("previous_response_id", "conversation")}
        if earlier:
            body["input"] = items
        return body

    def closes(self, event: Event) -> bool:
        return event.event in _FINAL

    def matches(self, method: str, path: str) -> bool:
        return method == "POST" and path.rstrip("/").endswith("/responses")

    def tool_calls(self, response: dict[str, Any]) -> list[ToolCall]:
        calls: list[ToolCall] = []
        for item in response.get("output") or []:
            if not isinstance(item, dict):
                continue
            kind, name = item.get("type"), item.get("name") or ""
            if kind == "function_call":
                calls.append(ToolCall.from_raw(len(calls), item.get("call_id"), name, item.get("arguments") or ""))
            elif kind == "mcp_call":  # a remote MCP tool run by OpenAI: same JSON arguments
                calls.append(ToolCall.from_raw(len(calls), item.get("id"), name, item.get("arguments") or ""))
            elif kind == "custom_tool_call":
                # Free-form input, not JSON: the text itself is the argument.
                raw = item.get("input") or ""
                calls.append(ToolCall(index=len(calls), id=item.get("call_id"), name=name, arguments_raw=raw, arguments=raw))
        return calls

    def text(self, response: dict[str, Any]) -> str:
        return "".join(
            part.get("text", "")
            for item in response.get("output") or [] if item.get("type") == "message"
            for part in item.get("content") or [] if part.get("type") == "output_text"
        )


def _id(value: Any) -> str | None:
    return value if isinstance(value, str) and value else None


def _conversation(body: dict[str, Any]) -> str | None:
    conversation = body.get("conversation")
    return _id(conversation.get("id") if isinstance(conversation, dict) else conversation)


API = register(OpenAIResponses())
