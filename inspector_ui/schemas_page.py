"""`/_tooltap/schemas`: two stored tool sets side by side, their semantic diff, and what
each provider's format would lose from the second one (proxy.schemas does the work)."""

from __future__ import annotations

import functools

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


def _tools(count: int) -> str:
    return f"{count} tool{'s' if count != 1 else ''}"


def _turn_label(s: dict) -> str:
    """How the selects name a turn's tool set (`s`: a row of Reader.tool_sets)."""
    from proxy.store.read import shown_time

    return (f"turn #{s['turn_id']} · {s['model'] or '?'} · {_tools(s['tool_count'])} · "
            f"session {s['session_id']} · {shown_time(s['seen_at'])}")


def _mcp_set_label(s: dict) -> str:
    """How the selects name an MCP server's tools/list answer (`s`: a row of read.tool_sets)."""
    from proxy.store.read import shown_time

    return f"MCP {s['server']} · tool set #{s['id']} · {_tools(s['tool_count'])} · {shown_time(s['first_seen'])}"


def _mcp_sets(engine) -> list[dict]:
    """Each recorded MCP server's tools/list answers, oldest first."""
    from sqlmodel import Session as DB

    from proxy.mcp import read

    with DB(engine) as db:
        return read.tool_sets(db, with_tools=False)


def _turn_row(reader, where) -> dict | None:
    """The newest turn with tools matching `where`, as a row of Reader.tool_sets."""
    from sqlmodel import Session as DB, select

    from proxy.store.models import Turn
    from proxy.store.read import iso

    with DB(reader.engine) as db:
        t = db.exec(select(Turn.id, Turn.model, Turn.session_id, Turn.started_at, Turn.tools_hash)
                    .where(where, Turn.tools_hash.is_not(None)).order_by(Turn.id.desc()).limit(1)).first()
        if t is None:
            return None
        return {"turn_id": t.id, "model": t.model, "tool_count": len(reader.blob(db, t.tools_hash) or []),
                "session_id": t.session_id, "seen_at": iso(t.started_at)}


def _given_label(source: str, reader, mcp_sets: list[dict], load) -> str:
    """A source the address names that the lists do not hold (they name each tool set once,
    by the first turn that offered it or by its id), in the words the lists use; as given
    when it names nothing stored. `load`: the page's _load."""
    from proxy.store.models import Turn
    from proxy.store.read import known_id

    kind, _, ident = source.partition(":")
    if kind == "turn" and ident.isascii() and ident.isdigit() and known_id(int(ident)):
        row = _turn_row(reader, Turn.id == int(ident))
        return _turn_label(row) if row else source
    if kind == "session":
        row = _turn_row(reader, Turn.session_id == ident)
        return f"the session's newest: {_turn_label(row)}" if row else source
    if kind != "mcp":
        return source
    server, at, which = ident.partition("@")
    if not at:  # the newest answer, as `tooltap schemas` reads mcp:NAME
        mine = [s for s in mcp_sets if s["server"] == server]
        newest = max(mine, key=lambda s: (s["last_seen"], s["id"]), default=None)
        return f"newest: {_mcp_set_label(newest)}" if newest else source
    offered, _ = load(source) if which.startswith("session:") else (None, None)
    if offered is None:
        return source
    return f"MCP {server} · as offered in session {which[len('session:'):]} · {_tools(len(offered.tools))}"


@router.get("/schemas")
def schemas(request: Request, a: str = "", b: str = ""):
    from .pages import templates

    reader = request.app.state.reader
    db_url = request.app.state.tooltap.settings.db_url
    load = functools.cache(lambda source: _load(source, db_url))  # a source labelled is loaded once
    sets = reader.tool_sets()
    choices = [{"value": f"turn:{s['turn_id']}", "label": _turn_label(s)} for s in sets]
    if not a and len(choices) >= 2:
        a, b = _default_pair(sets) or (choices[-2]["value"], choices[-1]["value"])
    mcp_sets = _mcp_sets(reader.engine)
    mcp_choices = [{"value": f"mcp:{s['server']}@{s['id']}", "label": _mcp_set_label(s)} for s in mcp_sets]
    # A source the address names that is not listed (a later turn of a tool set, a session's
    # offer, a newest `mcp:NAME`, one that is not there) is shown as given, labelled as the
    # lists label theirs: the form must send again what is compared.
    listed = {c["value"] for c in choices + mcp_choices}
    given = [{"value": x, "label": _given_label(x, reader, mcp_sets, load)}
             for x in dict.fromkeys((a, b)) if x and x not in listed]
    ctx = {"choices": choices, "mcp_choices": mcp_choices, "given": given, "a": a, "b": b,
           "errors": [f"no parameter {name!r} here (not applied): the page compares a=SOURCE and b=SOURCE"
                      for name in dict.fromkeys(request.query_params) if name not in ("a", "b", "token")],
           "diff": None}
    if a and b:
        left, err_a = load(a)
        right, err_b = load(b)
        ctx["errors"] += [e for e in (err_a, err_b) if e]
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
