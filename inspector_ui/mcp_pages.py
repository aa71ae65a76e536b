"""The MCP pages: every recorded server (`/_tooltap/mcp`), one server (`/_tooltap/mcp/NAME`:
its tools/list over time, calls with the model call each executed, errors, latency,
runs), what a session page's tool-call cards need to draw their MCP chain (`marks`), and
the whole of a message, a call's arguments or its result where the pages clip them
(`/_tooltap/mcp/messages/ID/raw`, `.../arguments`, `.../result`)."""

from __future__ import annotations

import json
import shlex
import statistics
import zlib

from fastapi import APIRouter, HTTPException, Request
from fastapi.responses import Response
from sqlmodel import Session as DB

from proxy.mcp import read
from proxy.mcp.correlate import asked_by, for_session, links_for_turn
from proxy.mcp.messages import elements, json_id
from proxy.store.models import McpMessage
from proxy.store.read import MAX_ID

from .longtext import whole

router = APIRouter()


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

    asked = asked_by(db, calls)
    places = {sid: numbers_in(db, sid) for sid in {c.session for c, _ in asked.values()}}
    return {message_id: {"session_id": c.session, "tool_call": c.row_id, "turn_id": c.turn_id,
                         "turn_n": places[c.session].get(c.turn_id),  # its place in its session, as pages name it
                         "matched_by": link["matched_by"], "result_match": link["result_match"]}
            for message_id, (c, link) in asked.items()}


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
        # jsonrpc_id: which call of a batch the page's links to the whole text mean (parsed, as
        # the messages API gives it).
        "recent_calls": [{**c.to_json(), "jsonrpc_id": json.loads(c.jsonrpc_id), "asked_by": asked.get(c.message_id)}
                         for c in calls],
        "connections": read.connections(db, name),
    }


@router.get("/mcp")
def servers_page(request: Request):
    from .pages import templates

    with DB(request.app.state.reader.engine) as db:
        found = read.servers(db)
    return templates.TemplateResponse(request, "mcp_servers.html", {"servers": found, "db": _db_for_mcp(request)})


def _db_for_mcp(request: Request) -> str:
    """This tooltap's database as `tooltap mcp --db` would name it: a SQLite file by its
    absolute path (the agent starts the wrapper elsewhere), any other without its password."""
    from proxy.store.db import shown_url, sqlite_path

    url = request.app.state.tooltap.settings.db_url
    path = sqlite_path(url)
    return shlex.quote(str(path.resolve()) if path is not None else shown_url(url))


def server_page(request: Request, name: str):
    from .pages import templates

    with DB(request.app.state.reader.engine) as db:
        report = server_report(db, name)
        recent = read.messages(db, server=name, limit=50) if report else []
    if report is None:
        raise HTTPException(404, f"no MCP server {name}")
    return templates.TemplateResponse(request, "mcp_server.html", {"r": report, "recent": recent})


# -- the whole of what the MCP pages clip: plain text, as the turn pages' whole results ------

@router.get("/mcp/messages/{message_id}/raw")
def message_raw(request: Request, message_id: int):
    """A recorded message as it crossed the wire (the messages table shows its start): its
    very bytes, which need not be UTF-8 (then served as bytes, for the browser to save)."""
    body = zlib.decompress(_stored(request, message_id).raw)
    try:
        body.decode("utf-8")
    except UnicodeDecodeError:
        return Response(body, media_type="application/octet-stream",
                        headers={"content-disposition": f'attachment; filename="tooltap-mcp-message-{message_id}.bin"'})
    return Response(body, media_type="text/plain; charset=utf-8",
                    headers={"content-disposition": f'inline; filename="tooltap-mcp-message-{message_id}.txt"'})


@router.get("/mcp/messages/{message_id}/arguments")
def call_arguments(request: Request, message_id: int, id: str | None = None):
    """The arguments of the tools/call in message `message_id` (`id`: its JSON-RPC id, as
    JSON, to pick one call of a batch), laid out as the pages show them."""
    call = _member(_message(request, message_id), _is_call, id, "tools/call request")
    params = call.get("params") if isinstance(call.get("params"), dict) else {}
    return whole(_pretty(params.get("arguments")), f"tooltap-mcp-message-{message_id}-arguments.txt")


@router.get("/mcp/messages/{message_id}/result")
def call_result(request: Request, message_id: int, id: str | None = None):
    """The text of the answer in message `message_id` to a tools/call, as the pages show it."""
    answer = _member(_message(request, message_id), _is_answer, id, "answer")
    text = read.answer_text(answer.get("result"), answer.get("error"))
    if text is None:
        raise HTTPException(404, f"the answer in MCP message {message_id} holds no text")
    return whole(text, f"tooltap-mcp-message-{message_id}-result.txt")


def _stored(request: Request, message_id: int) -> McpMessage:
    found = None
    if 0 < message_id <= MAX_ID:  # beyond it the database cannot even be asked
        with DB(request.app.state.reader.engine) as db:
            found = db.get(McpMessage, message_id)
    if found is None:
        raise HTTPException(404, f"no MCP message {message_id}")
    return found


def _message(request: Request, message_id: int) -> dict:
    return read.message_json(_stored(request, message_id))


def _is_call(msg: dict) -> bool:
    return msg.get("method") == "tools/call" and "id" in msg


def _is_answer(msg: dict) -> bool:
    return "id" in msg and ("result" in msg or "error" in msg)


def _member(message: dict, wanted, jsonrpc_id: str | None, what: str) -> dict:
    """The one JSON-RPC message of a recorded line (itself, or a member of its batch) that
    is `wanted`, with JSON-RPC id `jsonrpc_id` when one is given."""
    found = [m for m in elements(message["json"]) if wanted(m)]
    where = f"MCP message {message['id']}"
    if jsonrpc_id is not None:
        found = [m for m in found if json_id(m["id"]) == _normal_id(jsonrpc_id)]
        where += f" with id {jsonrpc_id}"
    if not found:
        raise HTTPException(404, f"no {what} in {where}")
    if len(found) > 1:
        raise HTTPException(404, f"{where} holds {len(found)} of them: name one {what} by its JSON-RPC id, ?id=")
    return found[0]


def _normal_id(text: str) -> str | None:
    """A JSON-RPC id given as JSON text, written as the messages' ids are compared (json_id)."""
    try:
        return json_id(json.loads(text))
    except (ValueError, RecursionError):
        return None


def _pretty(value) -> str:
    from .transcript import pretty  # (transcript imports this module)

    return pretty(value)


# Last: a server's name may hold `/` (the reference server calls itself
# `example-servers/everything`), so its page takes the rest of the path.
router.add_api_route("/mcp/{name:path}", server_page, methods=["GET"])
