"""The MCP pages: every recorded server (`/_tooltap/mcp`), one server (`/_tooltap/mcp/NAME`:
its tools/list over time, calls with the model call each executed, errors, latency,
runs), and what a session page's tool-call cards need to draw their MCP chain (`marks`)."""

from __future__ import annotations

import statistics

from fastapi import APIRouter, HTTPException, Request
from sqlmodel import Session as DB, select

from proxy.mcp import read
from proxy.mcp.correlate import SLACK_SECONDS, for_session, links_for_turn
from proxy.store.models import Session

router = APIRouter()
SESSIONS_SCANNED = 50  # sessions whose time overlaps the calls shown, correlated to name their turns


def marks(db: DB, session_id: str) -> tuple[dict[int, dict], dict[int, str]]:
    """For a session page's tool-call cards: the MCP link of each call (by tool_calls.id),
    and why a call of a recorded server never reached it."""
    found = for_session(db, session_id)
    return found.links, {u["tool_call"]: u["reason"] for u in found.unreached}


def turn_links(db: DB, turn) -> dict[int, dict]:
    return links_for_turn(db, turn)


def _latency(calls: list[read.McpCall]) -> dict:
    ms = sorted(c.latency_ms for c in calls if c.latency_ms is not None)
    if not ms:
        return {"count": 0, "median_ms": None, "p95_ms": None, "max_ms": None}
    return {"count": len(ms), "median_ms": round(statistics.median(ms), 3),
            "p95_ms": ms[min(len(ms) - 1, int(len(ms) * 0.95))], "max_ms": ms[-1]}


def _asked_by(db: DB, calls: list[read.McpCall]) -> dict[int, dict]:
    """MCP request id -> the model call it executed, over the sessions active meanwhile."""
    from .transcript import numbers_in  # (transcript imports this module)

    if not calls:
        return {}
    lo, hi = min(c.request_at for c in calls), max(c.request_at for c in calls)
    sessions = db.exec(select(Session.id).where(Session.started_at <= hi, Session.last_at >= lo - SLACK_SECONDS)
                       .order_by(Session.last_at.desc()).limit(SESSIONS_SCANNED)).all()
    out: dict[int, dict] = {}
    for sid in sessions:
        for row_id, link in for_session(db, sid).links.items():
            out.setdefault(link["message_id"], {"session_id": sid, "tool_call": row_id,
                                                "matched_by": link["matched_by"],
                                                "result_match": link["result_match"]})
    turns = _turn_of(db, [v["tool_call"] for v in out.values()])
    places = {sid: numbers_in(db, sid) for sid in {v["session_id"] for v in out.values()}}
    for v in out.values():
        v["turn_id"] = turns.get(v["tool_call"])
        v["turn_n"] = places[v["session_id"]].get(v["turn_id"])  # its place in its session, as pages name it
    return out


def _turn_of(db: DB, row_ids: list[int]) -> dict[int, int]:
    from proxy.store.models import ToolCallRow

    if not row_ids:
        return {}
    return dict(db.exec(select(ToolCallRow.id, ToolCallRow.turn_id).where(ToolCallRow.id.in_(row_ids))).all())


def server_report(db: DB, name: str, limit: int = 200) -> dict | None:
    summary = next((s for s in read.servers(db) if s["name"] == name), None)
    if summary is None:
        return None
    sets = read.tool_sets(db, name)
    previous: dict[str, dict] = {}
    for s in sets:  # what changed from one tools/list answer to the next
        now = {t.get("name"): t for t in s["tools"] or [] if isinstance(t, dict)}
        s["tool_names"] = sorted(n for n in now if isinstance(n, str))
        s["added"] = sorted(n for n in now if n not in previous) if previous else []
        s["removed"] = sorted(n for n in previous if n not in now)
        s["changed"] = sorted(n for n in now if n in previous and now[n] != previous[n])
        s["source"] = f"mcp:{name}@{s['id']}"
        previous = now
        s.pop("first_seen_ts", None)
    calls = read.calls(db, server=name, limit=limit, newest_first=True)
    asked = _asked_by(db, calls)
    # The newest session that called this server: what its agent offered the model, to compare.
    offered_in = next((asked[c.message_id]["session_id"] for c in calls if c.message_id in asked), None)
    return {
        **summary, "latency": _latency(calls), "tool_sets": sets, "offered_in": offered_in,
        "recent_calls": [{**c.to_json(), "asked_by": asked.get(c.message_id)} for c in calls],
        "connections": read.connections(db, name),
    }


@router.get("/mcp")
def servers_page(request: Request):
    from .pages import templates

    with DB(request.app.state.reader.engine) as db:
        found = read.servers(db)
    return templates.TemplateResponse(request, "mcp_servers.html", {"servers": found})


@router.get("/mcp/{name}")
def server_page(request: Request, name: str):
    from .pages import templates

    with DB(request.app.state.reader.engine) as db:
        report = server_report(db, name)
        recent = read.messages(db, server=name, limit=50) if report else []
    if report is None:
        raise HTTPException(404, f"no MCP server {name}")
    return templates.TemplateResponse(request, "mcp_server.html", {"r": report, "recent": recent})
