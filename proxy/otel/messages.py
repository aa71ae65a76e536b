"""Conversation content in the GenAI conventions' form (exported only with `--otlp-content`).

The conventions define one shape for every provider: a message is `{role, parts}` and a
part is `{type: "text", content}`, `{type: "tool_call", id, name, arguments}`,
`{type: "tool_call_response", id, response}` or `{type: "reasoning", content}`; output
messages add `finish_reason`. Each wire API writes these its own way; this module reads
the four tooltap knows. What it does not recognise is left out, not guessed.
"""

from __future__ import annotations

import json
from typing import Any

Part = dict[str, Any]
Message = dict[str, Any]


def input_messages(api: str, request: dict) -> tuple[list[Part], list[Message]]:
    """(system instructions as parts, the input messages) of a request."""
    if api == "anthropic.messages":
        return _parts_of(request.get("system")), [_anthropic(m) for m in _dicts(request.get("messages"))]
    if api == "gemini":
        system = request.get("systemInstruction")
        return (_gemini_parts(system.get("parts")) if isinstance(system, dict) else []), [
            _gemini(m) for m in _dicts(request.get("contents"))]
    if api == "openai.responses":
        return _parts_of(request.get("instructions")), _responses_items(request.get("input"))
    system: list[Part] = []
    out: list[Message] = []
    for m in _dicts(request.get("messages")):
        if m.get("role") in ("system", "developer"):
            system.extend(_parts_of(m.get("content")))
        else:
            out.append(_openai_chat(m))
    return system, out


def output_messages(api: str, response: dict) -> list[Message]:
    if api == "anthropic.messages":
        return [{**_anthropic({"role": "assistant", "content": response.get("content")}),
                 "finish_reason": response.get("stop_reason") or ""}]
    if api == "gemini":
        return [{**_gemini(c.get("content") or {}), "role": "assistant", "finish_reason": c.get("finishReason") or ""}
                for c in _dicts(response.get("candidates"))]
    if api == "openai.responses":
        items = _responses_items(response.get("output"))
        parts = [p for m in items for p in m["parts"]]
        return [{"role": "assistant", "parts": parts, "finish_reason": response.get("status") or ""}]
    return [{**_openai_chat(c.get("message") or {}), "finish_reason": c.get("finish_reason") or ""}
            for c in _dicts(response.get("choices"))]


def tool_definitions(api: str, request: dict) -> list[dict]:
    """The tools offered, as `{type, name, description, parameters}`."""
    out = []
    for tool in _dicts(request.get("tools")):
        if api == "gemini":
            for fn in _dicts(tool.get("functionDeclarations")):
                out.append({"type": "function", "name": fn.get("name"), "description": fn.get("description"),
                            "parameters": fn.get("parametersJsonSchema", fn.get("parameters"))})
            continue
        fn = tool.get("function") if isinstance(tool.get("function"), dict) else tool
        out.append({"type": "function", "name": fn.get("name"), "description": fn.get("description"),
                    "parameters": fn.get("parameters", fn.get("input_schema"))})
    return out


# -- one reader per wire API --------------------------------------------------------------

def _openai_chat(m: dict) -> Message:
    parts = _parts_of(m.get("content"))
    if isinstance(m.get("reasoning_content"), str) and m["reasoning_content"]:
        parts.insert(0, {"type": "reasoning", "content": m["reasoning_content"]})
    for call in _dicts(m.get("tool_calls")):
        fn = call.get("function") or {}
        parts.append({"type": "tool_call", "id": call.get("id"), "name": fn.get("name"),
                      "arguments": _arguments(fn.get("arguments"))})
    if m.get("role") == "tool":
        text = "".join(p.get("content", "") for p in parts if p["type"] == "text")
        parts = [{"type": "tool_call_response", "id": m.get("tool_call_id"), "response": text}]
    return {"role": m.get("role") or "user", "parts": parts}


def _anthropic(m: dict) -> Message:
    content = m.get("content")
    parts: list[Part] = []
    for block in ([{"type": "text", "text": content}] if isinstance(content, str) else _dicts(content)):
        kind = block.get("type")
        if kind == "text":
            parts.append({"type": "text", "content": block.get("text") or ""})
        elif kind == "thinking":
            parts.append({"type": "reasoning", "content": block.get("thinking") or ""})
        elif kind in ("tool_use", "server_tool_use", "mcp_tool_use"):
            parts.append({"type": "tool_call", "id": block.get("id"), "name": block.get("name"),
                          "arguments": block.get("input")})
        elif kind == "tool_result":
            inner = block.get("content")
            text = inner if isinstance(inner, str) else "".join(
                b.get("text", "") for b in _dicts(inner) if b.get("type") == "text")
            parts.append({"type": "tool_call_response", "id": block.get("tool_use_id"), "response": text})
    return {"role": m.get("role") or "user", "parts": parts}


def _gemini(m: dict) -> Message:
    role = m.get("role") or "user"
    return {"role": "assistant" if role == "model" else role, "parts": _gemini_parts(m.get("parts"))}


def _gemini_parts(parts: Any) -> list[Part]:
    out: list[Part] = []
    for p in _dicts(parts):
        if isinstance(p.get("text"), str):
            out.append({"type": "reasoning" if p.get("thought") else "text", "content": p["text"]})
        elif isinstance(p.get("functionCall"), dict):
            call = p["functionCall"]
            out.append({"type": "tool_call", "id": call.get("id"), "name": call.get("name"), "arguments": call.get("args")})
        elif isinstance(p.get("functionResponse"), dict):
            answer = p["functionResponse"]
            out.append({"type": "tool_call_response", "id": answer.get("id"), "response": answer.get("response")})
    return out


def _responses_items(items: Any) -> list[Message]:
    if isinstance(items, str):
        return [{"role": "user", "parts": [{"type": "text", "content": items}]}]
    out: list[Message] = []
    for item in _dicts(items):
        kind = item.get("type", "message")
        if kind == "message":
            out.append({"role": item.get("role") or "user", "parts": _parts_of(item.get("content"))})
        elif kind == "function_call":
            out.append({"role": "assistant", "parts": [{"type": "tool_call", "id": item.get("call_id"),
                                                         "name": item.get("name"),
                                                         "arguments": _arguments(item.get("arguments"))}]})
        elif kind == "function_call_output":
            out.append({"role": "tool", "parts": [{"type": "tool_call_response", "id": item.get("call_id"),
                                                    "response": item.get("output")}]})
        elif kind == "reasoning":
            text = "".join(s.get("text", "") for s in _dicts(item.get("summary")))
            out.append({"role": "assistant", "parts": [{"type": "reasoning", "content": text}]})
    return out


def _parts_of(content: Any) -> list[Part]:
    """Text content written as a string or as a list of typed blocks."""
    if isinstance(content, str):
        return [{"type": "text", "content": content}] if content else []
    return [{"type": "text", "content": b["text"]} for b in _dicts(content) if isinstance(b.get("text"), str)]


def _arguments(raw: Any) -> Any:
    if isinstance(raw, str):
        try:
            return json.loads(raw)
        except ValueError:
            return raw
    return raw


def _dicts(value: Any) -> list[dict]:
    return [v for v in value if isinstance(v, dict)] if isinstance(value, list) else []
