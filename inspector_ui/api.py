"""The JSON read API (DESIGN.md, "Read API"): stable field names, newest first where it matters."""

from __future__ import annotations

import asyncio
import time

from fastapi import APIRouter, HTTPException, Query, Request, Response
from fastapi.concurrency import run_in_threadpool
from fastapi.responses import JSONResponse

from proxy.store.read import MAX_ID, json_bytes

from . import replays


class CapturedJSON(JSONResponse):
    """Captured values can hold what strict JSON cannot (NaN in a model's tool arguments,
    lone surrogates): written so that any client reads them, never a 500."""

    def render(self, content) -> bytes:
        return json_bytes(content)


router = APIRouter(default_response_class=CapturedJSON)


def id_sized(name: str, value: int | None) -> None:
    if value is not None and abs(value) > MAX_ID:
        raise HTTPException(400, f"{name}={value}: ids stop at 2^63-1")


def _reader(request: Request):
    return request.app.state.reader


@router.get("/sessions")
def sessions(request: Request, limit: int = Query(100, ge=1, le=1000), offset: int = Query(0, ge=0)):
    if offset > MAX_ID:  # SQL cannot bind more
        raise HTTPException(400, f"offset={offset}: an offset is how many sessions to skip, 0 to 2^63-1")
    return {"sessions": _reader(request).sessions(limit=limit, offset=offset)}


def session(request: Request, session_id: str):  # routed last, see the end of this file
    found = _reader(request).session(session_id)
    if found is None:
        raise HTTPException(404, f"no session {session_id}")
    return found


@router.get("/turns")
def turns(request: Request, limit: int = Query(50, ge=1, le=1000), before: int | None = None):
    id_sized("before", before)
    return {"turns": _reader(request).turns(limit=limit, before=before)}


@router.get("/turns/uid/{uid}")
async def turn_by_uid(request: Request, uid: str, wait: float = Query(0, ge=0, le=30)):
    """The turn an X-Tooltap-Turn response header named (serve --turn-header), waiting up
    to `wait` seconds for it to be stored (a moment after its answer ends)."""
    reader = _reader(request)
    deadline = time.monotonic() + wait
    while (turn_id := await run_in_threadpool(reader.turn_id_by_uid, uid)) is None:
        if time.monotonic() >= deadline:
            raise HTTPException(404, f"no turn with uid {uid}" + (f" after {wait:g} s" if wait else ""))
        await asyncio.sleep(0.05)
    return await run_in_threadpool(reader.turn, turn_id)


@router.get("/turns/{turn_id}")
def turn(request: Request, turn_id: int):
    found = _reader(request).turn(turn_id)
    if found is None:
        raise HTTPException(404, f"no turn {turn_id}")
    return found


@router.get("/turns/{turn_id}/raw")
def raw(request: Request, turn_id: int):
    found = _reader(request).raw(turn_id)
    if found is None:
        raise HTTPException(404, f"no turn {turn_id}")
    body, content_type, encoding = found
    headers = {"content-encoding": encoding} if encoding else {}
    content_type = content_type or "application/octet-stream"
    if any(kind in content_type.lower() for kind in _ACTIVE):
        # Captured HTML or script must never run on the inspector's origin, even through
        # a <script src> of another captured page: served as text, the type kept aside.
        headers["x-tooltap-content-type"] = content_type
        content_type = "text/plain; charset=utf-8"
    # As a header, not a media type: Starlette would add a charset to a text/ type.
    return Response(body, headers={**headers, "content-type": content_type})


_ACTIVE = ("html", "javascript", "ecmascript", "xml", "svg", "css")


@router.get("/turns/{turn_id}/timeline")
def timeline(request: Request, turn_id: int):
    found = _reader(request).timeline(turn_id)
    if found is None:
        raise HTTPException(404, f"no turn {turn_id}")
    return {"timeline": [{"offset": o, "ms": ms} for o, ms in found]}


@router.get("/stats")
def stats(request: Request, days: int = Query(7, ge=1, le=366)):
    """What `tooltap stats --json` prints: totals, database size, turns and bytes per UTC day."""
    from proxy.store.stats import store_stats

    return store_stats(_reader(request).engine, days=days).to_json()


STALLED_AFTER = 5.0  # seconds with turns waiting and none stored


@router.get("/health")
def health(request: Request):
    """The writer's backlog (turns not yet in the database), the bytes waiting on disk
    (journal and spool) and its recent rate; "degraded", with the problems in one line
    each, while turns can only wait in memory, no writer runs, or none has been stored
    for a while."""
    return writer_health(request.app.state.tooltap.writer)


def writer_health(writer) -> dict:
    stats = writer.health() if hasattr(writer, "health") else {}
    problems = []
    if stats.get("held_in_memory"):
        problems.append(f"{stats['held_in_memory']} turn(s) held in memory: the journal's disk cannot be written")
    if stats.get("alive") is False:
        problems.append("the writer process is not running")
    if stats.get("stalled_s", 0) >= STALLED_AFTER:
        problems.append(f"{stats['backlog']} turn(s) waiting and none stored for {stats['stalled_s']:.0f} s: the "
                        "database is locked or slow, or the writer is storing a very large turn")
    return {"status": "degraded" if problems else "ok", "problems": problems, "writer": stats}


@router.get("/search")
def search(request: Request, q: str = "", model: str = "", tool: str = "", server: str = "",
           status: str = "", since: str = "", until: str = "", after: str | None = None,
           limit: int = Query(50, ge=1, le=1000)):
    """Sessions matching a full-text query and filters, newest first; `next` pages on."""
    from .queries import Filters

    f = Filters(q=q.strip(), model=model, tool=tool, server=server, status=status, since=since, until=until)
    page = request.app.state.queries.sessions_page(f, cursor=after, limit=limit)
    return {"sessions": page.sessions, "next": page.next_cursor, "matched": page.matched_by,
            "note": page.search_note}


router.include_router(replays.api_router)  # /sessions/{id}/replays (GET, POST), /replays/{run_id}

# A session id is the client's X-Tooltap-Session and may hold '/' ("team/alice"): its
# entry takes the rest of the path, so it comes after every /sessions/{id}/... route.
router.add_api_route("/sessions/{session_id:path}", session, methods=["GET"])
