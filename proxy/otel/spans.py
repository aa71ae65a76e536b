"""Stored turns as spans, following the OpenTelemetry GenAI semantic conventions.

One trace per session: its id is a hash of the session id, so turns exported live, one
at a time, and a session exported again later land in the same trace, with the same
span ids. Each turn is a `chat` span (`generate_content` for Gemini), kind CLIENT; each
tool call it made is an `execute_tool` child, kind INTERNAL, named with the decoded tool
(`get_forecast`, not `cIya4J0mcp0get_forecast`). The agent runs a tool between the
model's answer and its next request, so a tool span covers that window when the next
turn is known (when the session ends on a call: a point at the answer's end).

Messages, system instructions, tool definitions, tool-call arguments and results are
sensitive: the conventions make them opt-in, and so does `content=True` here.

Plain data only: `sdk.py` turns these records into the SDK's spans.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import urlsplit

from . import messages

CLIENT, INTERNAL = "client", "internal"
CONTENT_MAX = 256 * 1024  # characters per content attribute: collectors refuse huge requests

# gen_ai.provider.name: the conventions' well-known values, by upstream host, else by API.
_HOST_PROVIDERS = (
    ("deepseek.com", "deepseek"), ("groq.com", "groq"), ("mistral.ai", "mistral_ai"), ("x.ai", "x_ai"),
    ("perplexity.ai", "perplexity"), ("openai.azure.com", "azure.ai.openai"), ("cohere", "cohere"),
    ("bedrock", "aws.bedrock"), ("aiplatform.googleapis.com", "gcp.vertex_ai"),
    ("generativelanguage.googleapis.com", "gcp.gemini"), ("anthropic.com", "anthropic"), ("openai.com", "openai"),
)
_API_PROVIDERS = {"openai.chat": "openai", "openai.responses": "openai", "anthropic.messages": "anthropic",
                  "gemini": "gcp.gemini"}


@dataclass
class StoredCall:
    index: int
    call_id: str | None
    name: str  # as the model wrote it
    decoded: dict | None  # what the agent decoders made of the name
    arguments_raw: str
    result: dict | None = None  # paired from the next turn's request, when it came
    task_progress: dict | None = None


@dataclass
class StoredTurn:
    id: int
    uid: str | None
    session_id: str
    parent_id: int | None
    agent: str | None
    api: str
    upstream: str
    path: str
    model: str | None
    status: str
    http_status: int | None
    error: str | None
    stream: bool
    started_at: float  # unix seconds
    ttft_ms: float | None
    duration_ms: float | None
    usage: dict | None
    response: Any
    params: dict  # the request without its messages, tools and system prompt
    calls: list[StoredCall] = field(default_factory=list)
    request: Any = None  # the whole request, read only when content is exported
    next_started_at: float | None = None  # when the agent's next request (the first child) began

    @property
    def ended_at(self) -> float:
        return self.started_at + (self.duration_ms or 0.0) / 1000


@dataclass
class SpanRecord:
    name: str
    trace_id: int  # 128 bits
    span_id: int  # 64 bits
    parent_span_id: int | None
    kind: str
    start_ns: int
    end_ns: int
    attributes: dict[str, Any]
    error: str | None = None  # set: the span's status is ERROR with this description


def trace_id(session_id: str) -> int:
    return _hash_int(f"tooltap session\n{session_id}", 16)


def _turn_key(turn: StoredTurn) -> str:
    # The journal's uid follows a turn into another database (an import); the row id does not.
    return turn.uid or f"id:{turn.id}"


def turn_span_id(turn: StoredTurn) -> int:
    return _hash_int(f"tooltap turn\n{turn.session_id}\n{_turn_key(turn)}", 8)


def tool_span_id(turn: StoredTurn, call: StoredCall) -> int:
    return _hash_int(f"tooltap call\n{turn.session_id}\n{_turn_key(turn)}\n{call.index}", 8)


def _hash_int(text: str, size: int) -> int:
    value = int.from_bytes(hashlib.sha256(text.encode("utf-8", "surrogateescape")).digest()[:size], "big")
    return value or 1  # an all-zero id is invalid


def operation(api: str) -> str:
    return "generate_content" if api == "gemini" else "chat"


def provider(api: str, upstream: str) -> str:
    host = (urlsplit(upstream).hostname or "").lower()
    for suffix, name in _HOST_PROVIDERS:
        if suffix in host:
            return name
    return _API_PROVIDERS.get(api, api)


def chat_span(turn: StoredTurn, content: bool = False) -> SpanRecord:
    """The turn itself: the model call as the agent made it through tooltap."""
    response = turn.response if isinstance(turn.response, dict) else {}
    request_model = turn.params.get("model") or turn.model
    attrs: dict[str, Any] = {
        "gen_ai.operation.name": operation(turn.api),
        "gen_ai.provider.name": provider(turn.api, turn.upstream),
        "gen_ai.request.model": request_model,
        # Named by the answer; else, for an answer that came, the model asked (an error
        # names none: no model answered it).
        "gen_ai.response.model": _response_model(turn.api, response) or (turn.model if turn.status == "ok" else None),
        "gen_ai.response.id": _response_id(turn.api, response),
        "gen_ai.response.finish_reasons": finish_reasons(turn.api, response) or None,
        "gen_ai.conversation.id": turn.session_id,
        "gen_ai.agent.name": turn.agent,
        "gen_ai.request.stream": bool(turn.stream),
        **_request_params(turn.params),
        **usage_attributes(turn.api, turn.usage),
        **_server(turn.upstream),
        "http.response.status_code": turn.http_status,
        "tooltap.turn.id": turn.id,
        "tooltap.turn.status": turn.status,
        "tooltap.api": turn.api,
    }
    if turn.stream and turn.ttft_ms is not None:
        attrs["gen_ai.response.time_to_first_chunk"] = round(turn.ttft_ms / 1000, 6)
    error = None
    if turn.status != "ok":
        attrs["error.type"] = str(turn.http_status) if (turn.http_status or 0) >= 400 else turn.status
        error = (turn.error or turn.status)[:500]
    if content:
        attrs.update(_content(turn, response))
    return SpanRecord(
        name=f"{attrs['gen_ai.operation.name']} {request_model}" if request_model else attrs["gen_ai.operation.name"],
        trace_id=trace_id(turn.session_id), span_id=turn_span_id(turn), parent_span_id=None, kind=CLIENT,
        start_ns=_ns(turn.started_at), end_ns=_ns(turn.ended_at), attributes=_clean(attrs), error=error,
    )


def tool_spans(turn: StoredTurn, content: bool = False) -> list[SpanRecord]:
    """One `execute_tool` span per call of the turn, children of its chat span. Of an answer
    that did not end well (a stream cut short), only the calls the agent is known to have
    run: those whose result a later request carried; an agent retries the rest."""
    start = turn.ended_at
    end = turn.next_started_at if turn.next_started_at and turn.next_started_at >= start else start
    ran = turn.calls if turn.status == "ok" else [c for c in turn.calls if c.result]
    return [_tool_span(turn, call, start, end, content) for call in ran]


def _tool_span(turn: StoredTurn, call: StoredCall, start: float, end: float, content: bool) -> SpanRecord:
    decoded = call.decoded or {}
    tool = decoded.get("tool") or call.name
    mcp = decoded.get("kind") == "mcp"
    result = call.result if isinstance(call.result, dict) else {}
    progress = call.task_progress if isinstance(call.task_progress, dict) else {}
    attrs: dict[str, Any] = {
        "gen_ai.operation.name": "execute_tool",
        "gen_ai.tool.name": tool,
        "gen_ai.tool.call.id": call.call_id,
        # The conventions' types: an MCP tool calls out of the agent ("extension"); the
        # agent's own tools run inside it ("function").
        "gen_ai.tool.type": "extension" if mcp else "function",
        "gen_ai.provider.name": provider(turn.api, turn.upstream),
        "gen_ai.conversation.id": turn.session_id,
        "gen_ai.agent.name": turn.agent,
        "tooltap.tool.raw_name": call.name,
        "tooltap.tool.convention": decoded.get("convention"),
        "tooltap.tool.result_status": result.get("status"),
        "tooltap.task_progress.done": progress.get("done"),
        "tooltap.task_progress.total": progress.get("total"),
        "tooltap.turn.id": turn.id,
    }
    if mcp:
        # No convention names the MCP server of a tool call yet: ours, and the method
        # the MCP conventions give a tool call.
        attrs["tooltap.mcp.server"] = decoded.get("server")
        attrs["mcp.method.name"] = "tools/call"
    if content:
        attrs["gen_ai.tool.call.arguments"] = _arguments(call.arguments_raw)
        if isinstance(result.get("text"), str):
            attrs["gen_ai.tool.call.result"] = _cap(result["text"])
    error = None
    if result.get("status") in ("error", "denied"):
        attrs["error.type"] = f"tool_{result['status']}"
        error = f"the tool call's result: {result['status']}"
    return SpanRecord(
        name=f"execute_tool {tool}", trace_id=trace_id(turn.session_id), span_id=tool_span_id(turn, call),
        parent_span_id=turn_span_id(turn), kind=INTERNAL, start_ns=_ns(start), end_ns=_ns(end),
        attributes=_clean(attrs), error=error,
    )


def session_spans(turns: list[StoredTurn], content: bool = False) -> list[SpanRecord]:
    """Every span of a session's turns (each turn's `next_started_at` set by the caller)."""
    out: list[SpanRecord] = []
    for turn in turns:
        if exportable(turn):
            out.append(chat_span(turn, content))
            out.extend(tool_spans(turn, content))
    return out


def exportable(turn: StoredTurn) -> bool:
    """A model call: a model list or a health check passing through is no GenAI operation."""
    return turn.api in _API_PROVIDERS


# -- what the conventions call the response's facts, per wire API -------------------------

def finish_reasons(api: str, response: dict) -> list[str]:
    if api == "openai.chat":
        return [c["finish_reason"] for c in response.get("choices") or []
                if isinstance(c, dict) and isinstance(c.get("finish_reason"), str)]
    if api == "anthropic.messages":
        return [response["stop_reason"]] if isinstance(response.get("stop_reason"), str) else []
    if api == "gemini":
        return [c["finishReason"] for c in response.get("candidates") or []
                if isinstance(c, dict) and isinstance(c.get("finishReason"), str)]
    if api == "openai.responses":
        reason = (response.get("incomplete_details") or {}).get("reason") or response.get("status")
        return [reason] if isinstance(reason, str) else []
    return []


def _response_model(api: str, response: dict) -> str | None:
    value = response.get("modelVersion" if api == "gemini" else "model")
    return value if isinstance(value, str) else None


def _response_id(api: str, response: dict) -> str | None:
    value = response.get("responseId" if api == "gemini" else "id")
    return value if isinstance(value, str) else None


def usage_attributes(api: str, usage: Any) -> dict[str, Any]:
    """Token counts as the conventions define them: input counts cached tokens too,
    output counts reasoning tokens too, whatever the provider's own fields mean."""
    u = usage if isinstance(usage, dict) else {}

    def n(*path: str) -> int | None:
        value: Any = u
        for key in path:
            value = value.get(key) if isinstance(value, dict) else None
        return value if isinstance(value, int) and not isinstance(value, bool) else None

    if api == "anthropic.messages":
        read, created = n("cache_read_input_tokens"), n("cache_creation_input_tokens")
        base = n("input_tokens")
        inp = None if base is None else base + (read or 0) + (created or 0)
        out, reasoning = n("output_tokens"), None
    elif api == "gemini":
        inp, read, created = n("promptTokenCount"), n("cachedContentTokenCount"), None
        reasoning = n("thoughtsTokenCount")
        out = n("candidatesTokenCount")
        out = None if out is None and reasoning is None else (out or 0) + (reasoning or 0)
    elif api == "openai.responses":
        inp, out, created = n("input_tokens"), n("output_tokens"), None
        read, reasoning = n("input_tokens_details", "cached_tokens"), n("output_tokens_details", "reasoning_tokens")
    else:
        inp, out, created = n("prompt_tokens"), n("completion_tokens"), None
        read = n("prompt_tokens_details", "cached_tokens")
        if read is None:
            read = n("prompt_cache_hit_tokens")  # DeepSeek
        reasoning = n("completion_tokens_details", "reasoning_tokens")
    return {
        "gen_ai.usage.input_tokens": inp, "gen_ai.usage.output_tokens": out,
        "gen_ai.usage.cache_read.input_tokens": read, "gen_ai.usage.cache_creation.input_tokens": created,
        "gen_ai.usage.reasoning.output_tokens": reasoning,
    }


def _request_params(params: dict) -> dict[str, Any]:
    config = params.get("generationConfig") if isinstance(params.get("generationConfig"), dict) else {}

    def first(*keys: str) -> Any:
        for source in (params, config):
            for k in keys:
                if source.get(k) is not None:
                    return source[k]
        return None

    stop = first("stop", "stop_sequences", "stopSequences")
    return {
        "gen_ai.request.temperature": _number(first("temperature")),
        "gen_ai.request.top_p": _number(first("top_p", "topP")),
        "gen_ai.request.top_k": _number(first("top_k", "topK")),
        "gen_ai.request.max_tokens": _number(first("max_tokens", "max_completion_tokens", "max_output_tokens",
                                                   "maxOutputTokens")),
        "gen_ai.request.seed": _number(first("seed")),
        "gen_ai.request.stop_sequences": [stop] if isinstance(stop, str) else
        [s for s in stop if isinstance(s, str)] if isinstance(stop, list) else None,
    }


def _server(upstream: str) -> dict[str, Any]:
    parts = urlsplit(upstream)
    try:
        port = parts.port or (443 if parts.scheme == "https" else 80)
    except ValueError:
        port = None
    return {"server.address": parts.hostname, "server.port": port}


def _content(turn: StoredTurn, response: dict) -> dict[str, Any]:
    request = turn.request if isinstance(turn.request, dict) else {}
    system, inputs = messages.input_messages(turn.api, request)
    tools = messages.tool_definitions(turn.api, request)
    return {
        "gen_ai.system_instructions": _json(system) if system else None,
        "gen_ai.input.messages": _json(inputs) if inputs else None,
        "gen_ai.output.messages": _json(messages.output_messages(turn.api, response)) if response else None,
        "gen_ai.tool.definitions": _json(tools) if tools else None,
    }


def _json(value: Any) -> str:
    text = _dumps(value)
    if len(text) > CONTENT_MAX and '"type":"blob"' in text:  # the images go first, so the words still fit
        value = _blobs_emptied(value)
        text = _dumps(value)
    return _fitted(value, text)


def _dumps(value: Any) -> str:
    """Compact JSON, as written; with escapes only when it holds what UTF-8 cannot carry
    (a lone surrogate a model wrote), which the exporter could not send."""
    text = json.dumps(value, ensure_ascii=False, separators=(",", ":"))
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return json.dumps(value, separators=(",", ":"))
    return text


def _blobs_emptied(value: Any) -> Any:
    """Messages (or a list of parts) with each blob part's content left out, its length
    said, so that what is cut for size is media, not the conversation, and the attribute
    stays JSON. Only parts: a tool's arguments may hold anything."""
    if not isinstance(value, list):
        return value
    out = []
    for item in value:
        if isinstance(item, dict) and isinstance(item.get("parts"), list):
            item = {**item, "parts": _blobs_emptied(item["parts"])}
        elif isinstance(item, dict) and item.get("type") == "blob" and isinstance(item.get("content"), str):
            item = {**item, "content": "", "tooltap.content_omitted_chars": len(item["content"])}
        out.append(item)
    return out


def _fitted(value: Any, text: str) -> str:
    """`text` (the JSON of `value`) within CONTENT_MAX and still JSON: its longest strings
    (a file the agent read, a long answer) are cut to a common length, each saying so, so
    that a collector can still parse the messages and every one of them is kept."""
    if len(text) <= CONTENT_MAX:
        return text
    try:
        return _cut_to_fit(value, len(text) - CONTENT_MAX) or _cap(text)
    except RecursionError:  # nested deeper than Python walks: cut as text
        return _cap(text)


def _cut_to_fit(value: Any, need: int) -> str | None:
    strings = [(len(s), len(_dumps(s)) - 2) for s in _strings(value)]  # as text, and as JSON (escaped)
    for _ in range(3):  # an estimate, checked: cut shorter when the escapes kept were many
        if _saved(strings, _SHORTEST_CUT) < need:  # no room in its strings: cut the text as before
            break
        low, high = _SHORTEST_CUT, max(n for n, _ in strings)
        while low < high:  # the longest length to cut to that saves enough
            mid = (low + high + 1) // 2
            low, high = (mid, high) if _saved(strings, mid) >= need else (low, mid - 1)
        fitted = _dumps(_cut_strings(value, low))
        if len(fitted) <= CONTENT_MAX:
            return fitted
        need += len(fitted) - CONTENT_MAX
    return None


_SHORTEST_CUT = 64  # shorter strings are names, ids and roles: never cut
_CUT_NOTE = "... [cut by tooltap: {} characters]"
_NOTE_MAX = len(_CUT_NOTE) + 8  # with its count of characters filled in


def _saved(strings: list[tuple[int, int]], keep: int) -> int:
    """JSON characters saved, about, by cutting every string longer than `keep` characters
    to that, its note added: each string's escapes taken as spread evenly through it."""
    return sum(int((n - keep) * escaped / n) - _NOTE_MAX for n, escaped in strings if n > keep + _NOTE_MAX)


def _strings(value: Any):
    if isinstance(value, str):
        yield value
    elif isinstance(value, dict):
        for v in value.values():
            yield from _strings(v)
    elif isinstance(value, list):
        for v in value:
            yield from _strings(v)


def _cut_strings(value: Any, keep: int) -> Any:
    if isinstance(value, str):
        return value[:keep] + _CUT_NOTE.format(len(value)) if len(value) > keep + _NOTE_MAX else value
    if isinstance(value, dict):
        return {k: _cut_strings(v, keep) for k, v in value.items()}
    if isinstance(value, list):
        return [_cut_strings(v, keep) for v in value]
    return value


def _arguments(raw: str | None) -> str | None:
    """A call's arguments, cut as the messages are when they are JSON."""
    if raw is None or len(raw) <= CONTENT_MAX:
        return raw
    try:
        value = json.loads(raw)
    except (ValueError, RecursionError):  # not JSON, or nested too deep to read back
        return _cap(raw)
    return _fitted(value, _dumps(value))


def _cap(text: str | None) -> str | None:
    if text is None or len(text) <= CONTENT_MAX:
        return text
    return text[:CONTENT_MAX] + _CUT_NOTE.format(len(text))


def _number(value: Any) -> int | float | None:
    return value if isinstance(value, (int, float)) and not isinstance(value, bool) else None


def _ns(seconds: float) -> int:
    return int(round(seconds * 1e9))


def _clean(attrs: dict[str, Any]) -> dict[str, Any]:
    """OpenTelemetry attributes hold no None and no empty list."""
    return {k: v for k, v in attrs.items() if v is not None and v != []}
