"""What every wire API module provides.

A wire API module (openai_chat.py, anthropic_messages.py, ...) is a module-level object
satisfying `WireAPI`: it recognizes its requests, turns a stream of SSE events into the
response its provider's non-streaming endpoint would have returned, and reads the few
things the rest of tooltap needs from a request or response (the conversation, the tools,
the tool calls, the usage). Adding a provider is adding one such module to
`proxy.apis.REGISTRY`.
"""

from __future__ import annotations

import json

import orjson
from dataclasses import dataclass
from typing import Any, Protocol

from ..sse import Event, last_event


@dataclass(slots=True)
class ToolCall:
    """One tool call as the model emitted it, before any agent-convention decoding."""

    index: int  # position among all calls of the response, 0-based
    id: str | None
    name: str
    arguments_raw: str  # exactly as emitted (JSON text for most APIs)
    arguments: Any = None  # parsed value, or None when it does not parse
    arguments_error: str | None = None
    choice: int = 0  # the choice / candidate the call belongs to

    @classmethod
    def from_raw(cls, index: int, id: str | None, name: str, raw: str, choice: int = 0) -> "ToolCall":
        """Parse JSON arguments; an empty string means no arguments (`{}`)."""
        call = cls(index=index, id=id, name=name, arguments_raw=raw, choice=choice)
        if raw.strip() == "":
            call.arguments = {}
            return call
        try:
            call.arguments = json.loads(raw)
        except ValueError as exc:
            call.arguments_error = f"invalid JSON: {exc}"
        return call

    @classmethod
    def from_object(cls, index: int, id: str | None, name: str, args: Any, choice: int = 0) -> "ToolCall":
        """For APIs that send arguments as an object (Anthropic, Gemini)."""
        raw = json.dumps(args, ensure_ascii=False, separators=(",", ":"))
        return cls(index=index, id=id, name=name, arguments_raw=raw, arguments=args, choice=choice)


@dataclass(frozen=True, slots=True)
class RequestKeys:
    """Where a request body keeps the parts that repeat turn after turn. The store keeps
    each distinct message, tools array and system prompt once, and sessions are threaded
    by the message list."""

    messages: str  # "messages", "input", "contents"
    tools: str | None = "tools"
    system: str | None = None  # a system prompt held outside the messages


class Assembler(Protocol):
    """Consumes a response stream's events, in order, and builds the final response."""

    def feed(self, event: Event) -> None: ...

    def result(self) -> dict[str, Any]:
        """The non-streaming response equivalent to what was fed so far (a partial
        stream gives a partial response)."""
        ...

    # A mid-stream error payload, if the stream carried one (HTTP status was still 200).
    error: dict[str, Any] | None


def event_json(data: str) -> Any:
    """An event's JSON payload, or None. orjson: this runs once per event of every stream.
    Only for envelopes whose tool arguments arrive as strings: orjson reads integers
    beyond 64 bits as floats, which must never happen to a tool call's arguments."""
    try:
        return orjson.loads(data)
    except ValueError:
        return None


class WireAPIBase:
    """Defaults most wire APIs share; a module overrides what its API does differently."""

    assembler: type  # the Assembler class for this API's streams

    def closes(self, event: Event) -> bool:
        """Is this the stream's closing event? After it the answer is whole, and the
        official SDKs stop reading there. (An API without one ends with its body.)"""
        return False

    def stream_closed(self, tail: bytes) -> bool:
        """Whether a stream's last bytes end with its closing event, whole."""
        event = last_event(tail)
        return event is not None and self.closes(event)

    def new_assembler(self) -> Assembler:
        return self.assembler()

    def usage(self, response: dict[str, Any]) -> dict[str, Any] | None:
        return response.get("usage")

    def model(self, request: dict[str, Any], response: dict[str, Any] | None) -> str | None:
        return (response or {}).get("model") or request.get("model")

    def short_input(self, value: Any) -> list[dict[str, Any]] | None:
        """The conversation a request's messages field holds in a short form (not a list),
        or None: as the API reads it, for threading and search; the body keeps the form."""
        return None

    def continues(self, request: dict[str, Any]) -> str | None:
        """The id a request names to continue a conversation the server holds, sending
        only what is new (Responses: an answer's or a conversation's); None when it
        resends its history."""
        return None

    def continue_id(self, request: dict[str, Any] | None, response: Any) -> str | None:
        """The id a later request would name to continue from this turn (see `continues`)."""
        return None

    def written_out(self, request: dict[str, Any], earlier: list[tuple[dict, dict]]) -> dict[str, Any]:
        """A request that `continues` an answer, with the conversation it continues put in
        instead: `earlier` is each (request, answer) of it, oldest first. For an endpoint
        that does not hold those answers (a replay elsewhere)."""
        return request


class WireAPI(Protocol):
    name: str  # "openai.chat", "openai.responses", "anthropic.messages", "gemini"
    keys: RequestKeys

    def matches(self, method: str, path: str) -> bool:
        """Is this a request of this API? `path` is the upstream path, query excluded."""
        ...

    def new_assembler(self) -> Assembler: ...

    def tool_calls(self, response: dict[str, Any]) -> list[ToolCall]: ...

    def usage(self, response: dict[str, Any]) -> dict[str, Any] | None: ...

    def model(self, request: dict[str, Any], response: dict[str, Any] | None) -> str | None: ...

    def short_input(self, value: Any) -> list[dict[str, Any]] | None: ...

    def continues(self, request: dict[str, Any]) -> str | None: ...

    def continue_id(self, request: dict[str, Any] | None, response: Any) -> str | None: ...

    def written_out(self, request: dict[str, Any], earlier: list[tuple[dict, dict]]) -> dict[str, Any]: ...

    def text(self, response: dict[str, Any]) -> str:
        """The answer's visible text (first choice), for live views."""
        ...
