"""Tie each MCP `tools/call` to the model's tool call it executes, and its result to what
the agent told the model.

A tools/call does not carry the model's tool-call id, so the link is made from what both
sides show. An id in `params._meta` equal to the model's call id wins. Otherwise a model
call takes the first MCP call not yet taken that
- names the same tool, on the server the call's name decodes to (when that server is
  not a recorded one, say a Cline uid not resolved, the tool name alone is enough; so
  too for a call whose name is no MCP one: an agent that offers the server's tools to
  the model under their own names),
- has the same arguments once what the agent adds is left out (Cline's `task_progress`),
- was sent after the turn that emitted the call started (an agent may run a call once its
  part of the stream is whole) and before the next turn of the session (the one that
  carries its result) started; with no next turn, within DISPATCH_SECONDS of the end of
  the turn's answer (nothing then says the agent ran the call at all: only that an agent
  runs a call the moment the answer ends).
Among several such calls, one on a connection this session's calls already went through
comes first: two agents side by side each have their own. And the other sessions' model
calls of the same time are matched in the same pass, so two agents that ask for the same
call at once do not both claim one MCP call and leave the other unasked.
The result is the decoders' pairing: the text the next turn gave the model for that
call, compared with what the server answered (same, truncated, changed).

Correlation is computed when read, per session, so it needs nothing from the order in
which the LLM turns and the MCP messages reached the database.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from typing import Any

from sqlmodel import Session as DB, or_, select

from ..store.models import McpConnection, McpMessage, ToolCallRow, Turn
from ..store.read import iso
from .read import McpCall, calls as mcp_calls

AGENT_ADDED = ("task_progress",)  # Cline 3.x adds its checklist to tool calls, MCP ones included
SLACK_SECONDS = 3600.0  # a tool may run long after the last turn of the window started
UNASKED_AFTER = 60.0  # an MCP call this long after the session's last turn ended is not its business
# A call with no next turn: how long after the answer ended an MCP call can still be the
# one it became. Agents send it at once (milliseconds in the captures; a server started
# on first use, a few seconds); one 26 s later was another client's. A user's approval
# can take longer: the link is made once the turn carrying the result is stored.
DISPATCH_SECONDS = 15.0


@dataclass
class LlmCall:
    row_id: int
    turn_id: int
    index: int
    call_id: str | None
    server: str | None
    tool: str
    arguments: Any
    result: dict | None
    turn_started: float
    turn_end: float
    model_ms: float | None
    next_turn_id: int | None
    next_turn_at: float | None
    session: str = ""


@dataclass
class Correlation:
    links: dict[int, dict]  # tool_calls.id -> the turn API's `mcp` field
    unreached: list[dict]  # model calls of a recorded server that never reached it
    unasked: list[McpCall]  # MCP calls in the session's time that no model call asked for

    def to_json(self) -> dict:
        return {"links": [{"tool_call": k, **v} for k, v in self.links.items()],
                "unreached": self.unreached, "unasked": [c.to_json() for c in self.unasked]}


def without_added(arguments: Any) -> Any:
    if isinstance(arguments, dict):
        return {k: v for k, v in arguments.items() if k not in AGENT_ADDED}
    return arguments


def meta_ids(meta: Any) -> set[str]:
    """Every string in a request's `_meta` (one level of nesting), where an agent would
    put the model's tool-call id."""
    out: set[str] = set()
    for value in (meta.values() if isinstance(meta, dict) else ()):
        if isinstance(value, str):
            out.add(value)
        elif isinstance(value, dict):
            out.update(v for v in value.values() if isinstance(v, str))
    return out


def compare_result(agent_text: str | None, mcp_text: str | None) -> str | None:
    """"same", "truncated" (the agent kept the start), "changed", or None (nothing to
    compare: no result text on one side)."""
    if agent_text is None or mcp_text is None:
        return None
    a, m = agent_text.strip(), mcp_text.strip()
    if a == m or " ".join(a.split()) == " ".join(m.split()):
        return "same"
    common = len(os.path.commonprefix([a, m]))
    # Truncated: all of the agent's text but a short note at its end (at most 200
    # characters, or a fifth of it) is the start of the server's.
    if len(a) < len(m) and common >= max(1, len(a) * 0.8, len(a) - 200):
        return "truncated"
    return "changed"


def correlate(llm: list[LlmCall], mcp: list[McpCall], known_servers: set[str]) -> tuple[dict[int, McpCall], dict[int, str]]:
    """Model call row id -> its MCP call, and how each was matched ("meta" or "arguments")."""
    taken: set[int] = set()
    found: dict[int, McpCall] = {}
    how: dict[int, str] = {}
    by_call_id = {c.call_id: c for c in llm if c.call_id}
    for m in mcp:  # an id the agent passed along is proof
        for ident in meta_ids(m.meta):
            c = by_call_id.get(ident)
            if c is not None and c.row_id not in found:
                found[c.row_id], how[c.row_id] = m, "meta"
                taken.add(m.message_id)
                break
    used: dict[str, set[str]] = {}  # session -> the MCP connections its calls went through
    for c in llm:
        if c.row_id in found:
            used.setdefault(c.session, set()).add(found[c.row_id].connection)
    for c in llm:
        if c.row_id in found or c.arguments is None:
            continue
        fits = [m for m in mcp if m.message_id not in taken and _fits(c, m, known_servers)]
        if not fits:
            continue
        mine = used.setdefault(c.session, set())
        m = next((m for m in fits if m.connection in mine), fits[0])
        found[c.row_id], how[c.row_id] = m, "arguments"
        taken.add(m.message_id)
        mine.add(m.connection)
    return found, how


def _fits(c: LlmCall, m: McpCall, known_servers: set[str]) -> bool:
    """Could `m` be the run of model call `c`: the same tool and arguments, sent while due."""
    if m.tool != c.tool or (c.server in known_servers and m.server != c.server):
        return False
    due = c.next_turn_at if c.next_turn_at is not None else c.turn_end + DISPATCH_SECONDS
    return c.turn_started <= m.request_at <= due and without_added(m.arguments) == without_added(c.arguments)


def link_json(c: LlmCall, m: McpCall, matched_by: str) -> dict:
    agent_text = (c.result or {}).get("text") if isinstance(c.result, dict) else None
    match = compare_result(agent_text, m.result_text)
    if match is None and agent_text is None and c.next_turn_id is None:
        match = "pending"
    flags = []
    if m.undeclared:
        flags.append({"kind": "undeclared_arguments",
                      "message": f"the server got {', '.join(m.undeclared)}, which its tools/list never declared"})
    if m.error is not None:
        flags.append({"kind": "jsonrpc_error", "message": f"the server answered with an error: {m.result_text}"})
    elif m.is_error:
        flags.append({"kind": "tool_error", "message": "the server answered isError: true"})
    if m.result_at is None:
        flags.append({"kind": "no_answer", "message": "no answer from the server was recorded"})
    if match in ("changed", "truncated"):
        flags.append({"kind": f"result_{match}",
                      "message": f"the agent {match} the server's result before giving it to the model"})
    end_ms = lambda a, b: None if a is None or b is None else round((b - a) * 1000, 3)  # noqa: E731
    return {
        "message_id": m.message_id, "server": m.server, "request_at": iso(m.request_at),
        "result_at": iso(m.result_at), "is_error": m.is_error, "result_text": m.result_text,
        "undeclared_arguments": list(m.undeclared),
        # more than the contract: what the inspector's chain shows
        "result_message_id": m.result_message_id, "jsonrpc_id": json.loads(m.jsonrpc_id), "tool": m.tool,
        "connection": m.connection,
        "arguments": m.arguments, "error": m.error, "schema_known": m.schema_known, "matched_by": matched_by,
        "result_match": match, "agent_text": agent_text, "next_turn_id": c.next_turn_id, "flags": flags,
        "timings": {"model_ms": c.model_ms, "dispatch_ms": end_ms(c.turn_end, m.request_at),
                    "tool_ms": m.latency_ms, "agent_delay_ms": end_ms(m.result_at, c.next_turn_at)},
    }


# -- from the database -----------------------------------------------------------------------

def for_session(db: DB, session_id: str) -> Correlation:
    if not _any_mcp(db):  # before reading every turn of the session: most stores have no MCP traffic
        return Correlation({}, [], [])
    turns = db.exec(select(Turn).where(Turn.session_id == session_id).order_by(Turn.id)).all()
    return _for_turns(db, turns)


def links_for_turn(db: DB, turn: Turn) -> dict[int, dict]:
    """The `mcp` field of each of this turn's tool calls (by tool_calls.id)."""
    if db.exec(select(ToolCallRow.id).where(ToolCallRow.turn_id == turn.id).limit(1)).first() is None \
            or not _any_mcp(db):
        return {}  # no tool call in this turn, or no MCP traffic recorded: nothing to correlate
    turns = db.exec(select(Turn).where(Turn.session_id == turn.session_id).order_by(Turn.id)).all()
    return _for_turns(db, turns, only_turn=turn.id).links


def _any_mcp(db: DB) -> bool:
    return db.exec(select(McpMessage.id).limit(1)).first() is not None


def _for_turns(db: DB, turns: list[Turn], only_turn: int | None = None) -> Correlation:
    empty = Correlation({}, [], [])
    if not turns or not _any_mcp(db):
        return empty
    llm = _llm_calls(db, turns)
    start = min(t.started_at for t in turns)
    last_end = max(_end(t) for t in turns)
    mcp = mcp_calls(db, since=start - 1.0, until=last_end + SLACK_SECONDS)
    if not llm and not mcp:
        return empty
    known = {m.server for m in mcp} | _servers_alive(db, start, last_end)
    mine = {t.id for t in turns}
    others = [c for c in _llm_calls(db, _rival_turns(db, turns[0].session_id, mcp)) if c.turn_id not in mine]
    found, how = correlate(sorted(llm + others, key=_in_time), mcp, known)
    links = {c.row_id: link_json(c, found[c.row_id], how[c.row_id]) for c in llm
             if c.row_id in found and (only_turn is None or c.turn_id == only_turn)}
    if only_turn is not None:
        return Correlation(links, [], [])
    taken = {m.message_id for m in found.values()}  # another session's calls too: not unasked here
    unasked = [m for m in mcp if m.message_id not in taken and m.request_at <= last_end + UNASKED_AFTER]
    unreached = [{"tool_call": c.row_id, "turn_id": c.turn_id, "index": c.index, "server": c.server,
                  "tool": c.tool, "reason": _why_unreached(c)}
                 for c in llm if c.row_id not in found and _tapped(db, c)]
    return Correlation(links, unreached, unasked)


def _rival_turns(db: DB, session_id: str, mcp: list[McpCall]) -> list[Turn]:
    """The other sessions' turns that may have asked for one of these MCP calls (a tool
    call whose name ends with the tool's: each agent's MCP naming does), and the turns
    that carried their results."""
    tools = {m.tool for m in mcp}
    if not tools:
        return []
    named = or_(*(ToolCallRow.name.endswith(tool, autoescape=True) for tool in tools))
    asking = (select(ToolCallRow.turn_id).join(Turn, Turn.id == ToolCallRow.turn_id)
              .where(Turn.session_id != session_id, named,
                     Turn.started_at >= min(m.request_at for m in mcp) - SLACK_SECONDS,
                     Turn.started_at <= max(m.request_at for m in mcp)))
    asked = db.exec(select(Turn).where(Turn.id.in_(asking))).all()
    if not asked:
        return []
    carried = db.exec(select(Turn).where(Turn.parent_id.in_([t.id for t in asked]))).all()
    return list({t.id: t for t in [*asked, *carried]}.values())


def _in_time(c: LlmCall) -> tuple:
    return c.turn_started, c.turn_id, c.index


def _end(t: Turn) -> float:
    return t.started_at + (t.duration_ms or 0.0) / 1000


def _llm_calls(db: DB, turns: list[Turn]) -> list[LlmCall]:
    if not turns:
        return []
    by_id = {t.id: t for t in turns}
    children: dict[int, list[Turn]] = {}
    for t in turns:  # the turns that carry this one's results: more than one when the agent retried
        if t.parent_id is not None:
            children.setdefault(t.parent_id, []).append(t)
    rows = db.exec(select(ToolCallRow).where(ToolCallRow.turn_id.in_(list(by_id)))
                   .order_by(ToolCallRow.turn_id, ToolCallRow.index)).all()
    out = []
    for r in rows:
        d = r.decoded if isinstance(r.decoded, dict) else {}
        mcp = d.get("kind") == "mcp"
        tool = d.get("tool") if mcp else r.name  # not an MCP name: the server's tool under its own
        if not tool:
            continue
        t, sent, answered = by_id[r.turn_id], *_next_turns(children.get(r.turn_id, []))
        out.append(LlmCall(r.id, t.id, r.index, r.call_id, d.get("server") if mcp else None, tool, r.arguments,
                           r.result if isinstance(r.result, dict) else None, t.started_at, _end(t),
                           t.duration_ms, answered.id if answered else None, sent.started_at if sent else None,
                           t.session_id))
    return sorted(out, key=_in_time)


def _next_turns(children: list[Turn]) -> tuple[Turn | None, Turn | None]:
    """The turn that first carried the results to the model, and the one the model
    answered: a request the upstream refused (a 503) and the agent sent again gave the
    model nothing, so the chain leads to the retry."""
    if not children:
        return None, None
    answered = next((c for c in children if c.status == "ok"), children[0])
    return children[0], answered


def _servers_alive(db: DB, start: float, end: float, slack: float = UNASKED_AFTER) -> set[str]:
    """The servers recorded at some time from `start` to `slack` seconds after `end`."""
    rows = db.exec(select(McpConnection.server).where(McpConnection.started_at <= end + slack)
                   .where((McpConnection.ended_at.is_(None)) | (McpConnection.ended_at >= start))).all()
    return set(rows)


def _tapped(db: DB, c: LlmCall) -> bool:
    """Was the call's server recorded while the call was due (a connection to it open
    before the next turn)? Only then is a missing MCP request news: one recorded a little
    later, for another session, says nothing about this call."""
    return c.server in _servers_alive(db, c.turn_started, c.next_turn_at or c.turn_end, slack=0.0)


def _why_unreached(c: LlmCall) -> str:
    text = (c.result or {}).get("text") if isinstance(c.result, dict) else None
    if text and "denied" in text.lower():
        return "the user denied it: the agent never sent it to the server"
    if c.next_turn_id is None:
        return "no MCP request recorded (no later turn yet)"
    return "no MCP request recorded: the agent answered the model without calling the server"
