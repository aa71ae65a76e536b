"""Run the agent decoders over stored sessions and keep their answers on the rows.

Decoding is a pure function of a session's stored turns (proxy.agents.decode_session), so
the writer runs it after each batch for the sessions the batch touched, and
`tooltap redecode` runs it again over everything when decoders improve. A result can
change when a later turn arrives (it carries the earlier turn's tool results), which is
why a whole session is decoded each time.
"""

from __future__ import annotations

import logging
from collections import Counter, OrderedDict
from typing import Any, Iterable

from sqlalchemy import bindparam, func, select as sa_select, update
from sqlmodel import Session as DB, select

from ..agents import CallInput, TurnInput, decode_session, transcript
from . import content
from .ingest import Ingested
from .models import Blob, Session, ToolCallRow, Turn
from .one_statement import OneStatement
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


class Known:
    """A turn as the decoders see it (`input`), with what its rows hold now: its
    decoding and, per tool call index, (decoded, task_progress, result, violations)."""

    __slots__ = ("input", "session_id", "decoding", "calls")

    def __init__(self, input: TurnInput, session_id: str, decoding: Any, calls: dict[int, tuple]):
        self.input, self.session_id, self.decoding, self.calls = input, session_id, decoding, calls


class RecentTurns:
    """Recently stored turns by id: a new turn's parent and grandparent are almost
    always here, so nothing is read back from the database.

    Other writers may share the database (several instances, `--workers`): one that
    stores a turn of the same conversation may adopt, re-parent or re-decode turns held
    here. Every such change comes with a new turn in that session, so a session whose
    stored turn count is not the one this writer left is forgotten (`check`)."""

    def __init__(self, size: int = 512, sessions: int = 8192):
        self.size, self.sessions = size, sessions
        self._items: OrderedDict[int, Known] = OrderedDict()
        self._by_session: dict[str, set[int]] = {}
        self._counts: OrderedDict[str, int] = OrderedDict()  # session -> its turns after this writer's batch

    def put(self, item: Known) -> None:
        self._items[item.input.id] = item
        self._items.move_to_end(item.input.id)
        self._by_session.setdefault(item.session_id, set()).add(item.input.id)
        if len(self._items) > self.size:
            _, old = self._items.popitem(last=False)
            self._drop_from_session(old)

    def get(self, turn_id: int) -> Known | None:
        return self._items.get(turn_id)

    def check(self, session_id: str, stored: int, added: int) -> None:
        """`stored`: the session's turn count now, `added` of them by this batch. Forget
        what is held of the session unless the rest are the turns this writer saw."""
        if self._counts.get(session_id) != stored - added:
            for turn_id in self._by_session.pop(session_id, ()):
                self._items.pop(turn_id, None)
        self._counts[session_id] = stored
        self._counts.move_to_end(session_id)
        if len(self._counts) > self.sessions:
            self._counts.popitem(last=False)

    def _drop_from_session(self, item: Known) -> None:
        ids = self._by_session.get(item.session_id)
        if ids is not None:
            ids.discard(item.input.id)
            if not ids:
                del self._by_session[item.session_id]


def turn_input(turn, request: Any, response: Any, calls) -> TurnInput:
    """`calls`: ToolCallRow objects or tool_calls rows as dicts."""
    def field(c, name):
        return c[name] if isinstance(c, dict) else getattr(c, name)

    return TurnInput(
        id=turn.id, parent_id=turn.parent_id, api=turn.api,
        request=request if isinstance(request, dict) else None, response=response,
        tool_calls=[CallInput(field(c, "index"), field(c, "call_id"), field(c, "name"), field(c, "arguments_raw"),
                              field(c, "arguments"), field(c, "arguments_error")) for c in calls],
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


_T, _C, _S = Turn.__table__, ToolCallRow.__table__, Session.__table__
_SESSION_STATE = (sa_select(_S.c.id, _S.c.agent, _S.c.uids, _S.c.turns)
                  .where(_S.c.id.in_(bindparam("ids", expanding=True))))
_FIRST_CHILDREN = (sa_select(_T.c.parent_id, func.min(_T.c.id))
                   .where(_T.c.parent_id.in_(bindparam("ids", expanding=True))).group_by(_T.c.parent_id))
_SET_TURN = update(_T).where(_T.c.id == bindparam("b_id")).values(decoding=bindparam("b_decoding"))
_SET_CALL = (update(_C).where(_C.c.turn_id == bindparam("b_turn_id"), _C.c["index"] == bindparam("b_index"))
             .values(decoded=bindparam("b_decoded"), task_progress=bindparam("b_task_progress"),
                     result=bindparam("b_result"), violations=bindparam("b_violations")))
_SET_SESSION = update(_S).where(_S.c.id == bindparam("b_id")).values(agent=bindparam("b_agent"),
                                                                     uids=bindparam("b_uids"))
_OUTPUTS = ("decoded", "task_progress", "result", "violations")
_SET_CALLS = OneStatement(_C, list(_OUTPUTS), key=("turn_id", "index"))  # SQLite: the search index's sake


class _Changes:
    """What a batch's decoding changes, written at the end in three statements."""

    def __init__(self, sessions: dict[str, list]) -> None:
        self.sessions = sessions  # id -> [agent, uids], as they will be stored
        self.touched: set[str] = set()
        self.turns: dict[int, Any] = {}
        self.calls: dict[tuple[int, int], tuple] = {}

    def write(self, conn) -> None:
        if self.turns:
            conn.execute(_SET_TURN, [{"b_id": k, "b_decoding": v} for k, v in self.turns.items()])
        calls = [{"turn_id": t, "index": i, **dict(zip(_OUTPUTS, out))} for (t, i), out in self.calls.items()]
        if calls and not _SET_CALLS.run(conn, calls):
            conn.execute(_SET_CALL, [{f"b_{k}": v for k, v in row.items()} for row in calls])
        if self.touched:
            conn.execute(_SET_SESSION, [{"b_id": sid, "b_agent": self.sessions[sid][0],
                                         "b_uids": self.sessions[sid][1]} for sid in sorted(self.touched)])


def decode_new_turns(db: DB, new: list[Ingested], recent: RecentTurns, cache: BlobCache) -> None:
    """Decode turns as they arrive, with just the context each needs: its parent gets
    its tool results from it, and the grandparent holds the checklist the parent's is
    compared with. Cost per turn stays flat however long the session grows. Uids
    resolved earlier in the session come from the session row; `tooltap redecode`
    gives the whole-session answer. A turn that adopted children (it reached the
    database after them) is decoded again with each of them."""
    if not new:
        return
    conn = db.connection()
    ids = sorted({item.turn.session_id for item in new})
    added = Counter(item.turn.session_id for item in new)
    state = conn.execute(_SESSION_STATE, {"ids": ids}).all()
    for sid, _agent, _uids, stored in state:
        recent.check(sid, stored, added[sid])
    changes = _Changes({sid: [agent, uids] for sid, agent, uids, _stored in state})
    # A new turn may have children already (it reached the database after them), and so
    # may the turns it adopted: their first child is where their results are read.
    parents = {item.turn.parent_id for item in new if item.turn.parent_id is not None}
    parents |= {item.turn.id for item in new} | {child for item in new for child in item.adopted}
    first = dict(conn.execute(_FIRST_CHILDREN, {"ids": sorted(parents)}).all()) if parents else {}
    pending = {item.turn.id for item in new}  # new turns not decoded yet
    for item in new:
        turn = item.turn
        pending.discard(turn.id)
        try:
            mine = Known(_new_input(item), turn.session_id, None,
                         {c["index"]: (None, None, None, None) for c in item.calls})
            recent.put(mine)
            _decode(db, mine, recent, cache, first, changes, pending)
            for child_id in item.adopted:
                child = _earlier(db, child_id, recent, cache)
                if child is not None:
                    child.input.parent_id = turn.id
                    _decode(db, child, recent, cache, first, changes, pending)
        except Exception:
            log.exception("decoding turn %s failed", turn.id)
    changes.write(conn)


def _new_input(item: Ingested) -> TurnInput:
    """A new turn for the decoders. Its views are shared with the request parser's record
    of it (requests.py), so a later request that extends this one starts from them: an
    OpenAI chat transcript is one message per message, so only the new ones are read."""
    turn = item.turn
    mine = turn_input(turn, item.request, item.response, item.calls)
    if item.prefix is None:
        return mine
    mine.memo = item.prefix.memo
    mine.memo["api"] = turn.api
    base = item.base.memo if item.base is not None and item.reused else {}
    earlier = base.get("messages") if base.get("api") == turn.api else None
    if earlier is not None and turn.api == "openai.chat":
        new = transcript.messages(turn.api, {"messages": item.request["messages"][item.reused:]})
        mine.memo["messages"] = earlier + new if new else earlier
        if "system_text" in base and not any(m.role == "system" for m in new):
            mine.memo["system_text"] = base["system_text"]  # the same system messages, the same objects
    kept = item.base.values.get("tools") if item.base is not None else None
    if kept is not None and "tools" in base and isinstance(item.request, dict) and item.request.get("tools") is kept[1]:
        mine.memo["tools"] = base["tools"]  # offered_tools of the same tools object
    return mine


def _decode(db: DB, mine: Known, recent: RecentTurns, cache: BlobCache, first: dict[int, int],
            changes: _Changes, pending: set[int]) -> None:
    parent = _earlier(db, mine.input.parent_id, recent, cache)
    grandparent = _earlier(db, parent.input.parent_id, recent, cache) if parent else None
    # A child decoded later in this batch fills in this turn's results itself.
    child_id = first.get(mine.input.id)
    child = _earlier(db, child_id, recent, cache) if child_id is not None and child_id not in pending else None
    window = [k.input for k in (grandparent, parent, mine, child) if k is not None]
    # Results come from a turn's first child only (a retry does not re-answer).
    targets = [mine] + ([parent] if parent is not None and first.get(parent.input.id) == mine.input.id else [])
    state = changes.sessions.get(mine.session_id)
    decoding = decode_session(window, state[1] if state else None)
    for known in targets:
        turn_id = known.input.id
        out = decoding.turns.get(turn_id)
        if out != known.decoding:
            known.decoding = changes.turns[turn_id] = out
        for index, stored in known.calls.items():
            call = decoding.calls.get((turn_id, index))
            if call is None:
                continue
            now = tuple(call.get(n) for n in _OUTPUTS)
            if now != stored:
                known.calls[index] = changes.calls[(turn_id, index)] = now
    if state is None:
        return
    uids = {**(state[1] or {}), **decoding.uids}
    agents = [(decoding.turns.get(t.id) or {}).get("agent") for t in window]
    agent = next((a for a in agents if a and a != "generic"), state[0] or (agents[0] if agents else None))
    if (state[1] or {}) != uids or state[0] != agent:
        state[0], state[1] = agent, uids or None
        changes.touched.add(mine.session_id)


def _earlier(db: DB, turn_id: int | None, recent: RecentTurns, cache: BlobCache) -> Known | None:
    if turn_id is None:
        return None
    found = recent.get(turn_id)
    if found is None:
        turn = db.get(Turn, turn_id)
        if turn is None:
            return None
        rows = _call_rows(db, [turn_id]).get(turn_id, [])
        found = Known(_load(db, turn, rows, cache), turn.session_id, turn.decoding,
                      {c.index: (c.decoded, c.task_progress, c.result, c.violations) for c in rows})
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
