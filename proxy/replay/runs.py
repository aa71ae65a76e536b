"""Replay runs kept in the store, so the inspector can show them beside the session.

A run is one replay of one session: its kind ("tools", "recorded", "live"), what it ran
against, the verdict, and the whole report (compressed JSON, like the rest of the store).
A few counts are kept in columns so a session's list of runs reads without unpacking.
"""

from __future__ import annotations

import json
import threading
import time
import weakref
from typing import Any

from sqlalchemy.engine import Engine
from sqlmodel import Session as DB, select

from ..store import content
from ..store.db import migrate
from ..store.models import ReplayRun
from ..store.read import iso

KINDS = ("tools", "recorded", "live")
MAX_ID = 2**63 - 1

_migrated: "weakref.WeakSet[Engine]" = weakref.WeakSet()
_migrating = threading.Lock()


def save_run(engine: Engine, kind: str, session_id: str, target: str, ok: bool, report: dict) -> int:
    """Store one run; returns its id. The schema is brought up to date first: the CLI may
    write to a database an older tooltap created."""
    if kind not in KINDS:
        raise ValueError(f"replay run kind {kind!r}: use one of {', '.join(KINDS)}")
    _ensure_schema(engine)
    turns, differing = _counts(report)
    row = ReplayRun(session_id=session_id, kind=kind, target=str(target), ok=bool(ok), created_at=time.time(),
                    turns=turns, differing=differing, pass_hat_k=_number(report.get("pass_hat_k")),
                    report=_pack(report))
    with DB(engine) as db:
        db.add(row)
        db.commit()
        return row.id


def runs_of_session(engine: Engine, session_id: str) -> list[dict]:
    """The session's runs, newest first, without their reports."""
    with DB(engine) as db:
        rows = db.exec(select(ReplayRun).where(ReplayRun.session_id == session_id)
                       .order_by(ReplayRun.id.desc())).all()
        return [_summary(r) for r in rows]


def run(engine: Engine, run_id: int) -> dict | None:
    """One run with its report, or None."""
    if not 0 < run_id <= MAX_ID:  # an id from a URL can be any size; SQL's cannot
        return None
    with DB(engine) as db:
        r = db.get(ReplayRun, run_id)
        return None if r is None else {**_summary(r), "report": content.unpack(r.report)}


def _summary(r: ReplayRun) -> dict:
    return {"id": r.id, "session_id": r.session_id, "kind": r.kind, "target": r.target, "ok": r.ok,
            "created_at": iso(r.created_at), "turns": r.turns, "differing": r.differing,
            "pass_hat_k": r.pass_hat_k}


def _counts(report: dict) -> tuple[int | None, int | None]:
    turns = report.get("turns")
    if not isinstance(turns, list):
        return None, None
    # A skipped turn (its note says why) neither matched nor differed: it is not counted.
    compared = [t for t in turns if isinstance(t, dict) and t.get("note") is None]
    return len(compared), sum(1 for t in compared if not t.get("ok", True))


def _number(value: Any) -> float | None:
    return float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else None


def _pack(report: dict) -> bytes:
    try:
        return content.pack(report)
    except TypeError:  # a value JSON has no form for (bytes, a set): kept as its text
        return content.pack(json.loads(json.dumps(report, default=str)))


def _ensure_schema(engine: Engine) -> None:
    with _migrating:
        if engine not in _migrated:
            migrate(engine)
            _migrated.add(engine)
