"""One request body moved from its wire API to another: OpenAI chat, Anthropic Messages
or Gemini generateContent.

Pure: a body in, a body out, plus what the move lost, in words a person reads. A body is
read into a small neutral conversation (system texts; user and assistant messages made of
text, image, call and result parts; tools as `ToolSpec`; a few sampling settings), then
written in the target's shape. The tool definitions go through the schema converters
(`proxy.schemas`), so a replay sends exactly what `tooltap schemas convert` shows; tool
names a provider rejects are renamed there, and `Translation.renamed` maps them back.

Whatever has no place in the target is reported, never dropped silently: images given by
URL to Gemini, thinking blocks, prompt-caching hints, `parallel_tool_calls` for Gemini,
settings with no counterpart, tools that are not functions.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from typing import Any

from ..schemas.convert import convert_tool
from ..schemas.names import fix_name
from ..schemas.sources import SourceError, from_document
from ..schemas.spec import SchemaError, ToolSpec

# The short names of `--to` and the wire API names the store uses.
API_NAMES = {"openai": "openai.chat", "anthropic": "anthropic.messages", "gemini": "gemini"}
# Whose naming rules (proxy.schemas.names) each API's tool names follow.
_PROVIDER = {"openai.chat": "openai", "anthropic.messages": "anthropic", "gemini": "gemini"}
# Anthropic requires max_tokens; a recording from another API may not have one.
DEFAULT_MAX_TOKENS = 8192


class TranslationError(ValueError):
    """The body cannot be translated at all (an API we do not read, a body that is not JSON)."""


@dataclass
class Translation:
    body: dict
    lost: list[str] = field(default_factory=list)
    renamed: dict[str, str] = field(default_factory=dict)  # tool name as sent -> as recorded


@dataclass
class Conversation:
    """The neutral form. Parts are dicts:
    {"type": "text", "text"} · {"type": "image", "media_type", "data"} or {..., "url"} ·
    {"type": "call", "id", "name", "args", "raw"} · {"type": "result", "id", "name", "parts", "is_error"}"""

    system: list[str] = field(default_factory=list)
    messages: list[tuple[str, list[dict]]] = field(default_factory=list)  # ("user" | "assistant", parts)
    tools: list[ToolSpec] = field(default_factory=list)
    tool_choice: tuple[str, str | None] | None = None  # ("auto" | "none" | "required" | "tool", name)
    parallel: bool | None = None  # False: at most one tool call per answer
    # max_tokens, temperature, top_p, top_k, stop (a list), seed, presence_penalty, frequency_penalty
    settings: dict[str, Any] = field(default_factory=dict)


class _Lost(list):
    def add(self, text: str) -> None:
        if text not in self:  # a loss repeated on every message is said once
            self.append(text)


def api_name(name: str) -> str:
    return API_NAMES.get(name, name)


def translate(body: Any, source: str, target: str, *, model: str | None = None,
              stream: bool = False) -> Translation:
    """`body` (a request of API `source`) as a request of API `target`. `model` goes into
    the body for the APIs that name it there (Gemini names it in the URL); `stream` asks
    for a streamed answer the way the target asks for one in its body."""
    source, target = api_name(source), api_name(target)
    for api in (source, target):
        if api not in READERS:
            raise TranslationError(f"cannot translate {'from' if api == source else 'to'} {api} "
                                   f"(supported: {', '.join(READERS)})")
    if not isinstance(body, dict):
        raise TranslationError("the request body is not a JSON object")
    lost = _Lost()
    conv = READERS[source](body, lost)
    provider = _PROVIDER[target]
    renamed: dict[str, str] = {}

    def rename(name: str) -> str:
        new, _ = fix_name(name, provider)
        if new != name:
            renamed[new] = name
        return new

    out = WRITERS[target](conv, rename, lost, model=model, stream=stream)
    return Translation(out, list(lost), renamed)


# -- reading ------------------------------------------------------------------------------

def _append(messages: list[tuple[str, list[dict]]], role: str, parts: list[dict]) -> None:
    """Consecutive messages of one role become one (tool results join the user's text)."""
    if messages and messages[-1][0] == role:
        messages[-1][1].extend(parts)
    else:
        messages.append((role, list(parts)))


def _parse_args(raw: Any) -> tuple[Any, str]:
    if isinstance(raw, str):
        try:
            return (json.loads(raw) if raw.strip() else {}), raw
        except ValueError:
            return None, raw
    return raw, json.dumps(raw, ensure_ascii=False)


def _tools(body: dict, key: str, label: str, lost: _Lost) -> list[ToolSpec]:
    tools = body.get(key)
    if not tools:
        return []
    try:
        found = from_document(tools)
    except SourceError as exc:
        lost.add(f"tools: {exc}; none sent")
        return []
    if label == "Gemini":  # entries there are {"functionDeclarations": [...]} or {"googleSearch": {}}...
        skipped = [f"tools[{i}] ({', '.join(t)})" for i, t in enumerate(tools)
                   if isinstance(t, dict) and not ({"functionDeclarations", "function_declarations"} & t.keys())]
    else:
        skipped = [text.split(":")[0] for text in found.skipped]
    for what in skipped:
        lost.add(f"{what}: not a function tool; dropped ({label} tools other than functions have no counterpart)")
    return found.tools


def _unknown_keys(body: dict, known: set[str], label: str, lost: _Lost) -> None:
    for key, value in body.items():
        if key not in known and value is not None:
            lost.add(f"`{key}` ({label} setting) has no counterpart; dropped")


def _image_from_url(url: str) -> dict:
    m = re.match(r"data:([^;,]+);base64,(.*)", url, re.S)
    if m:
        return {"type": "image", "media_type": m.group(1), "data": m.group(2)}
    return {"type": "image", "url": url}


def _openai_parts(content: Any, where: str, lost: _Lost) -> list[dict]:
    if content is None:
        return []
    if isinstance(content, str):
        return [{"type": "text", "text": content}]
    parts = []
    for part in content if isinstance(content, list) else [content]:
        kind = part.get("type") if isinstance(part, dict) else None
        if kind in ("text", "refusal") and isinstance(part.get(kind), str):
            parts.append({"type": "text", "text": part[kind]})
        elif kind == "image_url":
            url = part.get("image_url")
            url = url.get("url") if isinstance(url, dict) else url
            if isinstance(url, str):
                parts.append(_image_from_url(url))
        else:
            lost.add(f"{where}: a `{kind}` part (only text and images carry over); dropped")
    return parts


OPENAI_KNOWN = {"model", "messages", "tools", "tool_choice", "parallel_tool_calls", "stream", "stream_options",
                "max_tokens", "max_completion_tokens", "temperature", "top_p", "stop", "seed",
                "presence_penalty", "frequency_penalty", "n"}


def read_openai(body: dict, lost: _Lost) -> Conversation:
    conv = Conversation(tools=_tools(body, "tools", "OpenAI", lost))
    names: dict[str, str] = {}  # call id -> tool name, for the results
    for i, m in enumerate(body.get("messages") or []):
        if not isinstance(m, dict):
            continue
        role, where = m.get("role"), f"messages[{i}] ({m.get('role')})"
        if role in ("system", "developer"):
            texts = [p["text"] for p in _openai_parts(m.get("content"), where, lost) if p["type"] == "text"]
            if not conv.messages:
                conv.system += texts
            else:
                lost.add(f"{where}: a system message inside the conversation became user text")
                _append(conv.messages, "user", [{"type": "text", "text": t} for t in texts])
        elif role == "assistant":
            parts = _openai_parts(m.get("content"), where, lost)
            calls = list(m.get("tool_calls") or [])
            if isinstance(m.get("function_call"), dict):
                calls.append({"function": m["function_call"]})
            for n, c in enumerate(calls):
                fn = c.get("function") or {}
                args, raw = _parse_args(fn.get("arguments"))
                call_id = c.get("id") or f"call_{i}_{n}"
                names[call_id] = fn.get("name") or ""
                parts.append({"type": "call", "id": call_id, "name": fn.get("name") or "", "args": args, "raw": raw})
            for key in ("reasoning_content", "reasoning"):
                if m.get(key):
                    lost.add(f"{where}: the assistant's `{key}` (its reasoning) has no counterpart; dropped")
            _append(conv.messages, "assistant", parts)
        elif role in ("tool", "function"):
            call_id = m.get("tool_call_id") or next((k for k, v in names.items() if v == m.get("name")), None)
            _append(conv.messages, "user", [{"type": "result", "id": call_id, "name": names.get(call_id, m.get("name") or ""),
                                             "parts": _openai_parts(m.get("content"), where, lost), "is_error": False}])
        else:
            _append(conv.messages, "user", _openai_parts(m.get("content"), where, lost))
    s = conv.settings
    _copy(body, s, {"max_tokens": "max_tokens", "max_completion_tokens": "max_tokens", "temperature": "temperature",
                    "top_p": "top_p", "seed": "seed", "presence_penalty": "presence_penalty",
                    "frequency_penalty": "frequency_penalty"})
    if body.get("stop"):
        s["stop"] = [body["stop"]] if isinstance(body["stop"], str) else list(body["stop"])
    if isinstance(body.get("n"), int) and body["n"] > 1:
        lost.add(f"`n` = {body['n']}: only one answer is asked for")
    choice = body.get("tool_choice")
    if isinstance(choice, str):
        conv.tool_choice = (choice, None)
    elif isinstance(choice, dict):
        conv.tool_choice = ("tool", (choice.get("function") or {}).get("name"))
    if isinstance(body.get("parallel_tool_calls"), bool):
        conv.parallel = body["parallel_tool_calls"]
    _unknown_keys(body, OPENAI_KNOWN, "OpenAI", lost)
    return conv


def _copy(src: dict, dst: dict, keys: dict[str, str]) -> None:
    for key, neutral in keys.items():
        if src.get(key) is not None:
            dst[neutral] = src[key]


ANTHROPIC_KNOWN = {"model", "messages", "system", "tools", "tool_choice", "stream", "max_tokens", "temperature",
                   "top_p", "top_k", "stop_sequences"}


def _anthropic_parts(content: Any, where: str, lost: _Lost, names: dict[str, str]) -> list[dict]:
    if isinstance(content, str):
        return [{"type": "text", "text": content}]
    parts = []
    for block in content or []:
        if not isinstance(block, dict):
            continue
        kind = block.get("type")
        if "cache_control" in block:
            lost.add("cache_control (Anthropic prompt-caching hints) has no counterpart; dropped")
        if kind == "text":
            parts.append({"type": "text", "text": block.get("text") or ""})
        elif kind == "image" and isinstance(block.get("source"), dict):
            src = block["source"]
            if src.get("type") == "base64":
                parts.append({"type": "image", "media_type": src.get("media_type"), "data": src.get("data")})
            elif src.get("type") == "url":
                parts.append({"type": "image", "url": src.get("url")})
            else:
                lost.add(f"{where}: an image from a `{src.get('type')}` source; dropped")
        elif kind == "tool_use":
            names[block.get("id")] = block.get("name") or ""
            args = block.get("input")
            parts.append({"type": "call", "id": block.get("id"), "name": block.get("name") or "", "args": args,
                          "raw": json.dumps(args, ensure_ascii=False)})
        elif kind == "tool_result":
            parts.append({"type": "result", "id": block.get("tool_use_id"), "name": names.get(block.get("tool_use_id"), ""),
                          "parts": _anthropic_parts(block.get("content"), where, lost, names),
                          "is_error": bool(block.get("is_error"))})
        elif kind in ("thinking", "redacted_thinking"):
            lost.add(f"{where}: a `{kind}` block (the model's reasoning) has no counterpart; dropped")
        else:
            lost.add(f"{where}: a `{kind}` block (only text, images, tool_use and tool_result carry over); dropped")
    return parts


def read_anthropic(body: dict, lost: _Lost) -> Conversation:
    conv = Conversation(tools=_tools(body, "tools", "Anthropic", lost))
    system = body.get("system")
    if system:
        conv.system = [p["text"] for p in _anthropic_parts(system, "system", lost, {}) if p["type"] == "text"]
    names: dict[str, str] = {}
    for i, m in enumerate(body.get("messages") or []):
        if isinstance(m, dict):
            role = "assistant" if m.get("role") == "assistant" else "user"
            _append(conv.messages, role, _anthropic_parts(m.get("content"), f"messages[{i}] ({role})", lost, names))
    s = conv.settings
    _copy(body, s, {"max_tokens": "max_tokens", "temperature": "temperature", "top_p": "top_p", "top_k": "top_k"})
    if body.get("stop_sequences"):
        s["stop"] = list(body["stop_sequences"])
    choice = body.get("tool_choice")
    if isinstance(choice, dict):
        kind = {"auto": "auto", "any": "required", "none": "none", "tool": "tool"}.get(choice.get("type"))
        if kind:
            conv.tool_choice = (kind, choice.get("name"))
        if choice.get("disable_parallel_tool_use") is True:
            conv.parallel = False
    _unknown_keys(body, ANTHROPIC_KNOWN, "Anthropic", lost)
    return conv


GEMINI_KNOWN = {"contents", "systemInstruction", "system_instruction", "tools", "toolConfig", "tool_config",
                "generationConfig", "generation_config", "model"}
GEMINI_CONFIG = {"maxOutputTokens": "max_tokens", "temperature": "temperature", "topP": "top_p", "topK": "top_k",
                 "seed": "seed", "presencePenalty": "presence_penalty", "frequencyPenalty": "frequency_penalty"}


def _gemini_result_parts(response: Any) -> tuple[list[dict], bool]:
    """A functionResponse's `response` object as text; `{"error": ...}` marks a failure."""
    if isinstance(response, dict) and len(response) == 1:
        (key, value), = response.items()
        if key in ("output", "result", "content", "error") and isinstance(value, str):
            return [{"type": "text", "text": value}], key == "error"
    return [{"type": "text", "text": json.dumps(response, ensure_ascii=False)}], False


def read_gemini(body: dict, lost: _Lost) -> Conversation:
    conv = Conversation(tools=_tools(body, "tools", "Gemini", lost))
    system = body.get("systemInstruction") or body.get("system_instruction")
    if isinstance(system, dict):
        conv.system = [p["text"] for p in system.get("parts") or [] if isinstance(p, dict) and isinstance(p.get("text"), str)]
    pending: list[dict] = []  # calls not answered yet: Gemini pairs results by name and order
    for i, c in enumerate(body.get("contents") or []):
        if not isinstance(c, dict):
            continue
        role = "assistant" if c.get("role") == "model" else "user"
        where, parts = f"contents[{i}] ({c.get('role')})", []
        for p in c.get("parts") or []:
            if not isinstance(p, dict):
                continue
            if "thoughtSignature" in p or "thought_signature" in p:
                lost.add("thoughtSignature (Gemini's reasoning state) has no counterpart; dropped")
            fc = p.get("functionCall") or p.get("function_call")
            fr = p.get("functionResponse") or p.get("function_response")
            inline = p.get("inlineData") or p.get("inline_data")
            if p.get("thought"):
                lost.add(f"{where}: a thought part (the model's reasoning) has no counterpart; dropped")
            elif isinstance(p.get("text"), str):
                parts.append({"type": "text", "text": p["text"]})
            elif isinstance(fc, dict):
                call = {"type": "call", "id": fc.get("id") or f"call_{i}_{len(parts)}", "name": fc.get("name") or "",
                        "args": fc.get("args") if fc.get("args") is not None else {}}
                call["raw"] = json.dumps(call["args"], ensure_ascii=False)
                pending.append(call)
                parts.append(call)
            elif isinstance(fr, dict):
                call = next((x for x in pending if (fr.get("id") and x["id"] == fr["id"]) or
                             (not fr.get("id") and x["name"] == fr.get("name"))), None)
                if call is not None:
                    pending.remove(call)
                result_parts, is_error = _gemini_result_parts(fr.get("response"))
                parts.append({"type": "result", "id": call["id"] if call else fr.get("id") or f"result_{i}",
                              "name": fr.get("name") or "", "parts": result_parts, "is_error": is_error})
            elif isinstance(inline, dict) and str(inline.get("mimeType", "")).startswith("image/"):
                parts.append({"type": "image", "media_type": inline["mimeType"], "data": inline.get("data")})
            else:
                kind = next(iter(p), "empty")
                lost.add(f"{where}: a `{kind}` part (only text, inline images and function calls carry over); dropped")
        _append(conv.messages, role, parts)
    config = body.get("generationConfig") or body.get("generation_config") or {}
    for key, value in config.items():
        if key in GEMINI_CONFIG:
            conv.settings[GEMINI_CONFIG[key]] = value
        elif key == "stopSequences":
            conv.settings["stop"] = list(value)
        elif key == "candidateCount" and value == 1:
            continue
        elif value is not None:
            lost.add(f"generationConfig.{key} (Gemini setting) has no counterpart; dropped")
    fcc = (body.get("toolConfig") or body.get("tool_config") or {}).get("functionCallingConfig") or {}
    mode = str(fcc.get("mode", "")).upper()
    allowed = fcc.get("allowedFunctionNames") or []
    if mode == "ANY" and len(allowed) == 1:
        conv.tool_choice = ("tool", allowed[0])
    elif mode in ("AUTO", "ANY", "NONE"):
        conv.tool_choice = ({"AUTO": "auto", "ANY": "required", "NONE": "none"}[mode], None)
        if allowed:
            lost.add("toolConfig allowedFunctionNames (a subset of tools) has no counterpart; dropped")
    _unknown_keys(body, GEMINI_KNOWN, "Gemini", lost)
    return conv


READERS = {"openai.chat": read_openai, "anthropic.messages": read_anthropic, "gemini": read_gemini}


# -- writing ------------------------------------------------------------------------------

def _converted_tools(conv: Conversation, target: str, lost: _Lost, rename) -> list[dict]:
    out = []
    by_loss: dict[tuple[str, str], list[str]] = {}  # one line per loss, naming every tool it hit
    for spec in conv.tools:
        try:
            tool, losses = convert_tool(spec, target)
        except SchemaError as exc:
            lost.add(f"tool {spec.name!r}: {exc}; not sent")
            continue
        rename(spec.name)  # the converter applied the same rename: record it
        out.append(tool)
        for loss in losses:
            by_loss.setdefault((loss.reason, loss.path), []).append(spec.name)
    for (reason, path), names in by_loss.items():
        shown = ", ".join(names[:6]) + (f" and {len(names) - 6} more" if len(names) > 6 else "")
        lost.add(f"{'tool' if len(names) == 1 else f'{len(names)} tools'} {shown}: {reason} (at {path})")
    return out


def _texts(parts: list[dict]) -> str:
    return "".join(p["text"] for p in parts if p["type"] == "text")


def _drop_images(parts: list[dict], where: str, label: str, lost: _Lost) -> None:
    if any(p["type"] == "image" for p in parts):
        lost.add(f"{where}: images in a tool result ({label} tool results are text); dropped")


def _settings_lost(conv: Conversation, supported: set[str], label: str, lost: _Lost) -> None:
    for key, value in conv.settings.items():
        if key not in supported:
            lost.add(f"{key} = {json.dumps(value)} has no {label} counterpart; dropped")


def _args_object(call: dict, label: str, lost: _Lost) -> dict:
    if isinstance(call["args"], dict):
        return call["args"]
    lost.add(f"call {call['name']!r}: its arguments are not a JSON object ({call['raw'][:60]!r}); "
             f"{label} takes an object: sent {{}}")
    return {}


def write_openai(conv: Conversation, rename, lost: _Lost, *, model, stream) -> dict:
    messages: list[dict] = [{"role": "system", "content": text} for text in conv.system]
    for i, (role, parts) in enumerate(conv.messages):
        where = f"message {i} ({role})"
        if role == "assistant":
            msg: dict = {"role": "assistant", "content": _texts(parts) or None}
            if any(p["type"] == "image" for p in parts):
                lost.add(f"{where}: images in an assistant message (OpenAI takes text only there); dropped")
            calls = [{"id": p["id"], "type": "function", "function": {
                "name": rename(p["name"]),
                "arguments": p["raw"] if p["args"] is None else json.dumps(p["args"], ensure_ascii=False, separators=(",", ":"))}}
                for p in parts if p["type"] == "call"]
            if calls:
                msg["tool_calls"] = calls
            if msg["content"] is None and not calls:
                lost.add(f"{where}: an empty message (nothing in it carries over); dropped")
            else:
                messages.append(msg)
            continue
        for p in parts:  # tool results first: they must follow the assistant's calls
            if p["type"] == "result":
                _drop_images(p["parts"], where, "OpenAI", lost)
                text = _texts(p["parts"])
                if p["is_error"]:
                    lost.add(f"{where}: a tool result's error flag (OpenAI has none; the text stays)")
                messages.append({"role": "tool", "tool_call_id": p["id"], "content": text})
        rest = [p for p in parts if p["type"] in ("text", "image")]
        if rest:
            content = [{"type": "text", "text": p["text"]} if p["type"] == "text" else
                       {"type": "image_url", "image_url": {"url": p.get("url") or f"data:{p['media_type']};base64,{p['data']}"}}
                       for p in rest]
            if len(content) == 1 and content[0]["type"] == "text":
                content = content[0]["text"]
            messages.append({"role": "user", "content": content})
        elif not any(p["type"] == "result" for p in parts):
            lost.add(f"{where}: an empty message (nothing in it carries over); dropped")
    body: dict = {"model": model, "messages": messages}
    if conv.tools:
        body["tools"] = _converted_tools(conv, "openai", lost, rename)
    if conv.tool_choice:
        kind, name = conv.tool_choice
        body["tool_choice"] = {"type": "function", "function": {"name": rename(name or "")}} if kind == "tool" else kind
    if conv.parallel is not None and conv.tools:
        body["parallel_tool_calls"] = conv.parallel
    s = conv.settings
    _copy(s, body, {k: k for k in ("max_tokens", "temperature", "top_p", "seed", "presence_penalty", "frequency_penalty")})
    if s.get("stop"):
        body["stop"] = s["stop"]
    _settings_lost(conv, {"max_tokens", "temperature", "top_p", "seed", "presence_penalty", "frequency_penalty", "stop"},
                   "OpenAI", lost)
    if stream:
        body["stream"] = True
    return body


def _anthropic_block(p: dict) -> dict | None:
    if p["type"] == "text":
        return {"type": "text", "text": p["text"]} if p["text"] else None  # empty text blocks are refused
    if p.get("url"):
        return {"type": "image", "source": {"type": "url", "url": p["url"]}}
    return {"type": "image", "source": {"type": "base64", "media_type": p["media_type"], "data": p["data"]}}


def write_anthropic(conv: Conversation, rename, lost: _Lost, *, model, stream) -> dict:
    messages = []
    for i, (role, parts) in enumerate(conv.messages):
        where = f"message {i} ({role})"
        results = [p for p in parts if p["type"] == "result"]
        blocks: list[dict] = []
        for p in results:  # tool_result blocks must open the user message
            inner = [b for b in (_anthropic_block(x) for x in p["parts"]) if b]
            block: dict = {"type": "tool_result", "tool_use_id": _anthropic_id(p["id"])}
            if inner:
                block["content"] = inner
            if p["is_error"]:
                block["is_error"] = True
            blocks.append(block)
        for p in parts:
            if p["type"] in ("text", "image"):
                block = _anthropic_block(p)
                if block:
                    blocks.append(block)
            elif p["type"] == "call":
                blocks.append({"type": "tool_use", "id": _anthropic_id(p["id"]), "name": rename(p["name"]),
                               "input": _args_object(p, "Anthropic", lost)})
        if not blocks:
            lost.add(f"{where}: an empty message (Anthropic refuses one); dropped")
            continue
        messages.append({"role": role, "content": blocks})
    body: dict = {"model": model, "max_tokens": conv.settings.get("max_tokens") or DEFAULT_MAX_TOKENS}
    if conv.system:
        body["system"] = conv.system[0] if len(conv.system) == 1 else [{"type": "text", "text": t} for t in conv.system]
    body["messages"] = messages
    if conv.tools:
        body["tools"] = _converted_tools(conv, "anthropic", lost, rename)
        choice: dict | None = None
        if conv.tool_choice:
            kind, name = conv.tool_choice
            choice = {"type": {"auto": "auto", "required": "any", "none": "none", "tool": "tool"}[kind]}
            if kind == "tool":
                choice["name"] = rename(name or "")
        if conv.parallel is False:
            choice = choice or {"type": "auto"}
            if choice["type"] != "none":
                choice["disable_parallel_tool_use"] = True
        if choice:
            body["tool_choice"] = choice
    s = conv.settings
    if "temperature" in s:
        body["temperature"] = min(s["temperature"], 1.0)
        if s["temperature"] > 1:
            lost.add(f"temperature {s['temperature']} is above Anthropic's maximum: sent 1.0")
    _copy(s, body, {"top_p": "top_p", "top_k": "top_k"})
    if s.get("stop"):
        body["stop_sequences"] = s["stop"]
    _settings_lost(conv, {"max_tokens", "temperature", "top_p", "top_k", "stop"}, "Anthropic", lost)
    if stream:
        body["stream"] = True
    return body


def _anthropic_id(call_id: Any) -> str:
    # Anthropic ids match ^[a-zA-Z0-9_-]+$; the same cleaning on both sides keeps the pairs.
    return re.sub(r"[^a-zA-Z0-9_-]", "_", str(call_id or "")) or "call"


def write_gemini(conv: Conversation, rename, lost: _Lost, *, model, stream) -> dict:
    contents = []
    for i, (role, parts) in enumerate(conv.messages):
        where = f"message {i} ({role})"
        out: list[dict] = []
        for p in sorted(parts, key=lambda p: p["type"] != "result"):  # responses open the turn
            if p["type"] == "text":
                if p["text"]:
                    out.append({"text": p["text"]})
            elif p["type"] == "image":
                if p.get("url"):
                    lost.add(f"{where}: an image given by URL (Gemini takes images inline); dropped")
                else:
                    out.append({"inlineData": {"mimeType": p["media_type"], "data": p["data"]}})
            elif p["type"] == "call":
                out.append({"functionCall": {"name": rename(p["name"]), "args": _args_object(p, "Gemini", lost)}})
            elif p["type"] == "result":
                _drop_images(p["parts"], where, "Gemini", lost)
                key = "error" if p["is_error"] else "output"
                out.append({"functionResponse": {"name": rename(p["name"]), "response": {key: _texts(p["parts"])}}})
        if not out:
            lost.add(f"{where}: an empty message (Gemini refuses one); dropped")
            continue
        contents.append({"role": "model" if role == "assistant" else "user", "parts": out})
    body: dict = {"contents": contents}
    if conv.system:
        body["systemInstruction"] = {"parts": [{"text": t} for t in conv.system]}
    if conv.tools:
        body["tools"] = [{"functionDeclarations": _converted_tools(conv, "gemini", lost, rename)}]
        if conv.tool_choice:
            kind, name = conv.tool_choice
            config: dict = {"mode": {"auto": "AUTO", "required": "ANY", "none": "NONE", "tool": "ANY"}[kind]}
            if kind == "tool":
                config["allowedFunctionNames"] = [rename(name or "")]
            body["toolConfig"] = {"functionCallingConfig": config}
        if conv.parallel is False:
            lost.add("parallel_tool_calls = false (one tool call at a time) has no Gemini counterpart; dropped")
    config = {gemini: conv.settings[neutral] for gemini, neutral in GEMINI_CONFIG.items() if neutral in conv.settings}
    if conv.settings.get("stop"):
        config["stopSequences"] = conv.settings["stop"]
    if config:
        body["generationConfig"] = config
    return body


WRITERS = {"openai.chat": write_openai, "anthropic.messages": write_anthropic, "gemini": write_gemini}
