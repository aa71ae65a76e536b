"""Recorded replay end to end: sessions recorded through a real tooltap, replayed through a
fresh one (real uvicorn, real writer, SQLite) against their own recorded bytes, by the
function and by the real CLI."""

from __future__ import annotations

import dataclasses
import json
import sqlite3
import time
import zlib

import httpx
from click.testing import CliRunner

from proxy.cli import main
from proxy.demo import chat_sse, words
from proxy.replay.recorded import replay_recorded
from proxy.replay.recording import load, open_reader
from proxy.replay.result import render_text
from proxy.scripted import Reply
from tests.test_proxy_e2e import play_cline


def recorded(tooltap):
    tooltap.flush()
    sessions = tooltap.api("/sessions")["sessions"]
    assert len(sessions) == 1
    return load(open_reader(f"sqlite:///{tooltap.db_path}"), sessions[0]["id"])


def alter_raw(db_path, turn_id: int, old: bytes, new: bytes) -> None:
    """Edit the exact bytes stored for one turn (same length, so the timeline still fits)."""
    assert len(old) == len(new)
    with sqlite3.connect(db_path) as db:
        (packed,) = db.execute("SELECT raw FROM turns WHERE id = ?", (turn_id,)).fetchone()
        raw = zlib.decompress(packed)
        assert raw.count(old) == 1
        db.execute("UPDATE turns SET raw = ? WHERE id = ?", (zlib.compress(raw.replace(old, new)), turn_id))


def test_cline_weather_replays_identical(tooltap, upstream):
    play_cline(tooltap, upstream, split=None)
    recording = recorded(tooltap)
    result = replay_recorded(recording, speed=0)

    assert result.ok, render_text(result)
    assert [t.turn_id for t in result.turns] == [t.id for t in recording.turns]
    assert all(t.ok and not t.differences and t.error is None for t in result.turns)
    tools = [[c["tool"] for c in t.replayed_calls] for t in result.turns]
    assert tools == [["list_files"], ["read_file"], ["weather/get_forecast"], []]
    assert result.turns[2].replayed_calls == result.turns[2].recorded_calls
    assert result.turns[2].replayed_calls[0]["arguments"]["latitude"] == 38.9072
    assert result.kind == "recorded" and result.settings["speed"] == 0

    # The CLI says the same, with exit 0.
    out = CliRunner().invoke(main, ["replay", "session", recording.session_id, "--recorded",
                                    "--db", f"sqlite:///{tooltap.db_path}"])
    assert out.exit_code == 0, out.output
    assert "4 of 4 turns identical" in out.output


def test_changed_bytes_are_named_turn_field_and_values(tooltap, upstream):
    """The stored bytes of turn 3 no longer say what the stored tool call says: the
    replay decodes the bytes again and names the turn, the field and both values."""
    play_cline(tooltap, upstream, split=None)
    recording = recorded(tooltap)
    turn3 = recording.turns[2]
    alter_raw(tooltap.db_path, turn3.id, b".0369,", b".0368,")  # one fragment of the arguments
    recording = load(open_reader(f"sqlite:///{tooltap.db_path}"), recording.session_id)

    result = replay_recorded(recording, speed=0)
    assert not result.ok
    assert [t.ok for t in result.turns] == [True, True, False, True]
    diffs = result.turns[2].differences
    call = next(d for d in diffs if d.field == "tool_calls[0]")
    assert call.kind == "argument" and call.path == "$.longitude"
    assert (call.expected, call.actual) == (-77.0369, -77.0368)
    assert "weather/get_forecast" in call.reason
    response = [d for d in diffs if d.field == "response"]
    assert response and response[0].path == "$.choices[0].message.tool_calls[0].function.arguments"
    assert diffs[0] is call  # the tool call first, said once: not again as its argument text
    assert not [d for d in diffs if d.field.startswith("tool_calls[0].arguments_raw")]

    out = CliRunner().invoke(main, ["replay", "session", recording.session_id, "--recorded",
                                    "--db", f"sqlite:///{tooltap.db_path}"])
    assert out.exit_code == 1, out.output
    line = next(x for x in out.output.splitlines() if "tool_calls[0]:" in x)
    assert "$.longitude recorded -77.0369, replayed -77.0368" in line
    assert f"DIFF turn 3 (#{turn3.id})" in out.output and "3 of 4 turns identical; 1 differs" in out.output
    assert out.output.splitlines()[0] == f"replay recorded of session {recording.session_id}"

    # --format json carries the same, machine-readably.
    out = CliRunner().invoke(main, ["replay", "session", recording.session_id, "--recorded", "--format", "json",
                                    "--db", f"sqlite:///{tooltap.db_path}"])
    assert out.exit_code == 1
    report = json.loads(out.output)
    assert report["ok"] is False and report["turns"][2]["turn_id"] == turn3.id
    assert "tool_calls[0]" in [d["field"] for d in report["turns"][2]["differences"]]


def test_decoding_status_and_threading_are_compared(tooltap, upstream):
    """A recording whose stored decoding, status or parent differ from what its requests
    and bytes give today: each is named."""
    play_cline(tooltap, upstream, split=None)
    recording = recorded(tooltap)
    t1, t2, t3, t4 = recording.turns
    call = t2.calls[0]
    edited_call = dataclasses.replace(call, task_progress={**call.task_progress, "done": 3},
                                      decoded={**call.decoded, "convention": "cline4"})
    recording.turns = [
        t1,
        dataclasses.replace(t2, calls=[edited_call]),
        dataclasses.replace(t3, parent_id=None, decoding={**t3.decoding, "no_tool_error": True}),
        dataclasses.replace(t4, status="upstream_error"),
    ]
    result = replay_recorded(recording, speed=0)
    assert [t.ok for t in result.turns] == [True, False, False, False]
    by = {t.turn_id: {d.field: d for d in t.differences} for t in result.turns}

    tp = by[t2.id]["tool_calls[0].task_progress"]
    assert tp.path == "$.done" and (tp.expected, tp.actual) == (3, 1)
    decoded = by[t2.id]["tool_calls[0].decoded"]
    assert decoded.path == "$.convention" and (decoded.expected, decoded.actual) == ("cline4", "builtin")
    parent = by[t3.id]["parent"]
    assert (parent.expected, parent.actual) == (None, t2.id)
    assert "as the first turn of its session" in parent.reason and f"child of turn 2 (#{t2.id})" in parent.reason
    assert by[t3.id]["decoding"].path == "$.no_tool_error"
    status = by[t4.id]["status"]
    assert (status.expected, status.actual) == ("upstream_error", "ok")
    # Result pairing was compared too, and agreed: the placeholder and the real result.
    assert "tool_calls[0].result" not in by[t2.id]


def test_turns_are_named_by_their_place_with_the_id_beside(tooltap, upstream):
    """A session that is not the database's first: its turn 1 has another id."""
    upstream.routes["/chat/completions"] = Reply.sse(chat_sse("m", words("hi")))
    r = httpx.post(tooltap.url + "/chat/completions",
                   json={"model": "m", "messages": [{"role": "user", "content": "hi"}]})
    assert r.status_code == 200
    play_cline(tooltap, upstream, split=None)
    tooltap.flush()
    session = next(s for s in tooltap.api("/sessions")["sessions"] if s["turns"] == 4)
    ids = [t["id"] for t in tooltap.api(f"/sessions/{session['id']}")["turns"]]
    assert ids[0] != 1

    out = CliRunner().invoke(main, ["replay", "session", session["id"], "--recorded",
                                    "--db", f"sqlite:///{tooltap.db_path}"])
    assert out.exit_code == 0, out.output
    assert [line.split(":")[0].strip() for line in out.output.splitlines()[1:5]] == [
        f"ok   turn {n} (#{i})" for n, i in enumerate(ids, 1)]
    report = json.loads(CliRunner().invoke(main, ["replay", "session", session["id"], "--recorded", "--format", "json",
                                                  "--db", f"sqlite:///{tooltap.db_path}"]).output)
    assert [(t["place"], t["turn_id"]) for t in report["turns"]] == list(enumerate(ids, 1))

    # A path left out of the comparison: the turns match, they are not said to be identical.
    out = CliRunner().invoke(main, ["replay", "session", session["id"], "--recorded", "--ignore-arg", "latitude",
                                    "--db", f"sqlite:///{tooltap.db_path}"])
    assert out.exit_code == 0 and out.output.splitlines()[-1] == "4 of 4 turns match", out.output


def test_options_of_the_other_mode_are_refused_in_one_line(tooltap, upstream):
    play_cline(tooltap, upstream, split=None)
    session = recorded(tooltap).session_id
    db = ["--db", f"sqlite:///{tooltap.db_path}"]
    for args, says in [
        (["--recorded", "--model", "x"], "--model only applies with --against URL"),
        (["--recorded", "--to", "gemini"], "--to only applies with --against URL"),
        (["--recorded", "--repeat", "3"], "--repeat only applies with --against URL"),
        (["--recorded", "--api-key", "k", "-H", "A: b"], "--api-key and --header only apply with --against URL"),
        (["--against", upstream.url, "--speed", "2"], "--speed only applies with --recorded"),
    ]:
        out = CliRunner().invoke(main, ["replay", "session", session, *args, *db])
        assert out.exit_code == 2, (args, out.output)
        lines = out.output.strip().splitlines()
        assert len(lines) == 1 and lines[0].startswith("Error: ") and says in lines[0], (args, out.output)
    assert not upstream.received[4:]  # nothing was sent: the mistake is said first
    # A key in the environment is for live replays; a recorded one does not mind it.
    out = CliRunner().invoke(main, ["replay", "session", session, "--recorded", *db],
                             env={"TOOLTAP_REPLAY_API_KEY": "k"})
    assert out.exit_code == 0, out.output


def test_speed_follows_the_recorded_timing(tooltap, upstream):
    """A stream recorded with 0.4 s between chunks: --speed 1 takes about as long as it
    did, --speed 4 a quarter of that, --speed 0 no waiting at all. (The gaps are long
    enough that a loaded machine's late wake-ups, ~0.2 s over a replay, stay noise.)"""
    body = {"model": "m", "stream": True, "messages": [{"role": "user", "content": "slowly, please"}]}
    sse = chat_sse("m", words("one two three"), cid="slow")
    upstream.routes["/chat/completions"] = Reply.sse(sse, delay=0.4)
    r = httpx.post(tooltap.url + "/chat/completions", json=body, timeout=20)
    assert r.status_code == 200 and r.content == sse
    recording = recorded(tooltap)
    chunks = recording.turns[0].chunks()
    recorded_s = chunks[-1][0] / 1000
    assert len(chunks) >= 4 and recorded_s >= 0.4 * (len(chunks) - 1)

    took = {}
    for speed in (0, 1, 4):
        runs = []
        for _ in range(2):  # the faster of two: a stall of the machine is not the replay's
            t0 = time.perf_counter()
            result = replay_recorded(recording, speed=speed)
            runs.append(time.perf_counter() - t0)
            assert result.ok, render_text(result)
        took[speed] = min(runs)
    # What a replay costs besides waiting is the same at every speed (give or take a
    # busy machine); the rest is the recorded gaps divided by the speed.
    assert recorded_s * 0.75 <= took[1] - took[0] <= recorded_s + 1.5, took
    assert took[4] - took[0] <= recorded_s / 4 + 1.0, took
    assert took[1] - took[4] >= recorded_s * 0.75 * 0.75, took


def test_unknown_session_is_one_line_and_exit_2(tooltap, upstream):
    upstream.routes["/chat/completions"] = Reply.sse(chat_sse("m", words("hi")))
    httpx.post(tooltap.url + "/chat/completions", json={"model": "m", "messages": [{"role": "user", "content": "hi"}]})
    tooltap.flush()
    out = CliRunner().invoke(main, ["replay", "session", "nope", "--recorded", "--db", f"sqlite:///{tooltap.db_path}"])
    assert out.exit_code == 2
    assert "no session 'nope'" in out.output and "Traceback" not in out.output


def test_every_demo_session_replays_identical(tmp_path):
    """Our own regression suite over the demo's captures: the Cline session, parallel
    calls, an upstream error and a stream the upstream dropped all decode the same when
    replayed from their recorded bytes."""
    from proxy import demo

    db_url = f"sqlite:///{tmp_path / 'demo.db'}"
    with demo.running(db_url=db_url) as d:
        d.play_all()
    reader = open_reader(db_url)
    sessions = reader.sessions()
    statuses = {t["status"] for s in sessions for t in reader.session(s["id"])["turns"]}
    assert {"ok", "upstream_error", "upstream_aborted"} <= statuses
    for s in sessions:
        result = replay_recorded(load(reader, s["id"]), speed=0)
        assert result.ok, render_text(result)


def test_a_session_named_in_utf8_keeps_its_name_and_replays(tooltap, upstream):
    """X-Tooltap-Session in UTF-8 (the bytes a client sends for 'équipe/ü'): the session is
    named as written, not as Latin-1 read it ('Ã©quipe'), and a recorded replay sends the
    name again and threads the same (it raised UnicodeEncodeError)."""
    name = "équipe/ü 日本"
    upstream.routes["/chat/completions"] = Reply.sse(chat_sse("m", words("bonjour")))
    body = {"model": "m", "stream": True, "messages": [{"role": "user", "content": "salut"}]}
    r = httpx.post(f"{tooltap.url}/chat/completions", json=body,
                   headers=[(b"x-tooltap-session", name.encode("utf-8"))])
    assert r.status_code == 200
    recording = recorded(tooltap)
    assert recording.session_id == name
    result = replay_recorded(recording, speed=0)
    assert result.ok, render_text(result)


def test_a_request_without_a_body_and_one_stored_as_text_replay_identical(tooltap, upstream):
    """A model list (GET, no body: stored as null) and a body with NaN in it (not JSON to
    the store: kept as text) are matched as the bytes sent again read, not as stored."""
    upstream.routes["/models"] = Reply.json({"object": "list", "data": [{"id": "m", "object": "model"}]})
    upstream.routes["/chat/completions"] = Reply.json({"id": "c", "object": "chat.completion", "choices": []})
    session = {"x-tooltap-session": "odd-bodies"}
    assert httpx.get(f"{tooltap.url}/models", headers=session).status_code == 200
    nan = b'{"model": "m", "temperature": NaN, "messages": [{"role": "user", "content": "hi"}]}'
    assert httpx.post(f"{tooltap.url}/chat/completions", content=nan,
                      headers={**session, "content-type": "application/json"}).status_code == 200
    recording = recorded(tooltap)
    assert [t.request for t in recording.turns][0] is None and isinstance(recording.turns[1].request, str)
    result = replay_recorded(recording, speed=0)
    assert result.ok and len(result.turns) == 2, render_text(result)
