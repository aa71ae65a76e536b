"""Thread turns into sessions without the client's help.

Agents resend their whole history each turn, so turn N+1's message list starts with turn
N's. Each message list is a path of chain hashes (content.chain); the longest prefix
already known names the session, and the deepest earlier turn whose whole message list
is a strict prefix of this one is its parent. A retry or an edited history shares a
shorter prefix: it lands in the same session as a new branch (a second child of some
turn). A prefix only counts once it reaches past the system prompt into the first user
message, so two tasks that share a system prompt stay apart.
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass

from sqlmodel import Session as DB, select

from .models import ChainNode, Turn


@dataclass
class Placement:
    session_id: str
    parent_id: int | None
    new_session: bool


def min_depth(roles: list[str | None]) -> int:
    """How deep a shared prefix must reach: through the first non-system message."""
    for i, role in enumerate(roles):
        if role not in ("system", "developer"):
            return i + 1
    return len(roles) + 1  # only system messages: nothing worth matching on


def place(db: DB, chain: list[str], roles: list[str | None], hint: str | None) -> Placement:
    session_id = hint
    if session_id is None and chain:
        need = min_depth(roles)
        row = db.exec(
            select(ChainNode.session_id, ChainNode.depth)
            .where(ChainNode.hash.in_(chain))
            .order_by(ChainNode.depth.desc())
            .limit(1)
        ).first()
        if row is not None and row.depth >= need:
            session_id = row.session_id
    if session_id is None:
        return Placement(uuid.uuid4().hex[:16], None, True)

    parent_id = None
    if len(chain) > 1:
        parent_id = db.exec(
            select(Turn.id)
            .where(Turn.session_id == session_id, Turn.chain_hash.in_(chain[:-1]))
            .order_by(Turn.message_count.desc(), Turn.id.desc())
            .limit(1)
        ).first()
    return Placement(session_id, parent_id, False)
