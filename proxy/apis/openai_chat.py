"""OpenAI Chat Completions (`POST .../chat/completions`), and every server that copies it.

`ChatAssembler` turns a `chat.completion.chunk` stream back into the `chat.completion` the
non-streaming endpoint would have returned, honouring the quirks of the servers that copy
the API (see DESIGN.md, "Wire formats"). Every feed() touches only the new chunk: text is
kept as lists of pieces and joined in result().
"""

from __future__ import annotations

import json
from typing import Any

import orjson

from ..sse import Event
from . import register
from .base import RequestKeys, ToolCall, WireAPIBase, event_json
from .shapes import Shape

# Delta fields that are text streamed in pieces. A field is kept on the message only if
# some delta carried it, so each provider's own shape comes back (DeepSeek sends no
# `refusal`, OpenAI sends `refusal: null`).
_TEXT_FIELDS = ("content", "refusal", "reasoning_content", "reasoning")
# Chunk fields that identify the response: the first non-blank value wins (Azure's first
# chunk, the prompt filter one, has id "" and created 0).
_IDENTITY = ("id", "created", "model")
# Chunk fields that are stream mechanics, not part of the completion.
_STREAM_ONLY = {"object", "choices", "usage", "obfuscation", "error"}
_CHOICE_KEYS = {"index", "delta", "logprobs", "finish_reason"}


def _blank(value: Any) -> bool:
    return value is None or value == "" or (type(value) is int and value == 0)


def _nonempty_str(value: Any) -> bool:
    return isinstance(value, str) and value != ""


class _Call:
    """One tool call (or a legacy function_call) being assembled."""

    __slots__ = ("id", "type", "name", "args", "extra")

    def __init__(self) -> None:
        self.id: str | None = None
        self.type: str | None = None
        self.name: str | None = None
        self.args: list[str] = []
        self.extra: dict[str, Any] = {}  # e.g. Gemini's extra_content.google.thought_signature

    def merge(self, entry: dict[str, Any]) -> None:
        # id, type and name are set once: some servers repeat them on every fragment or
        # send "" later, and neither may be appended nor overwrite the first value.
        if self.id is None and _nonempty_str(entry.get("id")):
            self.id = entry["id"]
        if self.type is None and _nonempty_str(entry.get("type")):
            self.type = entry["type"]
        fn = entry.get("function")
        if isinstance(fn, dict):
            self.merge_function(fn)
        for key, value in entry.items():
            if key not in ("index", "id", "type", "function") and value is not None:
                self.extra[key] = value

    def merge_function(self, fn: dict[str, Any]) -> None:
        if self.name is None and _nonempty_str(fn.get("name")):
            self.name = fn["name"]
        args = fn.get("arguments")
        if isinstance(args, str):
            if args:
                self.args.append(args)
        elif args is not None:  # a server that sends an object instead of JSON text
            self.args.append(json.dumps(args, ensure_ascii=False, separators=(",", ":")))

    def function(self) -> dict[str, Any]:
        return {"name": self.name or "", "arguments": "".join(self.args)}

    def tool_call(self) -> dict[str, Any]:
        out = {"id": self.id, "type": self.type or "function", "function": self.function()}
        out.update(self.extra)
        return out


class _Choice:
    __slots__ = ("index", "role", "text", "other", "calls", "by_index", "function_call",
                 "other_text", "logprobs", "finish_reason", "extra")

    def __init__(self, index: int) -> None:
        self.index = index
        self.role: str | None = None
        self.text: dict[str, list[str]] = {}  # field -> pieces, for fields some delta sent
        self.other: dict[str, Any] = {}  # unknown delta fields
        self.other_text: dict[str, list[str]] = {}  # unknown delta fields sent as text
        self.calls: list[_Call] = []  # in order of first appearance
        self.by_index: dict[int, _Call] = {}  # tool_calls[].index -> latest call with it
        self.function_call: _Call | None = None
        self.logprobs: dict[str, list[Any] | None] | None = None
        self.finish_reason: str | None = None
        self.extra: dict[str, Any] = {}  # unknown choice fields (native_finish_reason, ...)

    def feed(self, choice: dict[str, Any]) -> None:
        delta = choice.get("delta")
        if isinstance(delta, dict):
            self._delta(delta)
        logprobs = choice.get("logprobs")
        if isinstance(logprobs, dict):
            self._logprobs(logprobs)
        if choice.get("finish_reason") is not None:
            self.finish_reason = choice["finish_reason"]
        if not _CHOICE_KEYS.issuperset(choice):  # rare: a loop per chunk only for who sends more
            for key, value in choice.items():
                if key not in _CHOICE_KEYS and value is not None:
                    self.extra[key] = value

    def _delta(self, delta: dict[str, Any]) -> None:
        text = self.text
        for key, value in delta.items():
            pieces = text.get(key)
            if pieces is not None and type(value) is str:  # most deltas: more of a text already begun
                pieces.append(value)
            elif key in _TEXT_FIELDS:
                if pieces is None:
                    pieces = text[key] = []
                if isinstance(value, str):
                    pieces.append(value)
            elif key == "role":
                if self.role is None and _nonempty_str(value):
                    self.role = value
            elif key == "tool_calls":
                if isinstance(value, list):
                    for entry in value:
                        if isinstance(entry, dict):
                            self._tool_call(entry)
            elif key == "function_call":
                if isinstance(value, dict):
                    if self.function_call is None:
                        self.function_call = _Call()
                    self.function_call.merge_function(value)
            else:
                self._other(key, value)

    def _other(self, key: str, value: Any) -> None:
        # Unknown delta fields: text streams like content, lists grow, anything else is a
        # state whose latest non-null value stands.
        if isinstance(value, str):
            self.other_text.setdefault(key, []).append(value)
        elif isinstance(value, list) and isinstance(self.other.get(key), list):
            self.other[key].extend(value)
        elif value is not None or key not in self.other:
            self.other[key] = list(value) if isinstance(value, list) else value

    def _tool_call(self, entry: dict[str, Any]) -> None:
        idx = entry.get("index")
        if len(entry) == 2 and type(idx) is int:
            # Most fragments: {"index": i, "function": {"arguments": "..."}} on a known call.
            fn, call = entry.get("function"), self.by_index.get(idx)
            if call is not None and type(fn) is dict and len(fn) == 1 and type(fn.get("arguments")) is str:
                if fn["arguments"]:
                    call.args.append(fn["arguments"])
                return
        new_id = entry.get("id") if _nonempty_str(entry.get("id")) else None
        if isinstance(idx, int):
            call = self.by_index.get(idx)
        else:
            # No index (Gemini's compat endpoint): a continuation of the last call.
            call = self.calls[-1] if self.calls else None
        # A different id on a known slot is a new call (Ollama numbers every call of a
        # parallel batch 0; Gemini sends whole calls with no index).
        if call is None or (new_id is not None and call.id is not None and new_id != call.id):
            call = _Call()
            self.calls.append(call)
        if isinstance(idx, int):
            self.by_index[idx] = call
        call.merge(entry)

    def _logprobs(self, logprobs: dict[str, Any]) -> None:
        if self.logprobs is None:
            self.logprobs = {"content": None, "refusal": None}
        for key in ("content", "refusal"):
            tokens = logprobs.get(key)
            if isinstance(tokens, list):
                if self.logprobs[key] is None:
                    self.logprobs[key] = []
                self.logprobs[key].extend(tokens)

    def result(self) -> dict[str, Any]:
        message: dict[str, Any] = {"role": self.role or "assistant"}
        message["content"] = None
        for key in _TEXT_FIELDS:
            if key in self.text:
                pieces = self.text[key]
                # Only deltas with null (OpenAI's `refusal: null`) mean null, not "".
                message[key] = "".join(pieces) if pieces else None
        for key, value in self.other.items():
            message[key] = list(value) if isinstance(value, list) else value
        for key, pieces in self.other_text.items():
            message[key] = "".join(pieces)
        if self.calls:
            message["tool_calls"] = [call.tool_call() for call in self.calls]
        if self.function_call is not None:
            message["function_call"] = self.function_call.function()
        logprobs = None
        if self.logprobs is not None:
            logprobs = {k: (list(v) if v is not None else None) for k, v in self.logprobs.items()}
        out = {"index": self.index, "message": message, "logprobs": logprobs,
               "finish_reason": self.finish_reason}
        out.update(self.extra)
        return out


def _delta_of(chunk: dict[str, Any]) -> dict[str, Any]:
    return chunk["choices"][0]["delta"]


def _arguments_of(chunk: dict[str, Any]) -> dict[str, Any]:
    return chunk["choices"][0]["delta"]["tool_calls"][0]["function"]


class ChatAssembler:
    def __init__(self) -> None:
        self.error: dict[str, Any] | None = None
        self.unparsed: list[str] = []  # data payloads that were not a JSON object
        self.done = False  # `data: [DONE]` seen
        self.chunks = 0
        self._top: dict[str, Any] = {}
        self._last: dict[str, Any] | None = None  # the last chunk's envelope (all but its choices)
        self._choices: dict[int, _Choice] = {}
        self._usage: dict[str, Any] | None = None

    def feed(self, event: Event) -> None:
        if self.done:
            return
        data = event.data
        if data[:1] != "{" and data.strip() == "[DONE]":
            self.done = True
            return
        chunk = event_json(data)
        if type(chunk) is not dict:
            self.unparsed.append(data)
            return
        self._chunk(chunk, event.event)

    def feed_data(self, payloads: list[bytes]) -> None:
        """Default-type events by their data, not yet decoded to text (sse.data_only): as
        if each were fed as an Event, without the decoding. A chunk that is the last one's
        bytes with another piece of text in them is read as that piece alone (shapes.Shape)."""
        shape = None
        for payload in payloads:
            if self.done:
                return
            if shape is not None and shape.take(payload):
                self.chunks += 1
                continue
            try:
                chunk = orjson.loads(payload)
            except ValueError:
                chunk = None
            if type(chunk) is dict:
                choices = chunk.get("choices")
                self._chunk(chunk, "message")
                shape = self._shape(payload, chunk, choices)
            else:  # [DONE], or what is not a JSON object: as an Event, which tells them apart
                shape = None
                self.feed(Event(payload.decode("utf-8", errors="replace")))

    def _shape(self, payload: bytes, chunk: dict[str, Any], choices: Any) -> Shape | None:
        """The shape of a chunk just merged, if it is one piece of text for one choice: a
        text field, or a tool call's next arguments."""
        if chunk.get("error") is not None or type(choices) is not list or len(choices) != 1:
            return None
        one = choices[0]
        if (type(one) is not dict or not _CHOICE_KEYS.issuperset(one) or one.get("finish_reason") is not None
                or one.get("logprobs") is not None or type(delta := one.get("delta")) is not dict or len(delta) != 1):
            return None
        choice = self._choice(one.get("index", 0))
        (key, value), = delta.items()
        if key in _TEXT_FIELDS and type(value) is str:
            return Shape.learn(payload, _delta_of, key, choice.text[key], keeps_empty=True, padding="obfuscation")
        if key == "tool_calls" and type(value) is list and len(value) == 1 and type(entry := value[0]) is dict:
            index = entry.get("index")  # an index that is not an int means the last call, not this one
            call = choice.by_index.get(index) if type(index) is int else None
            if call is not None and entry.keys() == {"index", "function"} and type(fn := entry["function"]) is dict \
                    and fn.keys() == {"arguments"} and type(fn["arguments"]) is str:
                return Shape.learn(payload, _arguments_of, "arguments", call.args, keeps_empty=False,
                                   padding="obfuscation")
        return None

    def _chunk(self, chunk: dict[str, Any], event: str) -> None:
        self.chunks += 1
        if event == "error" and chunk.get("error") is None:
            self.error = chunk
            self._last = None  # a later chunk's own error field must win again
            return
        choices = chunk.pop("choices", None)
        # Most chunks repeat the last one's envelope (all but the choices): its fields,
        # error and usage are merged already.
        if chunk != self._last:
            self._envelope(chunk)
            self._last = chunk
        if type(choices) is list:
            for choice in choices:
                if type(choice) is dict:
                    self._choice(choice.get("index", 0)).feed(choice)

    def _envelope(self, chunk: dict[str, Any]) -> None:
        error = chunk.get("error")
        if error is not None:
            self.error = error if isinstance(error, dict) else {"message": error}
        self._chunk_fields(chunk)
        usage = chunk.get("usage")
        if usage is None and isinstance(chunk.get("x_groq"), dict):
            usage = chunk["x_groq"].get("usage")  # Groq puts it there
        if isinstance(usage, dict):
            self._usage = usage  # cumulative (vLLM sends it on every chunk): last wins

    def _chunk_fields(self, chunk: dict[str, Any]) -> None:
        top = self._top
        for key, value in chunk.items():
            if key in _STREAM_ONLY:
                continue
            if key in _IDENTITY:
                if _blank(top.get(key)):
                    top[key] = value
            elif key not in top or value is not None:
                top[key] = value

    def _choice(self, index: Any) -> _Choice:
        if not isinstance(index, int):
            index = 0
        choice = self._choices.get(index)
        if choice is None:
            choice = self._choices[index] = _Choice(index)
        return choice

    def result(self) -> dict[str, Any]:
        top = self._top
        out: dict[str, Any] = {
            "id": top.get("id"),
            "object": "chat.completion",
            "created": top.get("created"),
            "model": top.get("model"),
        }
        for key, value in top.items():
            if key not in out:
                out[key] = value
        out["choices"] = [self._choices[i].result() for i in sorted(self._choices)]
        if self._usage is not None:
            out["usage"] = self._usage
        return out


class OpenAIChat(WireAPIBase):
    name = "openai.chat"
    keys = RequestKeys(messages="messages", tools="tools")
    assembler = ChatAssembler

    def closes(self, event: Event) -> bool:
        return event.data.startswith("[DONE]")  # as the official SDK reads it

    def matches(self, method: str, path: str) -> bool:
        return method == "POST" and path.rstrip("/").endswith("/chat/completions")

    def tool_calls(self, response: dict[str, Any]) -> list[ToolCall]:
        calls: list[ToolCall] = []
        for pos, choice in enumerate(response.get("choices") or []):
            if not isinstance(choice, dict):
                continue
            number = choice.get("index", pos)
            message = choice.get("message") or {}
            entries = [c.get("function") for c in message.get("tool_calls") or [] if isinstance(c, dict)]
            ids = [c.get("id") for c in message.get("tool_calls") or [] if isinstance(c, dict)]
            if isinstance(message.get("function_call"), dict):
                entries.append(message["function_call"])
                ids.append(None)
            for call_id, fn in zip(ids, entries):
                fn = fn if isinstance(fn, dict) else {}
                raw = fn.get("arguments")
                if raw is None:
                    raw = ""
                elif not isinstance(raw, str):
                    raw = json.dumps(raw, ensure_ascii=False, separators=(",", ":"))
                calls.append(ToolCall.from_raw(len(calls), call_id, fn.get("name") or "", raw, choice=number))
        return calls

    def text(self, response: dict[str, Any]) -> str:
        choices = response.get("choices") or [{}]
        return (choices[0].get("message") or {}).get("content") or ""


API = register(OpenAIChat())
