"""MCP tool sets as `tooltap schemas` sources: what a server declared, and what an agent
offered a model of that server's tools.

    mcp:NAME                 the newest tools/list answer of server NAME
    mcp:NAME@ID              the tool set ID of that server (on its MCP page, and in /api/mcp/servers/NAME)
    mcp:NAME@session:SID     server NAME's tools as the agent offered them in session SID,
                             under their MCP names (`cIya4J0mcp0get_forecast` -> `get_forecast`),
                             or, from an agent built on the SDKs, under their own

so `tooltap schemas diff mcp:weather mcp:weather@session:SID` shows what the agent changed
on the way (Cline prefixes descriptions with the server's name; a schema it rewrote, a
tool it dropped).
"""

from __future__ import annotations

import dataclasses
import re

from sqlmodel import Session as DB, select

from ..schemas.names import mcp_identity
from ..schemas.sources import SourceError, ToolSet, from_document
from ..store import content
from ..store.models import McpToolSet


def load_source(source: str, db_url: str) -> ToolSet:
    from ..store.db import DatabaseUnavailable, open_database, shown_url

    spec = source[len("mcp:"):]
    name, at, which = spec.partition("@")
    if not name:
        raise SourceError(f"{source}: name a server, as in mcp:weather")
    try:
        engine = open_database(db_url, create=False)
    except DatabaseUnavailable as exc:
        raise SourceError(str(exc)) from exc
    try:
        with DB(engine) as db:
            if which.startswith("session:"):
                return offered(db, db_url, name, which[len("session:"):], source)
            q = select(McpToolSet).where(McpToolSet.server == name)
            if at:
                if not which.isdigit():
                    raise SourceError(f"{source}: after @ give a tool set id or session:ID")
                q = q.where(McpToolSet.id == int(which))
            row = db.exec(q.order_by(McpToolSet.last_seen.desc(), McpToolSet.id.desc()).limit(1)).first()
            if row is None:
                what = f"no tool set {which}" if at else "no tools/list answer"
                raise SourceError(f"{source}: {what} of MCP server {name!r} in {shown_url(db_url)}")
            return from_document(content.unpack(row.tools), source)
    finally:
        engine.dispose()


def offered(db: DB, db_url: str, server: str, session_id: str, source: str) -> ToolSet:
    from ..store import read
    from ..store.db import shown_url

    try:
        tools = read.session_tools(db_url, session_id)
    except LookupError as exc:
        raise SourceError(f"{source}: {exc}") from None
    if tools is None:
        raise SourceError(f"{source}: no session {session_id!r} with tools in {shown_url(db_url)}")
    whole = from_document(tools, source)
    mine = []
    for spec in whole.tools:
        tool = mcp_tool_of(spec.name, spec.description, server)
        if tool is not None:
            mine.append(dataclasses.replace(spec, name=tool))
    if not mine:  # an agent built on the SDKs offers the server's tools under their own names
        declared = _declared_names(db, server)
        mine = [spec for spec in whole.tools if spec.name in declared]
    if not mine:
        raise SourceError(f"{source}: the agent offered no tool of MCP server {server!r} in that session")
    return ToolSet(source, whole.format, mine, whole.skipped)


def _declared_names(db: DB, server: str) -> set[str]:
    """Every tool name `server` declared in any of its recorded tools/list answers."""
    sets = db.exec(select(McpToolSet.tools).where(McpToolSet.server == server)).all()
    return {t.get("name") for packed in sets for t in content.unpack(packed) if isinstance(t, dict)}


def mcp_tool_of(name: str, description: str | None, server: str) -> str | None:
    """The MCP tool name behind an offered name when it belongs to `server`: Cline 3.x's
    `<uid>0mcp0<tool>` (server from the description), Claude Code's `mcp__<server>__<tool>`,
    Cline 4.x's `<server>__<tool>`."""
    found = mcp_identity(name, description)
    if found is not None:
        return found[1] if found[0] == server else None
    for prefix in (f"mcp__{server}__", f"{_sdk_safe(server)}__"):
        if name.startswith(prefix) and len(name) > len(prefix):
            return name[len(prefix):]
    return None


def _sdk_safe(server: str) -> str:
    return re.sub(r"[^a-zA-Z0-9_-]", "_", server)
