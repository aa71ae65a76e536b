"""Recorded replay: a stored session sent again through a fresh tooltap, whose upstream is
the recording itself, and what it stores compared with what was stored, turn by turn.

The upstream (`upstream.CassetteUpstream`) answers each request with the exact bytes
recorded for it, at the recorded chunk timing divided by `speed` (0: no waiting). The
fresh tooltap runs on a real uvicorn with its writer, on a SQLite file in a temporary
folder, exactly as `tooltap serve` would. Every field that the proxy, the assemblers and
the decoders produce is then compared: status, the exact bytes, the reassembled
response, the tool calls, their decoding, and how the turns thread into a session. A
difference names the turn, the field, the JSON path where there is one, and both values.
"""

from __future__ import annotations

import hashlib
import json
import re
import tempfile
import time
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Iterator

import httpx

from ..store import content
from ..store.sessions import OTHER_PREFIX
from .compare import ABSENT, Call, Rules, compare_calls, describe, same_value, short, value_diff
from .recording import RecordedCall, RecordedTurn, Recording, turn_name
from .result import Difference, ReplayResult, TurnVerdict
from .upstream import CassetteUpstream, Interaction, decoded_chunks

MAX_PER_FIELD = 10  # differences listed per field of a turn; the rest are counted
MAX_VALUE_CHARS = 2000  # a value kept whole in a Difference up to this size
SESSION_HEADER = "x-tooltap-session"
_GENERATED_ID = re.compile(r"[0-9a-f]{16}")


class ReplayFailed(RuntimeError):
    """The replay could not run at all (no free port, the writer did not start)."""


def replay_recorded(recording: Recording, *, speed: float = 0.0, rules: Rules | None = None) -> ReplayResult:
    """Send `recording`'s requests through a fresh tooltap against its own recorded
    answers and compare what that tooltap stores with what was stored."""
    rules = rules or Rules()
    interactions = [Interaction.from_turn(t) for t in recording.turns]
    cassette = CassetteUpstream(interactions, speed=speed)
    with tempfile.TemporaryDirectory(prefix="tooltap-replay-") as tmp:
        db_url = f"sqlite:///{Path(tmp) / 'replay.db'}"
        with _servers(cassette, db_url) as (url, app):
            errors = _send(url, recording, interactions, cassette, speed)
            _settle(app)
        replayed = _read_back(db_url)
    verdicts = compare_turns(recording, replayed, errors, rules)
    return ReplayResult("recorded", recording.session_id, "recorded", verdicts,
                        settings={"speed": speed, "order": rules.order, "args": rules.args,
                                  "per_tool": dict(rules.per_tool), "ignore": list(rules.ignore)})


# -- running the fresh tooltap -----------------------------------------------------------------

@contextmanager
def _servers(cassette: CassetteUpstream, db_url: str) -> Iterator[tuple[str, Any]]:
    """The cassette and a fresh tooltap in front of it, each on a real uvicorn on a free
    port; yields tooltap's URL and app. Both are stopped together, the writer with them."""
    from ..app import TooltapApp
    from ..config import Settings, Upstream
    from ..demo import Served, free_port
    from ..store.writer import Writer

    started: list[Served] = []
    try:
        try:
            upstream = Served(cassette, "127.0.0.1", free_port(), quiet=True).start()
            started.append(upstream)
            settings = Settings(upstreams=(Upstream.parse(f"http://127.0.0.1:{upstream.port}"),), db_url=db_url)
            # The writer that `tooltap serve` runs in its own process, here in a thread: the
            # same storing and decoding, without a process to spawn (seconds on a busy
            # machine, where its lower priority also starves it).
            app = TooltapApp(settings, writer=Writer(db_url, settings.spool_file()))
            started.append(Served(app, "127.0.0.1", free_port(), quiet=True).start())
        except (RuntimeError, OSError) as exc:
            raise ReplayFailed(f"could not start a tooltap to replay through: {exc}") from exc
        yield f"http://127.0.0.1:{started[-1].port}", app
    finally:
        for served in started:  # ask both at once: each takes a tick of its loop to notice
            served.server.should_exit = True
        for served in started:
            served.thread.join(10)


def _send(url: str, recording: Recording, interactions: list[Interaction], cassette: CassetteUpstream,
          speed: float) -> dict[int, str]:
    """Each stored request in order, the next one after the last answer ends (as the agent
    did). Returns {turn position: why it could not be replayed}."""
    errors: dict[int, str] = {}
    hint = _session_hint(recording.session_id)
    with httpx.Client(base_url=url, timeout=httpx.Timeout(30.0)) as client:
        for n, (turn, i) in enumerate(zip(recording.turns, interactions)):
            headers = list(i.request_headers) + ([(SESSION_HEADER, hint.encode("utf-8"))] if hint else [])
            missed = len(cassette.misses)
            try:
                with client.stream(turn.method, turn.path, content=_body(turn.request), headers=headers,
                                   timeout=httpx.Timeout(30.0, read=_read_timeout(i, speed))) as r:
                    for _ in r.iter_raw():
                        pass
            except httpx.RemoteProtocolError as exc:
                if not i.cut_short:  # a cut the recording had is the answer, compared below
                    errors[n] = f"the fresh tooltap cut the answer short: {exc}"
            except httpx.HTTPError as exc:
                errors[n] = f"the fresh tooltap did not answer: {type(exc).__name__}: {exc}"
            if len(cassette.misses) > missed:
                errors[n] = cassette.misses[-1].explain()
    return errors


def _session_hint(session_id: str) -> str | None:
    """A session named by the agent's X-Tooltap-Session header is named so again; one that
    tooltap threaded itself (a generated id) must thread the same way on its own."""
    if _GENERATED_ID.fullmatch(session_id) or session_id.startswith(OTHER_PREFIX):
        return None
    return session_id


def _body(request: Any) -> bytes | None:
    if request is None or request == "":
        return None
    if isinstance(request, str):
        return request.encode("utf-8")
    return content.compact(request)


def _read_timeout(i: Interaction, speed: float) -> float:
    """Long enough for the slowest recorded gap at this speed, and no longer."""
    if not speed:
        return 60.0
    gaps = [b - a for (a, _), (b, _) in zip([(0.0, b"")] + i.chunks, i.chunks)]
    return 60.0 + max(gaps, default=0.0) / 1000 / speed


def _settle(app) -> None:
    """Wait for the requests still passing through, then for the writer to store them."""
    deadline = time.monotonic() + 10
    while app.forwarder is not None and app.forwarder.in_flight and time.monotonic() < deadline:
        time.sleep(0.002)
    app.writer.flush()


def _read_back(db_url: str) -> list[tuple[str, RecordedTurn]]:
    """Every turn the fresh tooltap stored, in the order it stored them, with its session.

    Everything `recording.load` reads except the requests: they are what was sent, and
    rebuilding them is most of the cost of a load."""
    from sqlmodel import Session as DB, select

    from ..store.db import make_engine
    from ..store.models import ToolCallRow, Turn
    from ..store.read import text_calls_json, tool_call_json

    engine = make_engine(db_url)
    try:
        with DB(engine) as db:
            turns = db.exec(select(Turn).order_by(Turn.id)).all()
            calls: dict[int, list] = {}
            for c in db.exec(select(ToolCallRow).order_by(ToolCallRow.turn_id, ToolCallRow.index)):
                calls.setdefault(c.turn_id, []).append(c)
            out = []
            for t in turns:
                found = [tool_call_json(c) for c in calls.get(t.id, [])]
                found += text_calls_json(t.decoding, len(found))
                out.append((t.session_id, RecordedTurn(
                    id=t.id, parent_id=t.parent_id, api=t.api, method=t.method, path=t.path, status=t.status,
                    http_status=t.http_status, stream=bool(t.stream), model=t.model, request=None,
                    request_headers=t.request_headers or [], response=content.unpack(t.response),
                    response_headers=t.response_headers or [], raw=content.inflate(t.raw),
                    content_type=t.content_type, content_encoding=t.content_encoding,
                    timeline=content.unpack(t.timeline) or [], ttft_ms=t.ttft_ms, duration_ms=t.duration_ms,
                    calls=[RecordedCall.from_api(c) for c in found], decoding=t.decoding)))
            return out
    finally:
        engine.dispose()


# -- comparing ----------------------------------------------------------------------------------

def compare_turns(recording: Recording, replayed: list[tuple[str, RecordedTurn]], errors: dict[int, str],
                  rules: Rules) -> list[TurnVerdict]:
    """One verdict per recorded turn; the replayed turns are matched by position."""
    rec_pos = {t.id: n for n, t in enumerate(recording.turns)}
    rep_pos = {t.id: n for n, (_, t) in enumerate(replayed)}
    first_session = replayed[0][0] if replayed else None
    places = recording.places
    verdicts = []
    for n, rec in enumerate(recording.turns):
        verdict = TurnVerdict(turn_id=rec.id, ok=True, recorded_calls=[_call_dict(c) for c in rec.calls],
                              place=places[rec.id])
        if n in errors:
            verdict.error = errors[n]
        if n >= len(replayed):
            verdict.differences.append(Difference("turn", "the replay stored no turn for this request",
                                                  rec.id, None))
        else:
            session, rep = replayed[n]
            verdict.replayed_calls = [_call_dict(c) for c in rep.calls]
            verdict.differences += compare_turn(rec, rep, rules)
            verdict.differences += _threading(recording, n, rec, rep, rec_pos, rep_pos, session, first_session)
        verdict.ok = not verdict.differences and verdict.error is None
        verdicts.append(verdict)
    if len(replayed) > len(recording.turns):
        extra = [t.id for _, t in replayed[len(recording.turns):]]
        last = verdicts[-1] if verdicts else None
        if last is not None:
            last.differences.append(Difference("turn", f"the replay stored {len(extra)} turn(s) more than "
                                               "were recorded", len(recording.turns), len(replayed)))
            last.ok = False
    return verdicts


def compare_turn(rec: RecordedTurn, rep: RecordedTurn, rules: Rules) -> list[Difference]:
    out: list[Difference] = []
    for name in ("status", "http_status", "api", "stream", "model"):
        want, got = getattr(rec, name), getattr(rep, name)
        if want != got:
            out.append(Difference(name, f"recorded {short(want)}, replayed {short(got)}", want, got))
    # The tool calls first: what a person looks for, named by tool and argument path.
    out += _calls(rec.calls, rep.calls, rules)
    out += _values("decoding", rec.decoding, rep.decoding)
    out += _values("response", rec.response, rep.response)
    out += _raw(rec, rep)
    return out


def _raw(rec: RecordedTurn, rep: RecordedTurn) -> list[Difference]:
    """The exact bytes the agent got. A recording that arrived compressed was served
    decoded (see `Interaction.from_turn`), so its decoded bytes are what must come back."""
    want = b"".join(c for _, c in decoded_chunks(rec.chunks(), rec.content_encoding)) \
        if rec.content_encoding not in (None, "", "identity") else rec.raw
    got = rep.raw
    if want == got:
        return []
    at = next((i for i, (a, b) in enumerate(zip(want, got)) if a != b), min(len(want), len(got)))
    reason = (f"the exact bytes differ from byte {at}: recorded {len(want)} bytes (sha256 "
              f"{_sha(want)}), replayed {len(got)} bytes (sha256 {_sha(got)})")
    return [Difference("raw", reason, _around(want, at), _around(got, at), path=f"byte {at}")]


def _sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()[:16]


def _around(data: bytes, at: int, context: int = 60) -> str:
    start = max(0, at - context)
    text = data[start:at + context].decode("utf-8", "replace")
    return ("…" if start else "") + text + ("…" if at + context < len(data) else "")


def _calls(recorded: list[RecordedCall], replayed: list[RecordedCall], rules: Rules) -> list[Difference]:
    """Which tools with which arguments (compare.py, under `rules`), then, call by call,
    everything the decoders said about each: names, task_progress, result pairing."""
    out = [Difference(f"tool_calls[{m.index}]", m.reason, _kept(m.expected), _kept(m.actual), m.path, m.kind)
           for m in compare_calls(map(_call, recorded), map(_call, replayed), rules)]
    if rules.order != "strict":
        return out  # the calls need not line up one to one: nothing more to pair
    for i, (a, b) in enumerate(zip(recorded, replayed)):
        if a.tool != b.tool:
            continue  # already reported as another tool
        for name in ("name", "id"):
            if getattr(a, name) != getattr(b, name):
                out.append(Difference(f"tool_calls[{i}].{name}", f"call {i}: {name} recorded "
                                      f"{short(getattr(a, name))}, replayed {short(getattr(b, name))}",
                                      getattr(a, name), getattr(b, name)))
        # The text of equal arguments (spacing, key order): a difference the values hide.
        if rules.args == "exact" and a.arguments_raw != b.arguments_raw and same_value(a.arguments, b.arguments):
            out += _values(f"tool_calls[{i}].arguments_raw", a.arguments_raw, b.arguments_raw)
        for name in ("decoded", "task_progress", "result", "violations"):
            out += _values(f"tool_calls[{i}].{name}", getattr(a, name), getattr(b, name))
    return out


def _call(c: RecordedCall) -> Call:
    return Call(c.tool, c.arguments, c.name)


def _call_dict(c: RecordedCall) -> dict:
    return {"tool": c.tool, "name": c.name, "arguments": c.arguments}


def _values(field: str, want: Any, got: Any) -> list[Difference]:
    """Where two JSON values differ, path by path, the first MAX_PER_FIELD of them."""
    found = value_diff("$", want, got)
    out = [Difference(field, describe(a, b) if path == "$" else f"{path}: {describe(a, b)}", _kept(a), _kept(b),
                      path=None if path == "$" else path)
           for path, a, b in found[:MAX_PER_FIELD]]
    if len(found) > MAX_PER_FIELD:
        out.append(Difference(field, f"... and {len(found) - MAX_PER_FIELD} more differences in {field}"))
    return out


def _kept(value: Any) -> Any:
    """A value as a Difference keeps it: whole when small, else its beginning as text."""
    if value is ABSENT:
        return None
    text = value if isinstance(value, str) else json.dumps(value, ensure_ascii=False, default=str)
    if len(text) <= MAX_VALUE_CHARS:
        return value
    return text[:MAX_VALUE_CHARS] + f"… ({len(text)} characters)"


def _threading(recording: Recording, n: int, rec: RecordedTurn, rep: RecordedTurn, rec_pos: dict, rep_pos: dict,
               session: str, first_session: str | None) -> list[Difference]:
    """The replayed turns must form one session with the recorded parent structure."""
    out = []
    want = rec_pos.get(rec.parent_id) if rec.parent_id is not None else None
    got = rep_pos.get(rep.parent_id) if rep.parent_id is not None else None
    if want != got:
        out.append(Difference("parent", f"recorded {_parent_words(recording, want)}, replayed "
                              f"{_parent_words(recording, got)}",
                              None if want is None else recording.turns[want].id,
                              None if got is None else recording.turns[got].id if got < len(recording.turns) else None))
    if n and session != first_session:
        out.append(Difference("session", "the replay put this turn in another session than the first turn's "
                              "(the session split here)", first_session, session))
    return out


def _parent_words(recording: Recording, pos: int | None) -> str:
    if pos is None:
        return "as the first turn of its session"
    if pos >= len(recording.turns):
        return "as a child of a turn that was not recorded"
    parent = recording.turns[pos].id
    return f"as a child of {turn_name(recording.places[parent], parent)}"
