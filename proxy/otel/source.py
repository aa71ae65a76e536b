"""Stored turns as `spans.StoredTurn`: what a span needs, read in a few queries.

The whole request (every message, walked up the chain) is rebuilt only when content is
exported; the spans themselves need the request's parameters, the response and the
decoded tool calls."""

from __future__ import annotations

from typing import Any, Iterable

from sqlalchemy import func
from sqlalchemy.engine import Engine
from sqlmodel import Session as DB, select

from ..store import content as stored
from ..store.models import Blob, Session, ToolCallRow, Turn
from ..store.read import rebuild_request
from .spans import StoredCall, StoredTurn


def turns_by_id(engine: Engine, ids: Iterable[int], content: bool = False) -> list[StoredTurn]:
    ids = sorted(set(ids))
    if not ids:
        return []
    with DB(engine) as db:
        return _load(db, db.exec(select(Turn).where(Turn.id.in_(ids)).order_by(Turn.id)).all(), content)


def session_turns(engine: Engine, session_id: str, content: bool = False) -> list[StoredTurn]:
    with DB(engine) as db:
        turns = db.exec(select(Turn).where(Turn.session_id == session_id).order_by(Turn.id)).all()
        return _load(db, turns, content)


def session_ids(engine: Engine) -> list[str]:
    with DB(engine) as db:
        return list(db.exec(select(Session.id).order_by(Session.started_at, Session.id)).all())


def _load(db: DB, turns: list[Turn], content: bool) -> list[StoredTurn]:
    if not turns:
        return []
    ids = [t.id for t in turns]
    sessions = {s.id: s for s in db.exec(select(Session).where(Session.id.in_({t.session_id for t in turns})))}
    calls: dict[int, list[StoredCall]] = {}
    for c in db.exec(select(ToolCallRow).where(ToolCallRow.turn_id.in_(ids))
                     .order_by(ToolCallRow.turn_id, ToolCallRow.index)):
        calls.setdefault(c.turn_id, []).append(StoredCall(
            index=c.index, call_id=c.call_id, name=c.name, decoded=c.decoded, arguments_raw=c.arguments_raw,
            result=c.result, task_progress=c.task_progress))
    # The agent's next request after each turn: its first child.
    first_child = dict(db.exec(
        select(Turn.parent_id, func.min(Turn.id)).where(Turn.parent_id.in_(ids)).group_by(Turn.parent_id)).all())
    child_start = dict(db.exec(select(Turn.id, Turn.started_at).where(Turn.id.in_(first_child.values()))).all()) \
        if first_child else {}
    blobs: dict[str, Any] = {}

    def blob(h: str) -> Any:
        if h not in blobs:
            row = db.get(Blob, h)
            blobs[h] = None if row is None else stored.unpack(row.data)
        return blobs[h]

    out = []
    for t in turns:
        session = sessions.get(t.session_id)
        out.append(StoredTurn(
            id=t.id, uid=t.uid, session_id=t.session_id, parent_id=t.parent_id, agent=session.agent if session else None,
            api=t.api, upstream=t.upstream, path=t.path, model=t.model, status=t.status,
            http_status=t.http_status, error=t.error, stream=bool(t.stream), started_at=t.started_at,
            ttft_ms=t.ttft_ms, duration_ms=t.duration_ms, usage=t.usage if isinstance(t.usage, dict) else None,
            response=stored.unpack(t.response), params=_params(t.request_skeleton), calls=calls.get(t.id, []),
            request=rebuild_request(db, t, blob) if content else None,
            next_started_at=child_start.get(first_child.get(t.id)),
        ))
    return out


def _params(skeleton: Any) -> dict:
    """The request's own parameters: the skeleton without the parts kept in blobs."""
    if not isinstance(skeleton, dict):
        return {}
    return {k: v for k, v in skeleton.items() if v is not None}
