"""Anthropic Messages (`POST .../v1/messages`).

A stream is `message_start` (the Message with empty content), then per content block
`content_block_start` / `content_block_delta`* / `content_block_stop`, then `message_delta`
(stop reason and cumulative usage) and `message_stop`; `ping` and `error` may come anywhere.
The assembler rebuilds the Message the non-streaming endpoint would have returned.
"""

from __future__ import annotations

import json
from typing import Any

import orjson

from ..sse import Event
from . import register
from .base import RequestKeys, ToolCall, WireAPIBase, event_json
from .shapes import Shape

# Blocks whose `input` arrives as `input_json_delta` fragments and that are tool calls.
TOOL_USE_TYPES = ("tool_use", "server_tool_use", "mcp_tool_use")


class _Block:
    """One content block being streamed: the block as started plus the pieces of its
    growing fields, kept as lists so each delta is an O(1) append."""

    __slots__ = ("start", "text", "thinking", "json", "citations", "signature", "stopped", "input")

    def __init__(self, start: dict[str, Any]) -> None:
        self.start = start
        self.text: list[str] = []
        self.thinking: list[str] = []
        self.json: list[str] = []
        self.citations: list[Any] = []
        self.signature: str | None = None
        self.stopped = False
        self.input: dict[str, Any] | None = None  # fields set once the JSON is parsed

    def stop(self) -> None:
        # Parse the tool input once, at the end; a result() call never re-parses it.
        self.stopped = True
        self.input = self._parse_input(final=True)

    def _parse_input(self, final: bool) -> dict[str, Any]:
        raw = "".join(self.json)
        if raw.strip() == "":
            # Nothing streamed: the started input stands (it is `{}` in practice).
            if self.start.get("type") in TOOL_USE_TYPES or "input" in self.start:
                return {"input": self.start.get("input") or {}}
            return {}
        try:
            return {"input": json.loads(raw)}
        except ValueError as exc:
            # Keep what the model sent where an inspector will see it; never raise.
            why = f"invalid JSON: {exc}" if final else "incomplete: stream ended inside the tool input"
            return {"input": self.start.get("input") or {}, "input_raw": raw, "input_error": why}

    def build(self) -> dict[str, Any]:
        block = dict(self.start)
        if self.text:
            block["text"] = (block.get("text") or "") + "".join(self.text)
        if self.thinking:
            block["thinking"] = (block.get("thinking") or "") + "".join(self.thinking)
        if self.signature is not None:
            block["signature"] = self.signature
        if self.citations:
            block["citations"] = list(block.get("citations") or []) + self.citations
        block.update(self.input if self.stopped else self._parse_input(final=False))
        return block


class MessagesAssembler:
    def __init__(self) -> None:
        self.error: dict[str, Any] | None = None
        self._message: dict[str, Any] = {"type": "message", "role": "assistant", "content": []}
        self._blocks: dict[int, _Block] = {}
        self._usage: dict[str, Any] = {}

    def feed(self, event: Event) -> None:
        self._event(event_json(event.data), event.event)  # tool input streams as partial_json strings

    def feed_events(self, events: list[tuple[bytes, bytes]]) -> None:
        """A whole stream's events by type and data, not yet decoded to text
        (sse.named_events): as if each were fed as an Event, without the decoding. A
        delta that is the last one's bytes with another piece in them is read as that
        piece alone (shapes.Shape)."""
        shape = None
        for name, data in events:
            if shape is not None and shape.take(data):
                continue
            name = name.decode("utf-8", errors="replace") or "message"
            try:
                payload = orjson.loads(data)
            except ValueError:  # not JSON, or not UTF-8: as an Event, decoded as the decoder would
                shape = None
                self.feed(Event(data.decode("utf-8", errors="replace"), name))
                continue
            self._event(payload, name)
            shape = self._shape(data, payload)

    def _event(self, payload: Any, name: str) -> None:
        if not isinstance(payload, dict):  # not JSON: nothing this API defines
            return
        handler = _HANDLERS.get(payload.get("type") or name)
        if handler is not None:
            handler(self, payload)

    def _shape(self, data: bytes, payload: dict[str, Any]) -> Shape | None:
        """The shape of a delta just merged that added one piece to a block still open."""
        delta = payload.get("delta")
        if payload.get("type") != "content_block_delta" or type(delta) is not dict or len(delta) != 2:
            return None
        found = _DELTA_PIECES.get(delta.get("type"))
        block = self._blocks.get(payload.get("index", -1))
        if found is None or block is None or block.stopped or type(delta.get(found[0])) is not str:
            return None
        key, pieces_of = found
        return Shape.learn(data, _delta_of, key, pieces_of(block), keeps_empty=True)

    def _message_start(self, payload: dict[str, Any]) -> None:
        message = dict(payload.get("message") or {})
        self._usage = dict(message.get("usage") or {})
        for i, block in enumerate(message.get("content") or []):
            self._blocks[i] = _Block(dict(block))
        self._message = message

    def _block_start(self, payload: dict[str, Any]) -> None:
        self._blocks[payload.get("index", len(self._blocks))] = _Block(dict(payload.get("content_block") or {}))

    def _block_delta(self, payload: dict[str, Any]) -> None:
        block = self._blocks.get(payload.get("index", -1))
        delta = payload.get("delta") or {}
        if block is None or block.stopped:
            return  # a delta for a block never started (or already closed): nowhere to put it
        kind = delta.get("type")
        if kind == "text_delta":
            block.text.append(delta.get("text", ""))
        elif kind == "input_json_delta":
            block.json.append(delta.get("partial_json", ""))
        elif kind == "thinking_delta":
            block.thinking.append(delta.get("thinking", ""))
        elif kind == "signature_delta":
            block.signature = delta.get("signature", "")
        elif kind == "citations_delta":
            block.citations.append(delta.get("citation"))

    def _block_stop(self, payload: dict[str, Any]) -> None:
        block = self._blocks.get(payload.get("index", -1))
        if block is not None and not block.stopped:
            block.stop()

    def _message_delta(self, payload: dict[str, Any]) -> None:
        # stop_reason, stop_sequence and whatever else the delta carries (container, ...).
        delta = payload.get("delta") or {}
        self._message.update((k, v) for k, v in delta.items() if k != "content")
        # Usage on message_delta is cumulative: replace each field it reports, keep the
        # message_start value of the ones it omits (or sends as null).
        for key, value in (payload.get("usage") or {}).items():
            if value is not None:
                self._usage[key] = value

    def _error(self, payload: dict[str, Any]) -> None:
        self.error = payload.get("error") or payload

    def result(self) -> dict[str, Any]:
        message = dict(self._message)
        message["content"] = [self._blocks[i].build() for i in sorted(self._blocks)]
        if self._usage or "usage" in message:
            message["usage"] = dict(self._usage)
        return message


# The deltas that add a piece of text to their block: the field and where it goes.
_DELTA_PIECES = {
    "text_delta": ("text", lambda block: block.text),
    "input_json_delta": ("partial_json", lambda block: block.json),
    "thinking_delta": ("thinking", lambda block: block.thinking),
}


def _delta_of(payload: dict[str, Any]) -> dict[str, Any]:
    return payload["delta"]


_HANDLERS = {
    "message_start": MessagesAssembler._message_start,
    "content_block_start": MessagesAssembler._block_start,
    "content_block_delta": MessagesAssembler._block_delta,
    "content_block_stop": MessagesAssembler._block_stop,
    "message_delta": MessagesAssembler._message_delta,
    "error": MessagesAssembler._error,
    # message_stop, ping and unknown types carry nothing to keep.
}


class AnthropicMessages(WireAPIBase):
    name = "anthropic.messages"
    keys = RequestKeys(messages="messages", system="system", tools="tools")
    assembler = MessagesAssembler

    def closes(self, event: Event) -> bool:
        return event.event == "message_stop"

    def matches(self, method: str, path: str) -> bool:
        return method == "POST" and path.rstrip("/").endswith("/v1/messages")

    def tool_calls(self, response: dict[str, Any]) -> list[ToolCall]:
        calls: list[ToolCall] = []
        for block in response.get("content") or []:
            if not isinstance(block, dict) or block.get("type") not in TOOL_USE_TYPES:
                continue
            name = block.get("name") or ""
            if "input_raw" in block:  # the streamed input did not parse: show it as sent
                calls.append(ToolCall.from_raw(len(calls), block.get("id"), name, block["input_raw"]))
            else:
                calls.append(ToolCall.from_object(len(calls), block.get("id"), name, block.get("input", {})))
        return calls

    def text(self, response: dict[str, Any]) -> str:
        return "".join(b.get("text", "") for b in response.get("content") or [] if b.get("type") == "text")


API = register(AnthropicMessages())
