"""Replay runs in the inspector: the session page's replay button and list of runs, a
run's page (recorded and replayed tool calls side by side, the differences in words),
and their JSON.

Starting a replay changes state, so it is a POST that a page from another site cannot
make: it must carry the `X-Tooltap-Action: replay` header, which only a script of ours
can add (a cross-site form cannot, and a cross-site fetch with it needs a CORS preflight
that is never granted), and an `Origin`, when sent, must be this inspector's.
"""

from __future__ import annotations

import importlib.util
import re
import shlex
import threading
from itertools import zip_longest
from typing import Any
from urllib.parse import urlsplit

from fastapi import APIRouter, HTTPException, Request
from sqlmodel import Session as DB

from proxy.replay import runs
from proxy.replay.result import not_replayed, same_word
from proxy.store.models import Session

from .transcript import pretty, turn_numbers

api_router = APIRouter()
page_router = APIRouter()

ACTION_HEADER = "x-tooltap-action"
_one_at_a_time = threading.Lock()  # a replay starts servers and a writer: one is plenty
_CALL_FIELD = re.compile(r"^tool_calls\[(\d+)\]")


def _engine(request: Request):
    return request.app.state.reader.engine


def session_exists(request: Request, session_id: str) -> bool:
    with DB(_engine(request)) as db:
        return db.get(Session, session_id) is not None


def session_runs(request: Request, session_id: str) -> list[dict]:
    """The session's runs, newest first, each with the verdict its page gives it."""
    engine = _engine(request)
    return [{**r, "verdict": verdict(runs.run(engine, r["id"]))} for r in runs.runs_of_session(engine, session_id)]


def replay_command(request: Request, session_id: str) -> str:
    """The command line that stores a run as the button does, safe to paste: the session
    id is whatever the client named it. The database is named unless it is the default
    (a SQLite path made absolute, a password left out)."""
    from proxy.config import DEFAULT_DB
    from proxy.store.db import shown_url, sqlite_path

    words = ["tooltap", "replay", "session", session_id, "--recorded", "--record-run"]
    db_url = request.app.state.tooltap.settings.db_url
    if db_url != DEFAULT_DB:
        path = sqlite_path(db_url)
        words += ["--db", f"sqlite:///{path.resolve()}" if path else shown_url(db_url)]
    return shlex.join(words)


def converter_replay_available() -> bool:
    return importlib.util.find_spec("proxy.replay.tools") is not None


# -- JSON ----------------------------------------------------------------------------------

@api_router.get("/sessions/{session_id:path}/replays")
def list_runs(request: Request, session_id: str):
    if session_exists(request, session_id + "/replays"):  # a session named so (X-Tooltap-Session)
        from .api import session

        return session(request, session_id + "/replays")
    if not session_exists(request, session_id):
        raise HTTPException(404, f"no session {session_id}")
    return {"runs": session_runs(request, session_id)}


@api_router.get("/replays/{run_id}")
def one_run(request: Request, run_id: int):
    found = runs.run(_engine(request), run_id)
    if found is None:
        raise HTTPException(404, f"no replay run {run_id}")
    return found


@api_router.post("/sessions/{session_id:path}/replays")
def start_replay(request: Request, session_id: str):
    """Replay the session against its recording (and through the converters, when that
    part is installed), store each run, answer with the runs and where to see the first."""
    _refuse_cross_site(request)
    if not session_exists(request, session_id):
        raise HTTPException(404, f"no session {session_id}")
    if not _one_at_a_time.acquire(blocking=False):
        raise HTTPException(409, "a replay is already running; try again when it ends")
    try:
        ids = run_replays(request.app.state.reader, session_id)
    finally:
        _one_at_a_time.release()
    return {"runs": [runs.run(_engine(request), i) | {"report": None} for i in ids],
            "location": f"/_tooltap/replays/{ids[0]}"}


def run_replays(reader, session_id: str) -> list[int]:
    from proxy.replay.compare import Rules
    from proxy.replay.recorded import ReplayFailed, replay_recorded
    from proxy.replay.recording import RecordingError, load

    try:
        recording = load(reader, session_id)
    except RecordingError as exc:
        raise HTTPException(404, str(exc)) from exc
    ids = []
    try:
        result = replay_recorded(recording, speed=0, rules=Rules())
    except ReplayFailed as exc:
        raise HTTPException(503, str(exc)) from exc
    ids.append(runs.save_run(reader.engine, "recorded", session_id, result.target, result.ok, result.to_dict()))
    if converter_replay_available():
        ids.append(_converter_run(reader, recording))
    return ids


def _converter_run(reader, recording) -> int:
    from proxy.replay.tools import ConverterReplay

    report = ConverterReplay().session(recording)
    return runs.save_run(reader.engine, "tools", recording.session_id, "converters", report.ok, report.to_dict())


def _refuse_cross_site(request: Request) -> None:
    if request.headers.get(ACTION_HEADER, "").strip().lower() != "replay":
        raise HTTPException(403, "replays start from the inspector's own button "
                                 "(the X-Tooltap-Action: replay header is missing)")
    origin = request.headers.get("origin")
    if origin is not None and urlsplit(origin).netloc.lower() != request.headers.get("host", "").lower():
        raise HTTPException(403, "a replay cannot be started from another site")


# -- pages ---------------------------------------------------------------------------------

@page_router.get("/replays/{run_id}")
def run_page(request: Request, run_id: int):
    from .pages import templates

    found = runs.run(_engine(request), run_id)
    if found is None:
        raise HTTPException(404, f"no replay run {run_id}")
    numbers = turn_numbers(request.app.state.reader, found["session_id"])
    return templates.TemplateResponse(request, "replay.html", {"r": run_view(found, numbers)})


def run_view(r: dict, numbers: dict[int, int] | None = None) -> dict:
    """A run as its page draws it: per turn, the calls paired row by row with what differs
    marked on each side; a converter replay per provider; any other report as its JSON.
    `numbers` (turn id -> place in the session) names the turns as the session page does."""
    numbers = numbers or {}
    report = r.get("report") or {}
    view = {**r, "settings": [], "turn_views": None, "providers": None, "report_json": None, "verdict": verdict(r)}
    turns = _turns(report)
    if turns is not None:
        settings = report.get("settings") or {}
        views = [turn_view(t, numbers) for t in turns]
        compared = [t for t in views if not t["skipped"]]
        return {**view, "settings": settings_words(settings), "turn_views": views, "word": same_word(settings),
                "same": sum(1 for t in compared if t["ok"]), "skipped": len(views) - len(compared)}
    providers = _providers(report)
    if providers is not None:
        return {**view, "providers": [_provider(p, numbers) for p in providers],
                "unmatched": report.get("unmatched_calls") or [], "errors": report.get("errors") or []}
    return {**view, "report_json": pretty(report)}


def verdict(r: dict) -> str:
    """A run's word for itself, on its page and in its session's list of runs."""
    report = r.get("report") or {}
    turns = _turns(report)
    if turns is not None:
        compared = [t for t in turns if t.get("note") is None]  # a turn with a note was skipped
        if not compared:
            return "nothing compared"
        if r.get("ok"):
            return same_word(report.get("settings") or {})
        return "could not replay" if all(not_replayed(t) for t in compared if not t.get("ok")) else "differs"
    if _providers(report) is not None:  # converters accept or reject calls: nothing is compared for sameness
        return "every call accepted" if r.get("ok") else "calls rejected"
    return "identical" if r.get("ok") else "differs"


def _turns(report) -> list[dict] | None:
    turns = report.get("turns") if isinstance(report, dict) else None
    ok = isinstance(turns, list) and all(isinstance(t, dict) and "turn_id" in t for t in turns)
    return turns if ok else None


def _providers(report) -> list[dict] | None:
    providers = report.get("providers") if isinstance(report, dict) else None
    return providers if isinstance(providers, list) and all(isinstance(p, dict) for p in providers) else None


def _provider(p: dict, numbers: dict[int, int]) -> dict:
    rejected = [x for x in p.get("rejected") or [] if isinstance(x, dict)]
    return {**p, "rejected": [{**x, "n": numbers.get(x.get("turn_id")) or x.get("place")} for x in rejected],
            # one call refused for two reasons is two rejections but one rejected call
            "rejected_calls": len({(x.get("turn_id"), x.get("call_index")) for x in rejected})}


def settings_words(settings: dict) -> list[str]:
    """What the run was told, in words, leaving out what was left at its default (the URL
    is the run's target, shown beside)."""
    out = []
    for key, value in settings.items():
        if key == "url" or value in (None, "", [], {}):
            continue
        if key == "speed":  # 0: no waiting, the default
            out += [] if not value else ["at the recorded timing" if value == 1 else f"{value:g}x the recorded speed"]
        elif key == "model":
            out.append(f"model {value}")
        elif key == "to":
            out.append(f"translated to {value}")
        elif key == "repeat":
            out += [f"each turn {value} times"] if value != 1 else []
        elif key == "order":
            out += [f"calls in {value} order"] if value != "strict" else []
        elif key == "args":
            out += [f"arguments compared as {value}"] if value != "exact" else []
        elif key == "per_tool" and isinstance(value, dict):
            out += [f"{tool}: arguments compared as {mode}" for tool, mode in value.items()]
        elif key == "ignore" and isinstance(value, list):
            out.append("ignoring " + ", ".join(map(str, value)))
        else:
            out.append(f"{key} {value}")
    return out


def turn_view(t: dict, numbers: dict[int, int] | None = None) -> dict:
    diffs = [_difference(d) for d in t.get("differences") or []]
    # (side, call index) -> argument paths that differ. A difference in what was decoded
    # about a call (`tool_calls[0].task_progress`) marks the call, not an argument.
    bad: dict[tuple[str, int], list[str | None]] = {}
    for d in diffs:
        m = _CALL_FIELD.match(d["field"] or "")
        if not m:
            continue
        i, about_arguments = int(m.group(1)), d["field"] == m.group(0)
        sides = {"extra_call": ("replayed",), "missing_call": ("recorded",)}.get(d["kind"], ("recorded", "replayed"))
        for side in sides:
            bad.setdefault((side, i), []).append(d["path"] if about_arguments else None)
    rows = []
    for i, (rec, rep) in enumerate(zip_longest(t.get("recorded_calls") or [], t.get("replayed_calls") or [])):
        rows.append({"index": i, "recorded": _call(rec, bad.get(("recorded", i))),
                     "replayed": _call(rep, bad.get(("replayed", i)))})
    runs_ = t.get("runs") or []
    return {"turn_id": t["turn_id"], "n": (numbers or {}).get(t["turn_id"]) or t.get("place"),
            "ok": bool(t.get("ok")), "error": t.get("error"), "note": t.get("note"),
            "skipped": t.get("note") is not None, "lost": t.get("lost") or [],
            "differences": diffs, "rows": rows, "runs": runs_, "passed": sum(1 for x in runs_ if x),
            "not_replayed": not_replayed(t)}


def _difference(d: dict) -> dict:
    return {"field": d.get("field") or "", "reason": d.get("reason") or "", "path": d.get("path"),
            "kind": d.get("kind"), "expected": _shown(d.get("expected")), "actual": _shown(d.get("actual"))}


def _call(c: dict | None, bad_paths: list | None) -> dict | None:
    if c is None:
        return None
    args = c.get("arguments")
    paths = [p for p in (bad_paths or []) if p]
    if isinstance(args, dict):
        items = [(k, v) for k, v in args.items()]
        keys = [("$." + k if re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", k) else f'$["{k}"]') for k, _ in items]
        rows = [{"key": k, "value": _shown(v), "bad": any(_under(p, path) for p in paths)}
                for (k, v), path in zip(items, keys)]
        # A path the replay added or dropped may name a key this side lacks.
    else:
        rows = [{"key": "$", "value": _shown(args), "bad": bool(paths)}]
    return {"tool": c.get("tool") or c.get("name") or "?", "name": c.get("name") or "",
            "rows": rows, "bad": bad_paths is not None, "bad_paths": paths}


def _under(path: str, key_path: str) -> bool:
    return path == key_path or path.startswith(key_path + ".") or path.startswith(key_path + "[") or path == "$"


def _shown(value: Any) -> str:
    return value if isinstance(value, str) else pretty(value)
