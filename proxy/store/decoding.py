"""Run the agent decoders over stored sessions and keep their answers on the rows.

Decoding is a pure function of a session's stored turns (proxy.agents.decode_session), so
the writer runs it after each batch for the sessions the batch touched, and
`tooltap redecode` runs it again over everything when decoders improve. A result can
change when a later turn arrives (it carries the earlier turn's tool results), which is
why a whole session is decoded each time.
"""

from __future__ import annotations

import logging
from collections import OrderedDict
from typing import Any, Iterable

from sqlmodel import Session as DB, select

from ..agents import CallInput, TurnInput, decode_session
from . import content
from .models import Blob, Session, ToolCallRow, Turn
from .read import rebuild_request

log = logging.getLogger("tooltap.store")


class BlobCache:
    """Unpacked blobs by hash: a session's turns share almost all their messages."""

    def __init__(self, size: int = 20_000):
        self.size = size
        self._items: OrderedDict[str, Any] = OrderedDict()

    def get(self, db: DB, h: str) -> Any:
        if h in self._items:
            self._items.move_to_end(h)
            return self._items[h]
        row = db.get(Blob, h)
        value = None if row is None else content.unpack(row.data)
        self._items[h] = value
        if len(self._items) > self.size:
            self._items.popitem(last=False)
        return value


def decode_sessions(db: DB, session_ids: Iterable[str], cache: BlobCache) -> None:
    """Decode whole sessions (`tooltap redecode`)."""
    for session_id in sorted(set(session_ids)):
        try:
            turns = db.exec(select(Turn).where(Turn.session_id == session_id).order_by(Turn.id)).all()
            _decode(db, session_id, turns, turns, cache, full=True)
        except Exception:  # decoding must never cost a turn: the rows stay as captured
            log.exception("decoding session %s failed", session_id)


def decode_new_turns(db: DB, new: list[Turn], cache: BlobCache) -> None:
    """Decode turns as they arrive, with just the context each needs: its parent gets
    its tool results from it, and the grandparent holds the checklist the parent's is
    compared with. Cost per turn stays flat however long the session grows. Uids
    resolved earlier in the session come from the session row; `tooltap redecode`
    gives the whole-session answer."""
    for turn in new:
        try:
            parent = db.get(Turn, turn.parent_id) if turn.parent_id else None
            grandparent = db.get(Turn, parent.parent_id) if parent and parent.parent_id else None
            # Results come from a turn's first child only (a retry does not re-answer).
            first_child = parent is not None and db.exec(
                select(Turn.id).where(Turn.parent_id == parent.id).order_by(Turn.id).limit(1)).first() == turn.id
            window = [t for t in (grandparent, parent, turn) if t is not None]
            update = [t for t in (parent, turn) if t is not None and (t is turn or first_child)]
            _decode(db, turn.session_id, window, update, cache, full=False)
        except Exception:
            log.exception("decoding turn %s failed", turn.id)


def _decode(db: DB, session_id: str, window: list[Turn], update: list[Turn], cache: BlobCache,
            full: bool) -> None:
    ids = [t.id for t in window]
    calls: dict[int, list[ToolCallRow]] = {}
    for row in db.exec(select(ToolCallRow).where(ToolCallRow.turn_id.in_(ids)).order_by(ToolCallRow.index)):
        calls.setdefault(row.turn_id, []).append(row)
    session = db.get(Session, session_id)

    inputs = []
    for t in window:
        request = rebuild_request(db, t, lambda h: cache.get(db, h))
        inputs.append(TurnInput(
            id=t.id, parent_id=t.parent_id, api=t.api,
            request=request if isinstance(request, dict) else None,
            response=content.unpack(t.response),
            tool_calls=[CallInput(c.index, c.call_id, c.name, c.arguments_raw, c.arguments, c.arguments_error)
                        for c in calls.get(t.id, [])],
        ))
    decoding = decode_session(inputs, None if full else (session.uids if session else None))

    for t in update:
        turn_out = decoding.turns.get(t.id)
        if turn_out != t.decoding:
            t.decoding = turn_out
            db.add(t)
        for c in calls.get(t.id, []):
            out = decoding.calls.get((t.id, c.index))
            if out is None:
                continue
            new = (out.get("decoded"), out.get("task_progress"), out.get("result"), out.get("violations"))
            if new != (c.decoded, c.task_progress, c.result, c.violations):
                c.decoded, c.task_progress, c.result, c.violations = new
                db.add(c)
    if session is None:
        return
    uids = dict(decoding.uids) if full else {**(session.uids or {}), **decoding.uids}
    agents = [(decoding.turns.get(t.id) or {}).get("agent") for t in window]
    agent = next((a for a in agents if a and a != "generic"), session.agent or (agents[0] if agents else None))
    if (session.uids or {}) != uids or session.agent != agent:
        session.uids, session.agent = uids or None, agent
        db.add(session)
