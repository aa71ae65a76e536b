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
The other sessions' model calls of the same time are matched in the same pass, so two
agents that ask for the same call at once do not both claim one MCP call. Agents side by
side each have their own connection: a connection is a session's once a call proves it
(by id, or as the one MCP call that only this model call fits); among several fitting
calls, one on the session's own connection comes first, then one on a connection nobody
owns, then another session's, when none of that session's calls still waits for it.
The result is the decoders' pairing: the text the next turn gave the model for that
call, compared with what the server answered (same, truncated, changed).

Correlation is computed when read (for a session, with its contemporaries; for a
server's page, every session of its calls' time), so it needs nothing from the order in
which the LLM turns and the MCP messages reached the database.
"""

from __future__ import annotations

import json
import os
from bisect import bisect_left, bisect_right
from dataclasses import dataclass
from typing import Any

from sqlalchemy.orm import load_only
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


def correlate(llm: list[LlmCall], mcp: list[McpCall],
              known_servers: set[str]) -> tuple[dict[int, McpCall], dict[int, str]]:
    """Model call row id -> its MCP call, and how each was matched ("meta" or "arguments").
    `llm` in time order, every session's of the time: they compete for the same calls."""
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
    fits = _fits_by_call([c for c in llm if c.row_id not in found and c.arguments is not None], mcp, known_servers)
    askers: dict[int, list[LlmCall]] = {}
    for c in llm:
        for m in fits.get(c.row_id, ()):
            askers.setdefault(m.message_id, []).append(c)
    # Whose connection is whose: proven by an id, or by a call that only one MCP call
    # fits and that no other model call fits. Agents side by side each have their own.
    owners: dict[str, set[str]] = {}
    for c in llm:
        m = found.get(c.row_id)
        if m is None and len(fits.get(c.row_id, ())) == 1 and len(askers[fits[c.row_id][0].message_id]) == 1:
            m = fits[c.row_id][0]
        if m is not None:
            owners.setdefault(m.connection, set()).add(c.session)
    for c in llm:
        free = [m for m in fits.get(c.row_id, ()) if m.message_id not in taken]
        if not free:
            continue
        mine = [m for m in free if c.session in owners.get(m.connection, ())]
        unowned = [m for m in free if not owners.get(m.connection)]
        # Another session's connection only when none of its sessions still waits for that call.
        theirs = [m for m in free if not any(a.session in owners.get(m.connection, ()) and a.row_id not in found
                                             for a in askers[m.message_id] if a is not c)]
        pick = next(iter(mine or unowned or theirs), None)
        if pick is None:
            continue
        found[c.row_id], how[c.row_id] = pick, "arguments"
        taken.add(pick.message_id)
        owners.setdefault(pick.connection, set()).add(c.session)
    return found, how


def _fits_by_call(llm: list[LlmCall], mcp: list[McpCall], known_servers: set[str]) -> dict[int, list[McpCall]]:
    """Each model call's candidates, in time order: the MCP calls of its tool sent while it
    was due (found by bisection: many sessions' calls are compared at once), to its server
    when that is a recorded one, with the same arguments less what the agent adds."""
    by_tool: dict[str, list[McpCall]] = {}
    for m in sorted(mcp, key=lambda m: (m.request_at, m.message_id)):
        by_tool.setdefault(m.tool, []).append(m)
    starts = {tool: [m.request_at for m in calls] for tool, calls in by_tool.items()}
    out: dict[int, list[McpCall]] = {}
    for c in llm:
        calls = by_tool.get(c.tool)
        if not calls:
            continue
        due = c.next_turn_at if c.next_turn_at is not None else c.turn_end + DISPATCH_SECONDS
        window = calls[bisect_left(starts[c.tool], c.turn_started):bisect_right(starts[c.tool], due)]
        want = without_added(c.arguments)
        strict = c.server in known_servers
        hits = [m for m in window if (not strict or m.server == c.server) and without_added(m.arguments) == want]
        if hits:
            out[c.row_id] = hits
    return out


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

# Only what placing a call in time needs: a turn's row holds its whole answer besides.
_TURNS = select(Turn).options(load_only(Turn.id, Turn.session_id, Turn.parent_id, Turn.status, Turn.started_at,
                                        Turn.duration_ms))


def for_session(db: DB, session_id: str) -> Correlation:
    if not _any_mcp(db):  # before reading every turn of the session: most stores have no MCP traffic
        return Correlation({}, [], [])
    turns = db.exec(_TURNS.where(Turn.session_id == session_id).order_by(Turn.id)).all()
    return _for_turns(db, turns)


def links_for_turn(db: DB, turn: Turn) -> dict[int, dict]:
    """The `mcp` field of each of this turn's tool calls (by tool_calls.id)."""
    if db.exec(select(ToolCallRow.id).where(ToolCallRow.turn_id == turn.id).limit(1)).first() is None \
            or not _any_mcp(db):
        return {}  # no tool call in this turn, or no MCP traffic recorded: nothing to correlate
    turns = db.exec(_TURNS.where(Turn.session_id == turn.session_id).order_by(Turn.id)).all()
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
    others = [c for c in _llm_calls(db, _turns_asking(db, mcp, besides=turns[0].session_id)) if c.turn_id not in mine]
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


def asked_by(db: DB, mcp: list[McpCall]) -> dict[int, tuple[LlmCall, dict]]:
    """MCP request message id -> the model call it ran and their link,
    every session of the calls' time matched in one pass (an MCP server's page)."""
    if not mcp:
        return {}
    llm = _llm_calls(db, _turns_asking(db, mcp))
    if not llm:
        return {}
    known = {m.server for m in mcp} | _servers_alive(db, llm[0].turn_started, max(c.turn_end for c in llm))
    found, how = correlate(llm, mcp, known)
    return {found[c.row_id].message_id: (c, link_json(c, found[c.row_id], how[c.row_id]))
            for c in llm if c.row_id in found}


def _turns_asking(db: DB, mcp: list[McpCall], besides: str | None = None) -> list[Turn]:
    """The turns (but session `besides`'s) that may have asked for one of these MCP calls
    (a tool call whose name ends with the tool's: each agent's MCP naming does), and the
    turns that carried their results."""
    tools = {m.tool for m in mcp}
    if not tools:
        return []
    named = or_(*(ToolCallRow.name.endswith(tool, autoescape=True) for tool in tools))
    asking = (select(ToolCallRow.turn_id).join(Turn, Turn.id == ToolCallRow.turn_id)
              .where(named, Turn.started_at >= min(m.request_at for m in mcp) - SLACK_SECONDS,
                     Turn.started_at <= max(m.request_at for m in mcp)))
    if besides is not None:
        asking = asking.where(Turn.session_id != besides)
    asked = db.exec(_TURNS.where(Turn.id.in_(asking))).all()
    if not asked:
        return []
    carried = db.exec(_TURNS.where(Turn.parent_id.in_([t.id for t in asked]))).all()
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
