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

from sqlalchemy import bindparam, select as sa_select
from sqlmodel import Session as DB, select

from ..agents import CallInput, TurnInput, decode_session
from . import content
from .ingest import Ingested
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


_FIRST_CHILD = (
    sa_select(Turn.__table__.c.id).where(Turn.__table__.c.parent_id == bindparam("parent"))
    .order_by(Turn.__table__.c.id).limit(1)
)


class RecentTurns:
    """The decoders' view of recently stored turns, by id: a new turn's parent and
    grandparent are almost always here, so nothing is read back from the database."""

    def __init__(self, size: int = 512):
        self.size = size
        self._items: OrderedDict[int, TurnInput] = OrderedDict()

    def put(self, item: TurnInput) -> None:
        self._items[item.id] = item
        self._items.move_to_end(item.id)
        if len(self._items) > self.size:
            self._items.popitem(last=False)

    def get(self, turn_id: int) -> TurnInput | None:
        return self._items.get(turn_id)


def turn_input(turn: Turn, request: Any, response: Any, calls: list[ToolCallRow]) -> TurnInput:
    return TurnInput(
        id=turn.id, parent_id=turn.parent_id, api=turn.api,
        request=request if isinstance(request, dict) else None, response=response,
        tool_calls=[CallInput(c.index, c.call_id, c.name, c.arguments_raw, c.arguments, c.arguments_error)
                    for c in calls],
    )


def decode_sessions(db: DB, session_ids: Iterable[str], cache: BlobCache) -> None:
    """Decode whole sessions (`tooltap redecode`)."""
    for session_id in sorted(set(session_ids)):
        try:
            turns = db.exec(select(Turn).where(Turn.session_id == session_id).order_by(Turn.id)).all()
            rows = _call_rows(db, [t.id for t in turns])
            inputs = [_load(db, t, rows.get(t.id, []), cache) for t in turns]
            _apply(db, session_id, decode_session(inputs), turns, rows, inputs, full=True)
        except Exception:  # decoding must never cost a turn: the rows stay as captured
            log.exception("decoding session %s failed", session_id)


def decode_new_turns(db: DB, new: list[Ingested], recent: RecentTurns, cache: BlobCache) -> None:
    """Decode turns as they arrive, with just the context each needs: its parent gets
    its tool results from it, and the grandparent holds the checklist the parent's is
    compared with. Cost per turn stays flat however long the session grows. Uids
    resolved earlier in the session come from the session row; `tooltap redecode`
    gives the whole-session answer."""
    for item in new:
        turn = item.turn
        try:
            mine = turn_input(turn, item.request, item.response, item.calls)
            recent.put(mine)
            parent = _earlier(db, turn.parent_id, recent, cache)
            grandparent = _earlier(db, parent.parent_id, recent, cache) if parent else None
            window = [t for t in (grandparent, parent, mine) if t is not None]
            # Results come from a turn's first child only (a retry does not re-answer).
            first_child = parent is not None and db.connection().execute(
                _FIRST_CHILD, {"parent": parent.id}).scalar() == turn.id
            turns, rows = [turn], {turn.id: item.calls}
            if first_child:
                turns.append(db.get(Turn, parent.id))
                rows.update(_call_rows(db, [parent.id]))
            session = db.get(Session, turn.session_id)
            decoding = decode_session(window, session.uids if session else None)
            _apply(db, turn.session_id, decoding, turns, rows, window, full=False)
        except Exception:
            log.exception("decoding turn %s failed", turn.id)


def _earlier(db: DB, turn_id: int | None, recent: RecentTurns, cache: BlobCache) -> TurnInput | None:
    if turn_id is None:
        return None
    found = recent.get(turn_id)
    if found is None:
        turn = db.get(Turn, turn_id)
        if turn is None:
            return None
        found = _load(db, turn, _call_rows(db, [turn_id]).get(turn_id, []), cache)
        recent.put(found)
    return found


def _load(db: DB, t: Turn, calls: list[ToolCallRow], cache: BlobCache) -> TurnInput:
    request = rebuild_request(db, t, lambda h: cache.get(db, h))
    return turn_input(t, request, content.unpack(t.response), calls)


def _call_rows(db: DB, turn_ids: list[int]) -> dict[int, list[ToolCallRow]]:
    rows: dict[int, list[ToolCallRow]] = {}
    for row in db.exec(select(ToolCallRow).where(ToolCallRow.turn_id.in_(turn_ids)).order_by(ToolCallRow.index)):
        rows.setdefault(row.turn_id, []).append(row)
    return rows


def _apply(db: DB, session_id: str, decoding, turns: list[Turn], rows: dict[int, list[ToolCallRow]],
           window: list[TurnInput], full: bool) -> None:
    """Write the decoders' answers for `turns` onto their rows (only what changed)."""
    for t in turns:
        turn_out = decoding.turns.get(t.id)
        if turn_out != t.decoding:
            t.decoding = turn_out
            db.add(t)
        for c in rows.get(t.id, []):
            out = decoding.calls.get((t.id, c.index))
            if out is None:
                continue
            new = (out.get("decoded"), out.get("task_progress"), out.get("result"), out.get("violations"))
            if new != (c.decoded, c.task_progress, c.result, c.violations):
                c.decoded, c.task_progress, c.result, c.violations = new
                db.add(c)
    session = db.get(Session, session_id)
    if session is None:
        return
    uids = dict(decoding.uids) if full else {**(session.uids or {}), **decoding.uids}
    agents = [(decoding.turns.get(t.id) or {}).get("agent") for t in window]
    agent = next((a for a in agents if a and a != "generic"), session.agent or (agents[0] if agents else None))
    if (session.uids or {}) != uids or session.agent != agent:
        session.uids, session.agent = uids or None, agent
        db.add(session)
