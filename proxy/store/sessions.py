"""Thread turns into sessions without the client's help.

Agents resend their whole history each turn, so turn N+1's message list starts with turn
N's. Each message list is a path of chain hashes (content.chain); the longest prefix
already known names the session, and the deepest earlier turn whose whole message list
is a strict prefix of this one is its parent. A retry or an edited history shares a
shorter prefix: it lands in the same session as a new branch (a second child of some
turn). The system prompt is not part of the chain: two tasks that share one stay apart,
and a task whose system prompt changes (new MCP servers, new rules) stays one session.
The chain starts from the wire API and the upstream: an Anthropic and an OpenAI
conversation that open with the same words are two sessions, not one.
"""

from __future__ import annotations

import time
import uuid
from dataclasses import dataclass

from sqlalchemy import bindparam, select
from sqlmodel import Session as DB

from .content import digest
from .models import ChainNode, Turn


OTHER_PREFIX = "other-"
OTHER_TITLE = "Requests without a conversation"


@dataclass
class Placement:
    session_id: str
    parent_id: int | None
    new_session: bool


def session_key(hint: str | None) -> str | None:
    """An X-Tooltap-Session value as a session id: kept as given when short and
    printable, else replaced by a hash of it (ids are at most 64 characters)."""
    hint = (hint or "").strip()
    if not hint:
        return None
    if len(hint) <= 64 and hint.isprintable():
        return hint
    return "h-" + digest(hint.encode("utf-8", "surrogateescape"))


def chain_root(api: str, upstream: str) -> str:
    """Where a request's message chain starts: its wire API and upstream."""
    return digest(f"{api}\n{upstream}".encode("utf-8", "surrogateescape"))


# Built once: these run for every turn, and building a query costs more than running it.
_nodes, _turns = ChainNode.__table__.c, Turn.__table__.c
_SESSION_OF_LONGEST_PREFIX = (
    select(_nodes.session_id).where(_nodes.hash.in_(bindparam("chain", expanding=True)))
    .order_by(_nodes.depth.desc()).limit(1)
)
_PARENT = (
    select(_turns.id)
    .where(_turns.session_id == bindparam("session"), _turns.chain_hash.in_(bindparam("prefixes", expanding=True)))
    .order_by(_turns.message_count.desc(), _turns.id.desc()).limit(1)
)


def place(db: DB, chain: list[str], hint: str | None) -> Placement:
    """The session and parent turn of a request whose messages hash to `chain`."""
    session_id = hint
    if session_id is None and not chain:
        # No conversation (a model list, a health check, an embedding): one session per
        # day gathers them rather than one session each.
        return Placement(OTHER_PREFIX + time.strftime("%Y-%m-%d", time.gmtime()), None, False)
    conn = db.connection()
    if session_id is None:
        session_id = conn.execute(_SESSION_OF_LONGEST_PREFIX, {"chain": chain}).scalar()
    if session_id is None:
        return Placement(uuid.uuid4().hex[:16], None, True)
    parent_id = None
    if len(chain) > 1:
        parent_id = conn.execute(_PARENT, {"session": session_id, "prefixes": chain[:-1]}).scalar()
    return Placement(session_id, parent_id, False)
