"""The session page's model: each turn as the agent lived it.

A turn's request resends the whole history, so the page shows only what is new in it:
the messages after its parent turn's (minus the assistant reply the parent already
shows), split into task, tool results, environment details and reminders. The system
prompt is shown once and marked again only where it changes. Message lists come from the
chain (one recursive query per turn), blobs are read once per page.
"""

from __future__ import annotations

import bisect
import json
import re
from typing import Any

import orjson
from sqlalchemy import Text, cast, func
from sqlalchemy.orm import defer
from sqlmodel import Session as DB, select

from proxy import apis
from proxy.agents import transcript
from proxy.store import content
from proxy.store.models import Blob, ChainNode, ToolCallRow, Turn
from proxy.store.readable import upstream_message, upstream_note
from proxy.store.read import (CHAIN_QUERY, Reader, rounded_ms, session_json, text_calls_json, tool_call_json,
                              turn_summary)

from .mcp_pages import marks as mcp_marks, turn_links as mcp_links

RESULT_HEADER = re.compile(r"^\[([^\s\]]+)(?: for '(.*?)')?\] Result:", re.S)


PAGE_TURNS = 50  # turn cards drawn per response; the page fetches the next ones as they come into view


def session_view(reader: Reader, session_id: str, after: int | None = None,
                 limit: int = PAGE_TURNS) -> dict | None:
    """The session page's model: the chart of every turn, and the cards of `limit` turns
    from the first one after turn id `after`. `next_after` says where the next ones start
    (None: these are the last). A 500-turn session would otherwise be a megabyte and a
    half of HTML, and seconds of decoding, before the first card shows."""
    from proxy.store.models import Session

    with DB(reader.engine) as db:
        s = db.get(Session, session_id)
        if s is None:
            return None
        # Every turn in a few columns (the chart, the branches); whole rows only for the window.
        points = _points(db, session_id)
        ids = [p.id for p in points]
        numbers = _places(ids)
        start = bisect.bisect_right(ids, after) if after is not None else 0
        shown = ids[start:start + limit]
        before = ids[start - 1] if start else None
        parent_of = {p.id: p.parent_id for p in points}
        wanted = set(shown) | {parent_of[i] for i in shown if parent_of[i] is not None} | ({before} - {None})
        window = select(Turn).options(*_CARD_ONLY).where(Turn.id.in_(wanted))
        by_id = {t.id: t for t in db.exec(window)} if wanted else {}
        children: dict[int | None, list[int]] = {}
        for p in points:
            children.setdefault(p.parent_id, []).append(p.id)
        chains = Chains(db, session_id)
        blobs = _window_blobs(db, [by_id[i] for i in shown], by_id, chains)
        calls = _calls(db, shown, mcp_marks(db, session_id), numbers)
        last_system = None
        if before is not None:  # the prompt the reader saw last, on the turn before the window
            prev = by_id[before]
            found = _system(db, reader, prev, chains(prev), blobs)
            last_system = found["hash"] if found else None
        views = []
        for i in shown:
            t = by_id[i]
            v = turn_view(db, reader, t, calls.get(t.id, []), by_id.get(t.parent_id), blobs, chains)
            if v["system"]:
                _mark_system(v["system"], last_system is None, last_system)
                last_system = v["system"]["hash"]
            _number(v, t, numbers, children[t.parent_id])
            v["no_sequel"] = t.id not in children and t.id != ids[-1]  # its tool results will never come
            views.append(v)
        return {**_header(s), "turn_views": views, "first_shown": start + 1,
                "next_after": shown[-1] if start + limit < len(ids) else None,
                "chart": _chart(points)}


def session_head(reader: Reader, session_id: str) -> dict | None:
    """What the session page's header shows (its totals and chart) without a window of
    cards: for live updates, on each stored turn."""
    from proxy.store.models import Session

    with DB(reader.engine) as db:
        s = db.get(Session, session_id)
        return None if s is None else {**_header(s), "chart": _chart(_points(db, session_id))}


def _header(s) -> dict:
    """The session as its page's header and <title> show it, on a page load and on each
    live update alike."""
    out = session_json(s)
    n = out["turns"]
    out["page_title"] = f"{out['title'] or out['id']} · {n:,} turn{'' if n == 1 else 's'} · tooltap"
    return out


def _points(db: DB, session_id: str) -> list:
    """Each turn of the session in the few columns the chart and the branches need, in order.
    usage as text, read with orjson: the JSON type's json.loads per row was a tenth of the page."""
    return db.exec(select(Turn.id, Turn.parent_id, cast(Turn.usage, Text).label("usage"), Turn.ttft_ms,
                          Turn.duration_ms).where(Turn.session_id == session_id).order_by(Turn.id)).all()


def _chart(points: list) -> dict | None:
    return chart([_point(p, n) for n, p in enumerate(points, 1)])


# What a card never shows, left in the database: the stream's bytes and timing, and the
# headers (the turn page has them). Tens of KB a turn that the page would read for nothing.
_CARD_ONLY = [defer(Turn.raw), defer(Turn.timeline), defer(Turn.request_raw), defer(Turn.request_headers),
              defer(Turn.response_headers)]


def _window_blobs(db: DB, window: list[Turn], by_id: dict[int, Turn], chains: "Chains") -> dict[str, Any]:
    """The messages the window's cards show, in one query: each turn's new ones (past its
    parent's) and the candidates for its system prompt."""
    wanted: set[str] = set()
    for t in window:
        hashes = chains(t)
        wanted.update(hashes[_new_from(by_id.get(t.parent_id), hashes):])
        wanted.update(hashes[:1])
        if t.system_hash is not None:
            wanted.add(t.system_hash)
    if not wanted:
        return {}
    rows = db.exec(select(Blob.hash, Blob.data).where(Blob.hash.in_(wanted)))
    return {h: content.unpack(data) for h, data in rows}


def _new_from(parent: Turn | None, hashes: list[str]) -> int:
    """Where a turn's own messages start in its request: past its parent's."""
    return parent.message_count if parent is not None and parent.message_count <= len(hashes) else 0


def _mark_system(system: dict, first: bool, previous: str | None) -> None:
    """Whether the page shows this system prompt: the first one, or one that changed."""
    system["first"] = first
    system["changed"] = previous is not None and system["hash"] != previous
    system["show"] = system["first"] or system["changed"]


def _point(p, n: int) -> dict:
    """One turn of the chart, the session's `n`th (`usage` as JSON text)."""
    tokens_in, tokens_out = tokens(orjson.loads(p.usage) if p.usage else None)
    return {"id": p.id, "n": n, "tokens_in": tokens_in, "tokens_out": tokens_out,
            "ttft_ms": rounded_ms(p.ttft_ms), "duration_ms": rounded_ms(p.duration_ms)}


def one_turn_view(reader: Reader, turn_id: int) -> dict | None:
    """A single turn as the session page draws it (for live updates)."""
    with DB(reader.engine) as db:
        t = db.get(Turn, turn_id)
        if t is None:
            return None
        parent = db.get(Turn, t.parent_id) if t.parent_id else None
        numbers = numbers_in(db, t.session_id)
        v = turn_view(db, reader, t, _calls(db, [t.id], (mcp_links(db, t), {}), numbers).get(t.id, []), parent, {})
        if v["system"]:
            blobs: dict[str, Any] = {}
            prev = _system(db, reader, parent, _chain(db, parent), blobs) if parent else None
            _mark_system(v["system"], parent is None, prev["hash"] if prev else None)
        siblings = db.exec(select(Turn.id).where(Turn.parent_id == t.parent_id, Turn.session_id == t.session_id)
                           .order_by(Turn.id)).all()
        _number(v, t, numbers, list(siblings))
        v["no_sequel"] = t.id != max(numbers) and db.exec(select(Turn.id).where(Turn.parent_id == t.id)).first() is None
        return v


def call_result(reader: Reader, turn_id: int, index: int) -> str | None:
    """The whole text of the result paired with call `index` of a turn (its card shows the
    first CLIP characters); None when there is no such call or no result."""
    with DB(reader.engine) as db:
        row = db.exec(select(ToolCallRow.index, ToolCallRow.result)
                      .where(ToolCallRow.turn_id == turn_id, ToolCallRow.index == index)).first()
        if row is not None:
            result = row.result
        else:  # a call parsed from the text: numbered after the native ones (text_calls_json)
            native = db.exec(select(func.count()).select_from(ToolCallRow)
                             .where(ToolCallRow.turn_id == turn_id)).one()
            decoding = db.exec(select(Turn.decoding).where(Turn.id == turn_id)).first()
            found = [c for c in text_calls_json(decoding, native) if c["index"] == index]
            result = found[0]["result"] if found else None
    text = result.get("text") if isinstance(result, dict) else None
    return text if isinstance(text, str) else None


def turn_numbers(reader: Reader, session_id: str) -> dict[int, int]:
    """Turn id -> its place in its session (1 for the first): what the pages call a turn.
    The id, which counts the turns of every session together, is shown as #id."""
    with DB(reader.engine) as db:
        return numbers_in(db, session_id)


def numbers_in(db: DB, session_id: str) -> dict[int, int]:
    """turn_numbers, in an open database session."""
    return _places(db.exec(select(Turn.id).where(Turn.session_id == session_id).order_by(Turn.id)).all())


def _places(ids: list[int]) -> dict[int, int]:
    return {turn_id: n for n, turn_id in enumerate(ids, 1)}


def _number(v: dict, t: Turn, numbers: dict[int, int], siblings: list[int]) -> None:
    v["n"] = numbers.get(t.id)
    v["branch"] = _branch(t, siblings, numbers)
    # A later turn whose history holds no earlier turn of the session: the same first
    # request again (a retry, a re-run) or another conversation under one session name.
    v["starts_over"] = t.parent_id is None and v["n"] not in (None, 1)


def _calls(db: DB, ids: list[int], mcp: tuple[dict, dict] = ({}, {}),
           numbers: dict[int, int] | None = None) -> dict[int, list[dict]]:
    """`mcp`: (tool_calls.id -> MCP link, tool_calls.id -> why it never reached its server);
    `numbers`: the session's turns by their place, to name the turn an MCP result went to."""
    links, unreached = mcp
    out: dict[int, list[dict]] = {}
    if ids:
        for c in db.exec(select(ToolCallRow).where(ToolCallRow.turn_id.in_(ids))
                         .order_by(ToolCallRow.turn_id, ToolCallRow.index)):
            v = call_view(tool_call_json(c, links.get(c.id)), numbers)
            v["mcp_unreached"] = unreached.get(c.id)
            out.setdefault(c.turn_id, []).append(v)
    return out


def _chain(db: DB, t: Turn) -> list[str]:
    return [] if t.chain_hash is None else [r[0] for r in db.exec(CHAIN_QUERY, params={"h": t.chain_hash})]


class Chains:
    """The message hashes of each turn's request, for a whole session page: the session's
    chain nodes are read in one query, and a turn's list is its parent's plus the few
    nodes after it. (A query per turn walked the whole chain each time: n² node visits,
    seconds for a 500-turn session.) A node of another session (a fork) is walked to by
    the recursive query from there."""

    def __init__(self, db: DB, session_id: str):
        self.db = db
        self.nodes = {h: (parent, m) for h, parent, m in db.exec(
            select(ChainNode.hash, ChainNode.parent, ChainNode.message_hash).where(ChainNode.session_id == session_id))}
        self.known: dict[str, list[str]] = {}

    def __call__(self, t: Turn) -> list[str]:
        if t.chain_hash is None:
            return []
        walked, h = [], t.chain_hash
        while h is not None and h not in self.known:
            node = self.nodes.get(h)
            if node is None:  # outside the session: the rest of the way in SQL
                self.known[h] = [r[0] for r in self.db.exec(CHAIN_QUERY, params={"h": h})]
                break
            walked.append(node[1])
            h = node[0]
        out = (self.known[h] if h is not None else []) + walked[::-1]
        self.known[t.chain_hash] = out
        return out


def _branch(t: Turn, siblings: list[int], numbers: dict[int, int]) -> dict | None:
    """A turn whose parent already had an earlier child is a retry or an edit."""
    if t.parent_id is None or len(siblings) < 2:
        return None
    n = siblings.index(t.id) + 1
    return {"parent": numbers.get(t.parent_id), "n": n, "of": len(siblings),
            "siblings": [numbers.get(i) for i in siblings]}


def turn_view(db: DB, reader: Reader, t: Turn, calls: list[dict], parent: Turn | None,
              blobs: dict[str, Any], chains: Chains | None = None) -> dict:
    def blob(h: str) -> Any:
        if h not in blobs:
            blobs[h] = reader.blob(db, h)
        return blobs[h]

    api = apis.by_name(t.api)
    summary = turn_summary(t, [c["name"] for c in calls])
    hashes = chains(t) if chains is not None else _chain(db, t)
    system = _system(db, reader, t, hashes, blobs)
    new_hashes = [h for h in hashes[_new_from(parent, hashes):] if not (system and h == system["hash"])]
    new_messages = [blob(h) for h in new_hashes]
    response = reader_response(t)
    decoding = t.decoding if isinstance(t.decoding, dict) else {}
    tokens_in, tokens_out = tokens(t.usage)
    return {
        **summary,
        "tokens_in": tokens_in, "tokens_out": tokens_out,
        "system": system,
        "input": segments(t.api, api, new_messages, decoding),
        "reasoning": reasoning(t.api, response),
        "text": transcript.response_text(t.api, response),
        "calls": calls,
        "decoding": decoding,
        "stream_error": t.stream_error,
        "upstream_message": upstream_message(response, t.stream_error) if t.status == "upstream_error" else None,
        # tooltap's own notes; the upstream's message has its box (older turns do not hold it in `error`)
        "error": _without(t.error, upstream_note(t.http_status, response, t.stream_error)),
    }


def _without(error: str | None, note: str | None) -> str | None:
    if not error or not note:
        return error
    return error.replace("; " + note, "").replace(note + "; ", "").replace(note, "") or None


def _system(db: DB, reader: Reader, t: Turn, hashes: list[str], blobs: dict[str, Any]) -> dict | None:
    """The turn's system prompt and the hash that identifies it: a blob of its own where
    the API keeps it outside the messages (Anthropic, Gemini, Responses), else the first
    message when its role is system or developer (OpenAI chat)."""
    def blob(h: str) -> Any:
        if h not in blobs:
            blobs[h] = reader.blob(db, h)
        return blobs[h]

    if t.system_hash is not None:
        return {"hash": t.system_hash, "text": system_text(blob(t.system_hash))}
    if hashes:
        first = blob(hashes[0])
        if isinstance(first, dict) and first.get("role") in ("system", "developer"):
            return {"hash": hashes[0], "text": transcript._text(first.get("content"))}
    return None


def system_text(value: Any) -> str:
    """The text of a stored system prompt, in whichever form its API keeps it: OpenAI
    chat's leading system/developer messages (a list of messages), Gemini's
    `systemInstruction` ({parts: [...]}), or Anthropic's string or text blocks."""
    if isinstance(value, list) and value and all(isinstance(m, dict) and "role" in m for m in value):
        return "\n\n".join(transcript._text(m.get("content")) for m in value)
    if isinstance(value, dict) and isinstance(value.get("parts"), list):
        return transcript._text(value["parts"])
    return transcript._text(value)


def reader_response(t: Turn) -> Any:
    from proxy.store import content
    return content.unpack(t.response)


def segments(api_name: str, api, messages: list[Any], decoding: dict) -> list[dict]:
    """The new input of a turn, one segment per text block or tool message, each with a
    kind: task, tool_result, tool_message, environment, reminder, error, text."""
    if api is None or not messages:
        return []
    request = {api.keys.messages: messages}
    reminders = [r for r in decoding.get("reminders") or [] if isinstance(r, dict)]
    env = decoding.get("environment") if isinstance(decoding.get("environment"), dict) else None
    out = []
    for m in transcript.messages(api_name, request):
        if m.role in ("assistant", "system"):
            continue  # the parent turn's reply is drawn on the parent
        for b in m.blocks:
            if b["type"] == "tool_result":
                out.append({"kind": "tool_message", "title": f"tool message for {b.get('id') or b.get('name')}",
                            "text": b.get("text") or "", "placeholder": (b.get("text") or "").strip() == "result missing"})
            elif b["type"] == "text":
                out.append(_text_segment(b["text"], reminders, env))
    return out


def _text_segment(text: str, reminders: list[dict], env: dict | None) -> dict:
    stripped = text.lstrip()
    if stripped.startswith("<task>"):
        body = stripped[len("<task>"):]
        body = body[: body.rfind("</task>")] if "</task>" in body else body
        return {"kind": "task", "title": "task", "text": body.strip()}
    if stripped.startswith("<environment_details>"):
        title = "environment details"
        if env:
            bits = [f"{env.get('mode')} MODE" if env.get("mode") else None,
                    (env.get("context_usage") or {}).get("raw"), env.get("time")]
            title += ": " + " · ".join(b for b in bits if b)
        return {"kind": "environment", "title": title, "text": text}
    m = RESULT_HEADER.match(stripped)
    if m:
        title = f"[{m.group(1)}" + (f" for '{m.group(2)}'" if m.group(2) is not None else "") + "] Result"
        return {"kind": "tool_result", "title": title, "text": stripped[m.end():].lstrip("\n")}
    if stripped.startswith("[ERROR]"):
        return {"kind": "error", "title": "error fed back to the model", "text": text}
    for r in reminders:
        if r.get("text") and (r["text"] in text or text.strip() in r["text"]):
            return {"kind": "reminder", "title": f"reminder: {r.get('kind')}", "text": text}
    return {"kind": "text", "title": "user", "text": text}


def call_view(c: dict, numbers: dict[int, int] | None = None) -> dict:
    """A tool call with what its card needs: decoded display name, arguments without
    task_progress (drawn apart as a checklist), and the place in the session (`numbers`)
    of the turn its MCP result went to."""
    d = c.get("decoded") or {}
    mcp = c.get("mcp")
    found = None
    if d.get("kind") != "mcp" and mcp and mcp.get("server"):
        # An agent built on the SDKs names the server's tools as they are: the name alone
        # says nothing, the recorded MCP call it became does. The stored decoding (tool_calls_v,
        # OTel) reads the name alone and says builtin: the card keeps that tag and says apart
        # what this page found, so the two never read as a contradiction.
        found = {"server": mcp["server"], "tool": mcp.get("tool") or c["name"], "matched_by": mcp.get("matched_by")}
        display = f"{found['server']} › {found['tool']}"
    elif d.get("kind") == "mcp" and d.get("server"):
        display = f"{d['server']} › {d.get('tool')}"
    elif d.get("kind") == "mcp":
        display = f"{d.get('uid') or '?'} › {d.get('tool')}"
    else:
        display = d.get("tool") or c["name"]
    args = c.get("arguments")
    shown = args
    if isinstance(args, dict) and c.get("task_progress") and "task_progress" in args:
        shown = {k: v for k, v in args.items() if k != "task_progress"}
    if mcp and numbers:
        mcp = {**mcp, "next_turn_n": numbers.get(mcp.get("next_turn_id"))}
    return {**c, "decoded": d or c.get("decoded"), "display_name": display, "mcp": mcp, "mcp_found": found,
            "arguments_pretty": pretty(shown) if args is not None else None}


def pretty(value: Any) -> str:
    return json.dumps(value, indent=2, ensure_ascii=False)


def tokens(usage: Any) -> tuple[int | None, int | None]:
    """(input, output) tokens in whichever names the provider used."""
    if not isinstance(usage, dict):
        return None, None
    for i, o in (("prompt_tokens", "completion_tokens"), ("input_tokens", "output_tokens"),
                 ("promptTokenCount", "candidatesTokenCount")):
        if i in usage or o in usage:
            return usage.get(i), usage.get(o)
    return None, None


def reasoning(api: str, response: Any) -> str:
    if not isinstance(response, dict):
        return ""
    if api == "anthropic.messages":
        return "\n".join(b.get("thinking") or "" for b in response.get("content") or []
                         if isinstance(b, dict) and b.get("type") == "thinking")
    if api == "openai.responses":
        out = []
        for item in response.get("output") or []:
            if isinstance(item, dict) and item.get("type") == "reasoning":
                out += [s.get("text") or "" for s in item.get("summary") or [] if isinstance(s, dict)]
                out += [s.get("text") or "" for s in item.get("content") or [] if isinstance(s, dict)]
        return "\n".join(out)
    if "candidates" in response:
        cands = response.get("candidates") or [{}]
        parts = ((cands[0] or {}).get("content") or {}).get("parts") or []
        return "".join(p.get("text") or "" for p in parts if isinstance(p, dict) and p.get("thought"))
    msg = ((response.get("choices") or [{}])[0] or {}).get("message") or {}
    value = msg.get("reasoning_content") or msg.get("reasoning") or ""
    return value if isinstance(value, str) else pretty(value)


# -- the chart -------------------------------------------------------------------------

CHART_W, CHART_H, PAD = 720, 120, 28
MAX_BARS = 180


def _mean(run: list[dict]) -> dict:
    """A run of turns as one bar: the mean of each figure; the bar links to the first."""
    def mean(key: str, digits: int | None = 1) -> float | None:
        values = [v[key] for v in run if v[key] is not None]
        return round(sum(values) / len(values), digits) if values else None

    return {"id": run[0]["id"], "label": f"turns {run[0]['n']}-{run[-1]['n']} (mean)",
            "tokens_in": mean("tokens_in", None), "tokens_out": mean("tokens_out", None),
            "ttft_ms": mean("ttft_ms"), "duration_ms": mean("duration_ms")}


def chart(views: list[dict]) -> dict | None:
    """Coordinates for an inline SVG: bars of input and output tokens per turn, lines of
    time to first byte and total latency. Computed here so the page needs no script."""
    if not views:
        return None
    size = -(-len(views) // MAX_BARS)
    if size > 1:  # a long session: one bar per run of turns, so the chart stays a few KB
        views = [_mean(views[i:i + size]) for i in range(0, len(views), size)]
    n = len(views)
    step = (CHART_W - 2 * PAD) / n
    max_tok = max((v["tokens_in"] or 0) + (v["tokens_out"] or 0) for v in views)  # 0: no token axis nor key
    max_ms = max([v["duration_ms"] or 0 for v in views] + [1])
    usable = CHART_H - PAD  # bars stand on a baseline PAD/2 above the bottom, PAD/2 headroom
    bars, total_pts, ttft_pts = [], [], []
    for i, v in enumerate(views):
        x = PAD + i * step
        ti, to = v["tokens_in"] or 0, v["tokens_out"] or 0
        h_in, h_out = usable * ti / (max_tok or 1), usable * to / (max_tok or 1)
        base = CHART_H - PAD / 2
        bars.append({"x": round(x + step * 0.15, 1), "w": round(max(step * 0.7, 1), 1),
                     "y_in": round(base - h_in, 1), "h_in": round(h_in, 1),
                     "y_out": round(base - h_in - h_out, 1), "h_out": round(h_out, 1),
                     "id": v["id"], "tip": f"{v.get('label') or 'turn ' + str(v['n'])}: "
                                           f"{f'{ti} in, {to} out tokens' if max_tok else 'no token counts'}; "
                                           f"ttft {v['ttft_ms']} ms, total {v['duration_ms']} ms"})
        cx = round(x + step / 2, 1)
        if v["duration_ms"] is not None:
            total_pts.append(f"{cx},{round(base - usable * v['duration_ms'] / max_ms, 1)}")
        if v["ttft_ms"] is not None:
            ttft_pts.append(f"{cx},{round(base - usable * v['ttft_ms'] / max_ms, 1)}")
    # One point makes no line: it is drawn as a dot. A series with no point is left out,
    # and so is its key.
    lines = [{"kind": kind, "label": label, "points": " ".join(pts),
              "dot": pts[0].split(",") if len(pts) == 1 else None}
             for kind, label, pts in (("total", "total latency", total_pts), ("ttft", "time to first byte", ttft_pts))
             if pts]
    return {"w": CHART_W, "h": CHART_H, "bars": bars, "lines": lines, "max_tok": max_tok or None,
            "max_ms": round(max_ms, 1)}
