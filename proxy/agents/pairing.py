"""Result pairing: a join across turns.

The results for turn N's calls arrive in the request of N's child turn (the turn whose
request extends N's). Each call takes, in order of preference:
1. the result addressed to its id: an OpenAI `tool` message (`tool_call_id`), an
   Anthropic `tool_result` block (`tool_use_id`), a Responses `function_call_output`
   (`call_id`), a Gemini `functionResponse` (by id, else by name and order);
2. when that is Cline's `result missing` placeholder, or empty, or absent: the text block
   headed `[<tool> for '<arg>'] Result:` in the user message that follows, matched by tool
   and argument, then by tool alone, in order (so repeats pair by order);
3. else nothing: status "missing".
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from . import cline_results
from .cline_results import Segment
from .transcript import Message


@dataclass
class PairCall:
    key: Any  # the caller's key for this call
    id: str | None
    name: str
    header: tuple[str, str | None]  # cline_results.header_key(...)


def result(text: str | None, source: str | None, placeholder: str | None, status: str) -> dict[str, Any]:
    return {"text": text, "source": source, "placeholder": placeholder, "status": status}


def missing(placeholder: str | None = None) -> dict[str, Any]:
    return result(None, None, placeholder, "missing")


def region(parent_len: int, child: list[Message], ids: set[str]) -> list[Message]:
    """The messages of the child's request that answer the parent's reply: after the
    assistant message that made the calls, up to the next assistant message."""
    start = None
    if ids:  # where the parent's reply sits first (the child resends the parent's history), then anywhere
        start = _calls_from(child, ids, min(parent_len, len(child)), len(child))
        if start is None:
            start = _calls_from(child, ids, 0, min(parent_len, len(child)))
    if start is None:
        if parent_len < len(child):
            start = parent_len
        else:  # the child does not repeat the history (Responses previous_response_id)
            start = 0
    i = start
    while i < len(child) and child[i].role == "assistant":
        i += 1
    end = i
    while end < len(child) and child[end].role != "assistant":
        end += 1
    return child[i:end]


def _calls_from(child: list[Message], ids: set[str], first: int, end: int) -> int | None:
    """The first assistant message in child[first:end] that made one of the calls `ids`."""
    for i in range(first, end):
        m = child[i]
        if m.role == "assistant" and not m.call_ids.isdisjoint(ids):
            return i
    return None


def pair(parent_len: int, child: list[Message], calls: list[PairCall]) -> tuple[dict[Any, dict], dict[Any, Segment]]:
    """Results by call key, and the header segment each call was paired with."""
    answer = region(parent_len, child, {c.id for c in calls if c.id})
    by_id: dict[str, dict] = {}
    by_name: dict[str | None, list[dict]] = {}
    for m in answer:
        for block in m.results():
            if block.get("id"):
                by_id.setdefault(block["id"], block)
            else:
                by_name.setdefault(block.get("name"), []).append(block)
    segs = cline_results.segments([t for m in answer if m.role == "user" for t in m.texts()])

    results: dict[Any, dict] = {}
    placeholders: dict[Any, str | None] = {}
    pending: list[PairCall] = []
    for call in calls:
        block = by_id.get(call.id) if call.id else None
        if block is None and (not call.id or call.id not in by_id) and by_name.get(call.name):
            block = by_name[call.name].pop(0)
        if block is not None and not cline_results.is_placeholder(block["text"]):
            results[call.key] = result(block["text"], block["source"], None,
                                       cline_results.status_of(block["text"], block.get("is_error", False)))
            continue
        placeholders[call.key] = block["text"] if block is not None else None
        pending.append(call)

    matched = _match_headers(pending, segs)
    for call in pending:
        seg = matched.get(call.key)
        if seg is None:
            results[call.key] = missing(placeholders[call.key])
        else:
            results[call.key] = result(seg.text, "user_text_block", placeholders[call.key],
                                       cline_results.status_of(seg.text))
    return results, matched


def _match_headers(calls: list[PairCall], segs: list[Segment]) -> dict[Any, Segment]:
    """Exact (tool, argument) first, in order; then the tool alone for the rest."""
    matched: dict[Any, Segment] = {}
    for exact in (True, False):
        for call in calls:
            if call.key in matched:
                continue
            tool, arg = call.header
            for seg in segs:
                if seg.used or seg.tool != tool:
                    continue
                if exact and (arg is None or (seg.arg or "") != arg):
                    continue
                seg.used = True
                matched[call.key] = seg
                break
    return matched
