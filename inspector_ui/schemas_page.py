"""`/_tooltap/schemas`: two stored tool sets side by side, their semantic diff, and what
each provider's format would lose from the second one (proxy.schemas does the work)."""

from __future__ import annotations

from fastapi import APIRouter, Request

from proxy.schemas.convert import TARGETS, convert_tools
from proxy.schemas.diff import diff_toolsets
from proxy.schemas.names import mcp_identity
from proxy.schemas.sources import SourceError, from_db

router = APIRouter()


def _load(source: str, db_url: str):
    try:
        return from_db(source, db_url), None
    except SourceError as exc:
        return None, str(exc)


def _mcp_label(name: str, description: str | None) -> str | None:
    """`server › tool` for an MCP tool name with a per-run uid, as the session page shows it."""
    found = mcp_identity(name, description)
    return None if found is None else (f"{found[0]} › {found[1]}" if found[0] else found[1])


def _default_pair(sets: list[dict]) -> tuple[str, str] | None:
    """The newest change of tool set within one session (what a person comes to see),
    if any session changed its tools."""
    by_session: dict[str, list[dict]] = {}
    for s in sets:  # oldest first
        by_session.setdefault(s["session_id"], []).append(s)
    changed = [found for found in by_session.values() if len(found) >= 2]
    if not changed:
        return None
    newest = max(changed, key=lambda found: found[-1]["turn_id"])
    return f"turn:{newest[-2]['turn_id']}", f"turn:{newest[-1]['turn_id']}"


def _mcp_choices(engine) -> list[dict]:
    """Each recorded MCP server's tools/list answers, as the `mcp:NAME@ID` sources its page links to."""
    from sqlmodel import Session as DB

    from proxy.mcp import read
    from proxy.store.read import shown_time

    with DB(engine) as db:
        sets = read.tool_sets(db, with_tools=False)
    return [{"value": f"mcp:{s['server']}@{s['id']}",
             "label": f"MCP {s['server']} · tool set #{s['id']} · {s['tool_count']} tool"
                      f"{'s' if s['tool_count'] != 1 else ''} · {shown_time(s['first_seen'])}"} for s in sets]


@router.get("/schemas")
def schemas(request: Request, a: str = "", b: str = ""):
    from proxy.store.read import shown_time

    from .pages import templates

    reader = request.app.state.reader
    db_url = request.app.state.tooltap.settings.db_url
    sets = reader.tool_sets()
    choices = [{"value": f"turn:{s['turn_id']}",
                "label": f"turn #{s['turn_id']} · {s['model'] or '?'} · {s['tool_count']} tool"
                         f"{'s' if s['tool_count'] != 1 else ''} · session {s['session_id']} · "
                         f"{shown_time(s['seen_at'])}"} for s in sets]
    if not a and len(choices) >= 2:
        a, b = _default_pair(sets) or (choices[-2]["value"], choices[-1]["value"])
    mcp_choices = _mcp_choices(reader.engine)
    # A source the address names that is not listed (a session's offer, a newest `mcp:NAME`,
    # one that is not there) is shown as given: the form must send again what is compared.
    listed = {c["value"] for c in choices + mcp_choices}
    given = [x for x in dict.fromkeys((a, b)) if x and x not in listed]
    ctx = {"choices": choices, "mcp_choices": mcp_choices, "given": given, "a": a, "b": b,
           "errors": [], "diff": None}
    if a and b:
        left, err_a = _load(a, db_url)
        right, err_b = _load(b, db_url)
        ctx["errors"] = [e for e in (err_a, err_b) if e]
        if left and right:
            diff = diff_toolsets(left.tools, right.tools)
            status = {t["name"]: t for t in diff["tools"]}
            for t in diff["tools"]:
                if t.get("from"):
                    status.setdefault(t["from"], t)
            losses = {}
            for target in TARGETS:
                _, lost = convert_tools(right.tools, target)
                losses[target] = [x.to_dict() for x in lost]
            mcp = {t.name: _mcp_label(t.name, t.description) for t in left.tools + right.tools}
            ctx.update(diff=diff, left=left, right=right, status=status, losses=losses,
                       mcp={k: v for k, v in mcp.items() if v})
    return templates.TemplateResponse(request, "schemas.html", ctx)
