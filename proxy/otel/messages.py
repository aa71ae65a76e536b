"""Conversation content in the GenAI conventions' form (exported only with `--otlp-content`).

The conventions define one shape for every provider: a message is `{role, parts}` and a
part is `{type: "text", content}`, `{type: "tool_call", id, name, arguments}`,
`{type: "tool_call_response", id, response}`, `{type: "reasoning", content}`, or media:
`{type: "blob", modality, mime_type, content}` (base64, as sent), `{type: "uri", modality,
mime_type, uri}` or `{type: "file", modality, mime_type, file_id}`; output messages add
`finish_reason`. Each wire API writes these its own way; this module reads
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
        elif kind in ("image", "document"):
            parts.extend(_media_of(block))
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
        else:
            out.extend(_media_of(p))
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
    """Content written as a string or as a list of typed blocks: text and media."""
    if isinstance(content, str):
        return [{"type": "text", "content": content}] if content else []
    parts: list[Part] = []
    for b in _dicts(content):
        parts.extend([{"type": "text", "content": b["text"]}] if isinstance(b.get("text"), str) else _media_of(b))
    return parts


_MODALITY_OF_BLOCK = {"image_url": "image", "input_image": "image", "image": "image", "input_audio": "audio"}


def _media_of(block: dict) -> list[Part]:
    """An image, audio clip or file as each API writes it, as one media part (or none)."""
    kind = block.get("type")
    url = mime = data = file_id = None
    if kind == "image_url":  # OpenAI chat: {"image_url": {"url": URL or data URL}}
        inner = block.get("image_url")
        url = inner.get("url") if isinstance(inner, dict) else inner
    elif kind == "input_image":  # Responses
        url, file_id = block.get("image_url"), block.get("file_id")
    elif kind == "input_audio":
        audio = block.get("input_audio") if isinstance(block.get("input_audio"), dict) else {}
        fmt = audio.get("format") or "wav"
        data, mime = audio.get("data"), "audio/mpeg" if fmt == "mp3" else f"audio/{fmt}"
    elif kind in ("file", "input_file"):  # chat's {"file": {...}}, Responses' flat fields
        inner = block.get("file") if isinstance(block.get("file"), dict) else block
        url, file_id = inner.get("file_data") or inner.get("file_url"), inner.get("file_id")
    elif kind in ("image", "document"):  # Anthropic: {"source": {"type": "base64" | "url" | "file", ...}}
        source = block.get("source") if isinstance(block.get("source"), dict) else {}
        mime, url, file_id = source.get("media_type"), source.get("url"), source.get("file_id")
        data = source.get("data") if source.get("type") == "base64" else None
    else:  # Gemini: {"inlineData": {mimeType, data}} or {"fileData": {mimeType, fileUri}}
        inline = block.get("inlineData") or block.get("inline_data")
        linked = block.get("fileData") or block.get("file_data")
        if isinstance(inline, dict):
            mime, data = inline.get("mimeType") or inline.get("mime_type"), inline.get("data")
        elif isinstance(linked, dict):
            mime, url = linked.get("mimeType") or linked.get("mime_type"), linked.get("fileUri") or linked.get("file_uri")
        else:
            return []
    if isinstance(url, str) and url.startswith("data:") and ";base64," in url[:200]:
        head, _, data = url.partition(",")
        mime, url = head[5:].split(";")[0] or mime, None
    major = (mime or "").split("/")[0]
    modality = major if major in ("image", "audio", "video") else _MODALITY_OF_BLOCK.get(kind, "document")
    if isinstance(data, str):
        return [{"type": "blob", "modality": modality, "mime_type": mime, "content": data}]
    if isinstance(url, str):
        return [{"type": "uri", "modality": modality, "mime_type": mime, "uri": url}]
    if isinstance(file_id, str):
        return [{"type": "file", "modality": modality, "mime_type": mime, "file_id": file_id}]
    return []


def _arguments(raw: Any) -> Any:
    if isinstance(raw, str):
        try:
            return json.loads(raw)
        except ValueError:
            return raw
    return raw


def _dicts(value: Any) -> list[dict]:
    return [v for v in value if isinstance(v, dict)] if isinstance(value, list) else []
