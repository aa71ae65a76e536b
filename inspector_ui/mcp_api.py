"""The MCP tap's JSON API (DESIGN.md, "Contracts added in round two").

    GET /_tooltap/api/mcp/servers                     {"servers": [{name, messages, calls, errors, ...}]}
    GET /_tooltap/api/mcp/messages?server=&limit=&before=   {"messages": [...]}, newest first, without `raw`
    GET /_tooltap/api/mcp/messages/{id}               one message, `raw` (its exact text) included
    GET /_tooltap/api/mcp/servers/{name}              the counts, latency, tool sets over time, recent
                                                      calls (with the model call each executes), runs
    GET /_tooltap/api/mcp/sessions/{id}               the session's correlation: links, model calls
                                                      that never reached a server, MCP calls no turn asked for
"""

from __future__ import annotations

from fastapi import APIRouter, HTTPException, Query, Request
from sqlmodel import Session as DB

from proxy.mcp import read
from proxy.store.read import MAX_ID

from .api import CapturedJSON, id_sized

router = APIRouter(default_response_class=CapturedJSON)


def _db(request: Request) -> DB:
    return DB(request.app.state.reader.engine)


@router.get("/mcp/servers")
def servers(request: Request):
    with _db(request) as db:
        return {"servers": read.servers(db)}


@router.get("/mcp/messages")
def messages(request: Request, server: str | None = None, limit: int = Query(100, ge=1, le=1000),
             before: int | None = None, connection: str | None = None):
    id_sized("before", before)  # as /turns answers it: a 400 that says why
    with _db(request) as db:
        # Each item has `json` but not `raw`, its body a second time (a 400 KB tool result
        # made a list twice as big), unless it is not JSON; one message has the exact text.
        return {"messages": read.messages(db, server=server, limit=limit, before=before, connection=connection,
                                          raw=False)}


@router.get("/mcp/messages/{message_id}")
def message(request: Request, message_id: int):
    found = None
    if 0 < message_id <= MAX_ID:
        with _db(request) as db:
            found = read.message(db, message_id)
    if found is None:
        raise HTTPException(404, f"no MCP message {message_id}")
    return found


@router.get("/mcp/servers/{name:path}")
def server(request: Request, name: str, limit: int = Query(200, ge=1, le=2000)):
    from .mcp_pages import server_report

    with _db(request) as db:
        found = server_report(db, name, limit)
    if found is None:
        raise HTTPException(404, f"no MCP server {name}")
    return found


@router.get("/mcp/sessions/{session_id:path}")
def session(request: Request, session_id: str):
    from proxy.mcp.correlate import for_session
    from proxy.store.models import Session

    with _db(request) as db:
        if db.get(Session, session_id) is None:
            raise HTTPException(404, f"no session {session_id}")
        return {"session_id": session_id, **for_session(db, session_id).to_json()}
