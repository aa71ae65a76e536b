"""Server-rendered pages. Jinja2 autoescapes every template (see `templates`); captured
text is never marked safe."""

from __future__ import annotations

import json
import re
from pathlib import Path
from urllib.parse import quote, urlencode

from fastapi import APIRouter, HTTPException, Request
from fastapi.responses import Response
from fastapi.templating import Jinja2Templates
from jinja2 import Environment, FileSystemLoader, select_autoescape
from jinja2.filters import do_urlencode
from markupsafe import Markup

from proxy.store.read import MAX_ID, known_id

from . import bidi, replays, transcript
from .api import writer_health
from .curl import as_curl, request_file_name
from .longtext import clip, whole
from proxy.store.read import request_bytes, shown_time
from .queries import TURN_STATUSES, Filters, day
from .rawview import raw_view

router = APIRouter()
_env = Environment(loader=FileSystemLoader(str(Path(__file__).parent / "templates")),
                   autoescape=select_autoescape(default=True, default_for_string=True), finalize=bidi.shown)
templates = Jinja2Templates(env=_env)
# Ids in links are quoted whole, `/` too: the routes take them back as paths, and a session
# named `../../x` (a client's X-Tooltap-Session) must not lead its page's links out of it.
_env.filters["urlencode"] = lambda v: quote(v, safe="") if isinstance(v, str) else do_urlencode(v)
_env.filters["pretty"] = transcript.pretty
_env.filters["exact"] = bidi.exact
_env.filters["clip"] = clip
_env.filters["num"] = lambda v: "" if v is None else (f"{v:,}" if isinstance(v, int) else f"{v:,.1f}")
_env.globals["urlencode"] = urlencode


def as_date(value: str | None) -> str:
    """A value a date input can hold, else "": one it cannot hold warns in the browser's
    console (the page names the bad date itself)."""
    return value if re.fullmatch(r"\d{4}-\d{2}-\d{2}", value or "") and day(value) is not None else ""


_env.filters["as_date"] = as_date


def when(value) -> Markup | str:
    """A stored time as every page writes it (`shown_time`), in a <time> element that
    keeps the stored value."""
    if not value:
        return ""
    return Markup('<time datetime="{0}" title="{0}">{1}</time>').format(value, shown_time(value))


_env.filters["when"] = when


def usage_line(usage) -> str:
    """A provider's usage object in one line, nested counts by their path:
    `prompt_tokens 12 · completion_tokens 9 · prompt_tokens_details.cached_tokens 0`."""
    if not isinstance(usage, dict):
        return json.dumps(usage)

    def items(d: dict, prefix: str = ""):
        for k, v in d.items():
            if isinstance(v, dict):
                yield from items(v, f"{prefix}{k}.")
            elif v is not None:
                yield f"{prefix}{k} {v:,}" if isinstance(v, int) and not isinstance(v, bool) else f"{prefix}{k} {v}"

    return " · ".join(items(usage)) or "{}"


_env.filters["usage_line"] = usage_line


def _reader(request: Request):
    return request.app.state.reader


def _queries(request: Request):
    return request.app.state.queries


@router.get("/")
def sessions(request: Request, q: str = "", model: str = "", tool: str = "", server: str = "",
             status: str = "", since: str = "", until: str = "", after: str = ""):
    f = Filters(q=q.strip(), model=model, tool=tool, server=server, status=status, since=since, until=until)
    page = _queries(request).sessions_page(f, cursor=after or None)
    return templates.TemplateResponse(request, "sessions.html", {
        "page": page, "filters": f, "facets": _queries(request).facets(), "turn_statuses": TURN_STATUSES[1:],
        "total": _queries(request).session_count(), "after": after,
        # Why the newest turns may be missing from the list: what /api/health says.
        "store_problems": writer_health(request.app.state.tooltap.writer)["problems"],
    })


def session(request: Request, session_id: str, after: int | None = None):  # routed last, see the end of this file
    view = transcript.session_view(_reader(request), session_id, after=after)
    if view is None:  # (a live banner links to a session whose first turn is still streaming)
        raise HTTPException(404, f"no session {session_id}: a session appears once its first turn is stored, "
                                 "when that turn's answer ends")
    return templates.TemplateResponse(request, "session.html", {
        "s": view, "runs": replays.session_runs(request, session_id),
        "replay_command": replays.replay_command(request, session_id),
        "converters": replays.converter_replay_available()})


@router.get("/sessions/{session_id:path}/tools")
def tools(request: Request, session_id: str, after: int | None = None):
    if replays.session_exists(request, session_id + "/tools"):  # a session named so (X-Tooltap-Session)
        return session(request, session_id + "/tools", after)
    found = _queries(request).session_tools(session_id)
    s = _queries(request).session_summary(session_id)
    if found is None or s is None:
        raise HTTPException(404, f"no session {session_id}")
    return templates.TemplateResponse(request, "tools.html", {
        "s": s, "tools": found, "numbers": transcript.turn_numbers(_reader(request), session_id)})


@router.get("/turns/{turn_id}")
def turn(request: Request, turn_id: int):
    t = _reader(request).turn(turn_id)
    if t is None:
        raise HTTPException(404, f"no turn {turn_id}")
    body, _ctype, _enc = _reader(request).raw(turn_id)
    timeline = _reader(request).timeline(turn_id) or []
    curl = as_curl(t, str(request.base_url))
    numbers = transcript.turn_numbers(_reader(request), t["session_id"])
    return templates.TemplateResponse(request, "turn.html", {
        "t": t, "n": numbers.get(turn_id), "of": len(numbers), "parent_n": numbers.get(t.get("parent_id")),
        "curl": curl, "curl_file": curl.endswith("@" + request_file_name(t)),
        "raw": raw_view(body, timeline, t.get("duration_ms")),
        "calls": [transcript.call_view(c, numbers) for c in t["tool_calls"]],
    })


@router.get("/turns/{turn_id}/download")
def download(request: Request, turn_id: int):
    t = _reader(request).turn(turn_id)
    if t is None:
        raise HTTPException(404, f"no turn {turn_id}")
    return Response(json.dumps(t, indent=2, ensure_ascii=False), media_type="application/json",
                    headers={"content-disposition": f'attachment; filename="tooltap-turn-{turn_id}.json"'})


@router.get("/turns/{turn_id}/request")
def request_body(request: Request, turn_id: int):
    """The request body alone, as a file: what a long request's curl command reads."""
    t = _reader(request).turn(turn_id)
    if t is None:
        raise HTTPException(404, f"no turn {turn_id}")
    return Response(request_bytes(t), media_type="application/octet-stream",
                    headers={"content-disposition": f'attachment; filename="{request_file_name(t)}"'})


@router.get("/turns/{turn_id}/calls/{index}/result")
def call_result(request: Request, turn_id: int, index: int):
    """The whole result of one of the turn's tool calls, as text: where its card, which shows
    the start, links to. (It came in the next turn's request; this is exactly its text.)"""
    text = transcript.call_result(_reader(request), turn_id, index) \
        if known_id(turn_id) and 0 <= index <= MAX_ID else None
    if text is None:
        raise HTTPException(404, f"no result for call {index} of turn {turn_id}")
    return whole(text, f"tooltap-turn-{turn_id}-call-{index}-result.txt")


# -- fragments for live updates: the same templates, fetched by static/live.js ---------------

@router.get("/fragments/session-row/{session_id:path}")
def session_row(request: Request, session_id: str):
    s = _queries(request).session_summary(session_id)
    if s is None:
        raise HTTPException(404, f"no session {session_id}")
    return templates.TemplateResponse(request, "_session_row.html", {"s": s, "matched": None})


@router.get("/fragments/session-head/{session_id:path}")
def session_head(request: Request, session_id: str):
    """The session page's header (totals, times, chart), fetched again on each stored turn."""
    s = transcript.session_head(_reader(request), session_id)
    if s is None:
        raise HTTPException(404, f"no session {session_id}")
    return templates.TemplateResponse(request, "_session_head.html", {"s": s})


@router.get("/fragments/session-turns/{session_id:path}")
def session_turns(request: Request, session_id: str, after: int):
    """The next window of a long session's cards (static/windows.js fetches it into the page)."""
    view = transcript.session_view(_reader(request), session_id, after=after)
    if view is None:
        raise HTTPException(404, f"no session {session_id}")
    return templates.TemplateResponse(request, "_turns_window.html", {"s": view})


@router.get("/fragments/turn/{turn_id}")
def turn_fragment(request: Request, turn_id: int):
    v = transcript.one_turn_view(_reader(request), turn_id) if known_id(turn_id) else None
    if v is None:
        raise HTTPException(404, f"no turn {turn_id}")
    return templates.TemplateResponse(request, "_turn.html", {"v": v})


router.include_router(replays.page_router)  # /replays/{run_id}

# A session id is the client's X-Tooltap-Session and may hold '/' ("team/alice"): its
# page takes the rest of the path, so it comes after every /sessions/{id}/... route.
router.add_api_route("/sessions/{session_id:path}", session, methods=["GET"])
