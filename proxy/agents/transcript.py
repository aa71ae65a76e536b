"""A request's conversation in one neutral shape, whatever the wire API.

Pairing and Cline's message parsing need the same few things from every API: who said
what, which tool calls an assistant made (with ids), which results came back (by id), and
the plain text blocks. `messages(api, request)` gives a list of `Message`, each a role and
a list of blocks:
  {"type": "text", "text"}
  {"type": "tool_call", "id", "name", "arguments"}
  {"type": "tool_result", "id", "name", "text", "is_error", "source"}
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from functools import cached_property
from typing import Any


@dataclass
class Message:
    role: str  # "system" | "user" | "assistant" | "tool"
    blocks: list[dict[str, Any]] = field(default_factory=list)

    def texts(self) -> list[str]:
        return [b["text"] for b in self.blocks if b["type"] == "text"]

    def calls(self) -> list[dict[str, Any]]:
        return [b for b in self.blocks if b["type"] == "tool_call"]

    @cached_property
    def call_ids(self) -> frozenset:
        """The ids of its tool calls. Worked out once: a message is read again in every
        later turn of its conversation (pairing looks for the message that made a call)."""
        return frozenset(b.get("id") for b in self.blocks if b["type"] == "tool_call")

    def results(self) -> list[dict[str, Any]]:
        return [b for b in self.blocks if b["type"] == "tool_result"]


def _text(value: Any) -> str:
    """Text of a content value: a string, a list of parts/blocks, or anything else."""
    if value is None:
        return ""
    if isinstance(value, str):
        return value
    if isinstance(value, list):
        parts = []
        for part in value:
            if isinstance(part, str):
                parts.append(part)
            elif isinstance(part, dict) and isinstance(part.get("text"), str):
                parts.append(part["text"])
            elif isinstance(part, dict) and part.get("type") in ("image", "image_url", "input_image"):
                parts.append("[image]")
        return "\n".join(parts)
    return json.dumps(value, ensure_ascii=False, sort_keys=True)


def _text_blocks(content: Any) -> list[dict[str, Any]]:
    """Text blocks of a message content, keeping the block boundaries (Cline's headers
    and environment details are separate blocks)."""
    if isinstance(content, str):
        return [{"type": "text", "text": content}]
    out = []
    if isinstance(content, list):
        for part in content:
            if isinstance(part, dict) and isinstance(part.get("text"), str) and part.get("type") in (
                None, "text", "input_text", "output_text",
            ):
                out.append({"type": "text", "text": part["text"]})
            elif isinstance(part, str):
                out.append({"type": "text", "text": part})
    return out


def _parse_args(raw: Any) -> Any:
    if isinstance(raw, str):
        try:
            return json.loads(raw) if raw.strip() else {}
        except ValueError:
            return None
    return raw


def _openai_chat(request: dict) -> list[Message]:
    out = []
    for m in request.get("messages") or []:
        if not isinstance(m, dict):
            continue
        role = m.get("role")
        if role in ("system", "developer"):
            out.append(Message("system", _text_blocks(m.get("content"))))
        elif role == "tool":
            out.append(Message("tool", [{
                "type": "tool_result", "id": m.get("tool_call_id"), "name": m.get("name"),
                "text": _text(m.get("content")), "is_error": False, "source": "tool_message",
            }]))
        elif role == "function":  # legacy function calling: results are keyed by name
            out.append(Message("tool", [{
                "type": "tool_result", "id": None, "name": m.get("name"),
                "text": _text(m.get("content")), "is_error": False, "source": "tool_message",
            }]))
        elif role == "assistant":
            blocks = _text_blocks(m.get("content"))
            for tc in m.get("tool_calls") or []:
                fn = tc.get("function") or {}
                blocks.append({"type": "tool_call", "id": tc.get("id"), "name": fn.get("name"),
                               "arguments": _parse_args(fn.get("arguments"))})
            if isinstance(m.get("function_call"), dict):
                fn = m["function_call"]
                blocks.append({"type": "tool_call", "id": None, "name": fn.get("name"),
                               "arguments": _parse_args(fn.get("arguments"))})
            out.append(Message("assistant", blocks))
        else:
            out.append(Message("user", _text_blocks(m.get("content"))))
    return out


def _anthropic(request: dict) -> list[Message]:
    out = []
    if request.get("system"):
        out.append(Message("system", _text_blocks(request["system"])))
    for m in request.get("messages") or []:
        if not isinstance(m, dict):
            continue
        role = "assistant" if m.get("role") == "assistant" else "user"
        content = m.get("content")
        if isinstance(content, str):
            out.append(Message(role, [{"type": "text", "text": content}]))
            continue
        blocks = []
        for b in content or []:
            if not isinstance(b, dict):
                continue
            kind = b.get("type")
            if kind == "text":
                blocks.append({"type": "text", "text": b.get("text") or ""})
            elif kind == "tool_use":
                blocks.append({"type": "tool_call", "id": b.get("id"), "name": b.get("name"),
                               "arguments": b.get("input")})
            elif kind == "tool_result":
                blocks.append({"type": "tool_result", "id": b.get("tool_use_id"), "name": None,
                               "text": _text(b.get("content")), "is_error": bool(b.get("is_error")),
                               "source": "tool_result_block"})
        out.append(Message(role, blocks))
    return out


def _responses(request: dict) -> list[Message]:
    out = []
    if request.get("instructions"):
        out.append(Message("system", _text_blocks(request["instructions"])))
    items = request.get("input")
    if isinstance(items, str):
        return out + [Message("user", [{"type": "text", "text": items}])]
    for item in items or []:
        if not isinstance(item, dict):
            continue
        kind = item.get("type") or "message"
        if kind == "message":
            role = item.get("role")
            role = "system" if role in ("system", "developer") else role
            out.append(Message(role if role in ("system", "assistant") else "user",
                               _text_blocks(item.get("content"))))
        elif kind in ("function_call", "custom_tool_call"):
            raw = item.get("arguments", item.get("input"))
            out.append(Message("assistant", [{"type": "tool_call", "id": item.get("call_id"),
                                              "name": item.get("name"), "arguments": _parse_args(raw)}]))
        elif kind in ("function_call_output", "custom_tool_call_output"):
            out.append(Message("tool", [{"type": "tool_result", "id": item.get("call_id"), "name": None,
                                         "text": _text(item.get("output")), "is_error": False,
                                         "source": "function_call_output"}]))
    return out


def _gemini_response_text(response: Any) -> str:
    # Gemini wraps a function's result in an object; most clients use "output"/"result".
    if isinstance(response, dict):
        for key in ("output", "result", "content"):
            if isinstance(response.get(key), str):
                return response[key]
    return _text(response)


def _gemini(request: dict) -> list[Message]:
    out = []
    system = request.get("systemInstruction") or request.get("system_instruction")
    if isinstance(system, dict):
        out.append(Message("system", _text_blocks(system.get("parts"))))
    for c in request.get("contents") or []:
        if not isinstance(c, dict):
            continue
        role = "assistant" if c.get("role") == "model" else "user"
        blocks = []
        for p in c.get("parts") or []:
            if not isinstance(p, dict):
                continue
            if isinstance(p.get("text"), str) and not p.get("thought"):
                blocks.append({"type": "text", "text": p["text"]})
            fc = p.get("functionCall") or p.get("function_call")
            if isinstance(fc, dict):
                blocks.append({"type": "tool_call", "id": fc.get("id"), "name": fc.get("name"),
                               "arguments": fc.get("args")})
            fr = p.get("functionResponse") or p.get("function_response")
            if isinstance(fr, dict):
                blocks.append({"type": "tool_result", "id": fr.get("id"), "name": fr.get("name"),
                               "text": _gemini_response_text(fr.get("response")), "is_error": False,
                               "source": "function_response"})
        out.append(Message(role, blocks))
    return out


def messages(api: str, request: dict | None) -> list[Message]:
    """The request's conversation as neutral messages ([] when there is none)."""
    if not isinstance(request, dict):
        return []
    if api == "anthropic.messages":
        return _anthropic(request)
    if api == "openai.responses":
        return _responses(request)
    if api == "gemini":
        return _gemini(request)
    if "messages" in request:  # openai.chat, and "other" servers that copy it
        return _openai_chat(request)
    if "contents" in request:
        return _gemini(request)
    if "input" in request:
        return _responses(request)
    return []


def response_text(api: str, response: dict | None) -> str:
    """The assistant text of a reassembled response (for text-path tool calls)."""
    if not isinstance(response, dict):
        return ""
    if api == "anthropic.messages":
        return "".join(b.get("text") or "" for b in response.get("content") or []
                       if isinstance(b, dict) and b.get("type") == "text")
    if api == "openai.responses":
        parts = []
        for item in response.get("output") or []:
            if isinstance(item, dict) and item.get("type") == "message":
                parts.extend(b.get("text") or "" for b in item.get("content") or [] if isinstance(b, dict))
        return "".join(parts)
    if api == "gemini" or "candidates" in response:
        cands = response.get("candidates") or [{}]
        parts = ((cands[0] or {}).get("content") or {}).get("parts") or []
        return "".join(p.get("text") or "" for p in parts if isinstance(p, dict) and not p.get("thought"))
    choices = response.get("choices") or [{}]
    msg = (choices[0] or {}).get("message") or {}
    return _text(msg.get("content"))
