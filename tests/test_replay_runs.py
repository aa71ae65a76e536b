"""Stored replay runs: the store (SQLite, and Postgres when TOOLTAP_TEST_POSTGRES is set),
the JSON API and the POST that starts a replay, and the pages in a real headless browser."""

from __future__ import annotations

import html
import json
import re
import sqlite3
import zlib
from pathlib import Path
from urllib.parse import quote

import httpx
import pytest
from alembic import command
from click.testing import CliRunner
from sqlalchemy import create_engine, inspect, text

from proxy.cli import main
from proxy.demo import chat_sse, words
from proxy.replay.runs import run, runs_of_session, save_run
from proxy.scripted import Reply
from proxy.store.db import alembic_config, make_engine
from tests.conftest import postgres_url
from tests.test_proxy_e2e import play_cline

ACTION = {"X-Tooltap-Action": "replay"}
SHOT = Path("/work/notes/replay-run.png")
XSS_SCRIPT = "<script>window.__xss=2;alert(2)</script>"
XSS_IMG = '<img src=x onerror="window.__xss=1;alert(1)">'


# -- the store -------------------------------------------------------------------------------

def backends() -> list[str]:
    return ["sqlite"] + (["postgres"] if postgres_url() else [])


@pytest.fixture(params=backends())
def engine(request, tmp_path):
    if request.param == "sqlite":
        url = f"sqlite:///{tmp_path / 'runs.db'}"
    else:
        url = postgres_url()
        with create_engine(url).begin() as conn:  # a clean schema for this run
            conn.execute(text("DROP SCHEMA public CASCADE; CREATE SCHEMA public"))
    e = make_engine(url)
    yield e
    e.dispose()


def report(ok: bool, pass_hat_k=None) -> dict:
    return {"kind": "live", "session_id": "s1", "target": "http://x", "ok": ok, "pass_hat_k": pass_hat_k,
            "settings": {"repeat": 3},
            "turns": [{"turn_id": 1, "ok": True, "differences": []},
                      {"turn_id": 2, "ok": ok, "differences": [] if ok else [
                          {"field": "tool_calls[0]", "reason": "call 0: 'a' → 'b' ✓", "expected": 1, "actual": 1.5}]}]}


def test_save_and_read_runs_round_trip(engine):
    first = save_run(engine, "recorded", "s1", "recorded", True, report(True))
    second = save_run(engine, "live", "s1", "http://127.0.0.1:9/v1 (anthropic)", False, report(False, 2 / 3))
    save_run(engine, "tools", "s2", "converters", True, {"session_id": "s2", "providers": []})

    listed = runs_of_session(engine, "s1")
    assert [r["id"] for r in listed] == [second, first]  # newest first
    assert listed[0] == {"id": second, "session_id": "s1", "kind": "live",
                         "target": "http://127.0.0.1:9/v1 (anthropic)", "ok": False,
                         "created_at": listed[0]["created_at"], "turns": 2, "differing": 1,
                         "pass_hat_k": pytest.approx(2 / 3)}
    assert listed[0]["created_at"].endswith("Z") and "report" not in listed[0]
    assert run(engine, second)["report"] == report(False, 2 / 3)  # unicode, floats and all
    assert [r["kind"] for r in runs_of_session(engine, "s2")] == ["tools"]
    assert runs_of_session(engine, "nobody") == [] and run(engine, 10_000) is None


def test_save_run_refuses_an_unknown_kind(engine):
    with pytest.raises(ValueError, match="replay run kind 'converter'"):
        save_run(engine, "converter", "s1", "x", True, {})


def test_save_run_upgrades_an_older_database(tmp_path):
    """`--record-run` may write to a database a tooltap before replay runs created."""
    url = f"sqlite:///{tmp_path / 'old.db'}"
    command.upgrade(alembic_config(url), "0001")
    e = make_engine(url)
    assert "replay_runs" not in inspect(e).get_table_names()
    n = save_run(e, "recorded", "s1", "recorded", True, report(True))
    assert run(e, n)["ok"] is True
    with sqlite3.connect(tmp_path / "old.db") as db:  # stored compressed, like the rest of the store
        (packed,) = db.execute("SELECT report FROM replay_runs").fetchone()
    assert json.loads(zlib.decompress(packed)) == report(True)


# -- the API ---------------------------------------------------------------------------------

def session_id(tooltap) -> str:
    tooltap.flush()
    return tooltap.api("/sessions")["sessions"][0]["id"]


def test_api_lists_starts_and_shows_runs(tooltap, upstream):
    play_cline(tooltap, upstream, split=None)
    sid = session_id(tooltap)
    api = f"{tooltap.url}/_tooltap/api"
    assert httpx.get(f"{api}/sessions/{sid}/replays").json() == {"runs": []}
    assert httpx.get(f"{api}/sessions/nope/replays").status_code == 404
    assert httpx.get(f"{api}/replays/999").status_code == 404
    assert httpx.get(f"{api}/replays/{2**70}").status_code == 404
    assert httpx.get(f"{tooltap.url}/_tooltap/replays/{2**70}").status_code == 404

    # A POST another site could make (no custom header, or another Origin) starts nothing.
    refused = httpx.post(f"{api}/sessions/{sid}/replays")
    assert refused.status_code == 403 and "X-Tooltap-Action" in refused.json()["detail"]
    foreign = httpx.post(f"{api}/sessions/{sid}/replays", headers={**ACTION, "Origin": "http://evil.example"})
    assert foreign.status_code == 403
    assert httpx.get(f"{api}/sessions/{sid}/replays").json() == {"runs": []}
    assert httpx.post(f"{api}/sessions/nope/replays", headers=ACTION).status_code == 404

    started = httpx.post(f"{api}/sessions/{sid}/replays", timeout=60,
                         headers={**ACTION, "Origin": tooltap.url})
    assert started.status_code == 200, started.text
    body = started.json()
    assert [r["kind"] for r in body["runs"]] == ["recorded", "tools"]
    recorded, tools = body["runs"]
    assert recorded["ok"] is True and recorded["turns"] == 4 and recorded["differing"] == 0
    assert body["location"] == f"/_tooltap/replays/{recorded['id']}"

    listed = httpx.get(f"{api}/sessions/{sid}/replays").json()["runs"]
    assert {r["id"] for r in listed} == {r["id"] for r in body["runs"]}
    one = httpx.get(f"{api}/replays/{recorded['id']}").json()
    assert one["report"]["kind"] == "recorded" and one["report"]["session_id"] == sid
    assert [c["tool"] for c in one["report"]["turns"][2]["replayed_calls"]] == ["weather/get_forecast"]

    # The session page lists the runs; the run page shows them.
    page = httpx.get(f"{tooltap.url}/_tooltap/sessions/{sid}").text
    assert f'href="/_tooltap/replays/{recorded["id"]}"' in page and 'data-testid="replay-button"' in page
    run_page = httpx.get(f"{tooltap.url}{body['location']}").text
    assert "identical" in run_page and "weather/get_forecast" in run_page

    # The converter replay beside it: the MCP schema forbids the task_progress Cline sent.
    assert tools["ok"] is False and tools["target"] == "converters"
    tools_page = httpx.get(f"{tooltap.url}/_tooltap/replays/{tools['id']}").text
    assert 'data-testid="providers"' in tools_page and "task_progress" in tools_page
    assert '<span class="verdict v-bad" data-testid="verdict">calls rejected</span>' in tools_page


def test_a_session_named_by_its_client_replays_under_its_name(tooltap, upstream):
    """X-Tooltap-Session ids may hold '/'; the replay names its session the same way."""
    upstream.routes["/chat/completions"] = [Reply.sse(chat_sse("m", words(w))) for w in ("one", "two")]
    for text_ in ("first", "second"):  # two unrelated conversations, one session by name
        r = httpx.post(tooltap.url + "/chat/completions", headers={"X-Tooltap-Session": "team/alice"},
                       json={"model": "m", "stream": True, "messages": [{"role": "user", "content": text_}]})
        assert r.status_code == 200
    tooltap.flush()
    api = f"{tooltap.url}/_tooltap/api"
    started = httpx.post(f"{api}/sessions/team/alice/replays", headers=ACTION, timeout=60)
    assert started.status_code == 200, started.text
    recorded = started.json()["runs"][0]
    assert recorded["session_id"] == "team/alice" and recorded["ok"] is True and recorded["turns"] == 2
    assert recorded["id"] in [r["id"] for r in httpx.get(f"{api}/sessions/team/alice/replays").json()["runs"]]


def test_cli_record_run_is_listed(tooltap, upstream):
    play_cline(tooltap, upstream, split=None)
    sid = session_id(tooltap)
    out = CliRunner().invoke(main, ["replay", "session", sid, "--recorded", "--record-run",
                                    "--db", f"sqlite:///{tooltap.db_path}"])
    assert out.exit_code == 0, out.output
    runs = tooltap.api(f"/sessions/{sid}/replays")["runs"]
    assert [(r["kind"], r["target"], r["ok"], r["turns"]) for r in runs] == [("recorded", "recorded", True, 4)]


def weather_call(city: str) -> Reply:
    return Reply.json({"id": "c", "object": "chat.completion", "model": "m", "choices": [{
        "index": 0, "finish_reason": "tool_calls", "message": {"role": "assistant", "content": None, "tool_calls": [
            {"id": "call_1", "type": "function",
             "function": {"name": "get_weather", "arguments": json.dumps({"city": city})}}]}}]})


def test_a_live_run_page_says_what_was_set_and_names_turns_by_place(tooltap, upstream):
    upstream.routes["/chat/completions"] = [Reply.json({"error": {"message": "overloaded"}}, status=503),
                                            weather_call("Paris"), weather_call("Lyon")]
    for task in ("failed task", "weather task"):  # two sessions: the second's turn 1 is turn #2
        httpx.post(tooltap.url + "/chat/completions", timeout=10,
                   json={"model": "m", "messages": [{"role": "user", "content": task}]})
    tooltap.flush()
    by_title = {s["title"]: s["id"] for s in tooltap.api("/sessions")["sessions"]}
    failed, weather = by_title["failed task"], by_title["weather task"]

    def live(session: str, *args: str) -> dict:
        out = CliRunner().invoke(main, ["replay", "session", session, "--against", upstream.url, "--record-run",
                                        *args, "--db", f"sqlite:///{tooltap.db_path}"])
        assert out.exception is None or isinstance(out.exception, SystemExit), out.output
        return tooltap.api(f"/sessions/{session}/replays")["runs"][0]

    def shown(run_id: int, testid: str) -> list[str]:
        page = httpx.get(f"{tooltap.url}/_tooltap/replays/{run_id}").text
        found = re.findall(rf'data-testid="{testid}"[^>]*>(.*?)</(?:span|div|article)>', page, re.S)
        return [" ".join(re.sub(r"<[^>]+>", " ", x).split()) for x in found]

    run_ = live(weather, "--model", "m2", "--ignore-arg", "city")  # Lyon where Paris was recorded
    assert run_["ok"] is True
    assert shown(run_["id"], "verdict") == ["match"]  # city differed: not identical
    assert shown(run_["id"], "turn-counts") == ["1 of 1 turns match"]
    assert shown(run_["id"], "setting") == ["model m2", "ignoring city"]  # no "to None", no "per_tool {}"
    page = httpx.get(f"{tooltap.url}/_tooltap/replays/{run_['id']}").text
    assert 'turn 1 <span class="turn-id">#2</span></a>' in page and "None" not in page
    listed = httpx.get(f"{tooltap.url}/_tooltap/api/sessions/{weather}/replays").json()["runs"]
    assert [r["verdict"] for r in listed if r["id"] == run_["id"]] == ["match"]  # the session page's word too

    run_ = live(failed)  # its only turn failed when recorded: skipped, nothing compared
    assert run_["ok"] is False and (run_["turns"], run_["differing"]) == (0, 0)
    assert shown(run_["id"], "verdict") == ["nothing compared"]
    assert shown(run_["id"], "turn-counts") == ["0 of 1 turns identical, 1 skipped"]
    row = httpx.get(f"{tooltap.url}/_tooltap/sessions/{failed}").text
    row = row[row.index('data-testid="runs"'):]
    assert "nothing compared" in row[:row.index("</tr>", row.index("<tbody>"))]


# -- in a real browser -----------------------------------------------------------------------

def hostile_session(tooltap, upstream) -> str:
    """Two turns whose tool call carries markup in its arguments."""
    args = json.dumps({"path": "notes/" + XSS_IMG, "content": XSS_SCRIPT, "line": 7})
    upstream.routes["/chat/completions"] = [
        Reply.sse(chat_sse("m", words("Writing it.") + [{"tool_calls": [{
            "index": 0, "id": "call_x", "type": "function",
            "function": {"name": "write_to_file", "arguments": args}}]}], finish="tool_calls")),
        Reply.sse(chat_sse("m", words("Done."))),
    ]
    tools = [{"type": "function", "function": {"name": "write_to_file", "description": "Write a file.",
                                               "parameters": {"type": "object"}}}]
    first = {"model": "m", "stream": True, "tools": tools,
             "messages": [{"role": "user", "content": "save a note " + XSS_SCRIPT}]}
    second = {**first, "messages": first["messages"] + [
        {"role": "assistant", "content": "Writing it.", "tool_calls": [
            {"id": "call_x", "type": "function", "function": {"name": "write_to_file", "arguments": args}}]},
        {"role": "tool", "tool_call_id": "call_x", "content": "written"}]}
    for body in (first, second):
        assert httpx.post(tooltap.url + "/chat/completions", json=body, timeout=10).status_code == 200
    return session_id(tooltap)


def test_replay_from_the_session_page_shows_both_columns(tooltap, upstream, page):
    sid = hostile_session(tooltap, upstream)
    first_turn = tooltap.api(f"/sessions/{sid}")["turns"][0]["id"]
    # The stored bytes now say line 8 where the stored call says 7: the replay must differ.
    with sqlite3.connect(tooltap.db_path) as db:
        (packed,) = db.execute("SELECT raw FROM turns WHERE id = ?", (first_turn,)).fetchone()
        raw = zlib.decompress(packed)
        assert raw.count(b'\\"line\\": 7') == 1
        db.execute("UPDATE turns SET raw = ? WHERE id = ?",
                   (zlib.compress(raw.replace(b'\\"line\\": 7', b'\\"line\\": 8')), first_turn))

    page.goto(f"{tooltap.url}/_tooltap/sessions/{sid}")
    assert "No replays of this session yet" in page.locator("[data-testid=replays]").inner_text()
    page.click("[data-testid=replay-button]")
    page.wait_for_url("**/_tooltap/replays/*")

    assert page.locator("[data-testid=verdict]").inner_text() == "differs"
    turn = page.locator("[data-testid=replay-turn]").first
    assert "differs" in turn.locator(".turn-head").inner_text()
    differences = turn.locator("[data-testid=differences]").inner_text()
    assert "tool_calls[0]" in differences and "$.line" in differences and "recorded 7, replayed 8" in differences
    recorded, replayed = turn.locator("[data-testid=recorded-call]"), turn.locator("[data-testid=replayed-call]")
    assert recorded.count() == replayed.count() == 1
    for side, line in ((recorded, "7"), (replayed, "8")):
        assert "mismatch" in side.get_attribute("class")
        bad = side.locator("tr.mismatch")
        assert bad.count() == 1 and bad.locator("th").inner_text() == "line" and bad.locator("td").inner_text() == line
        text_ = side.inner_text()
        assert XSS_SCRIPT in text_ and XSS_IMG in text_  # captured markup, shown as text
    assert page.locator("[data-testid=replay-turn]").nth(1).locator(".verdict").inner_text() == "identical"
    assert page.locator("main script").count() == 0 and page.locator("main img").count() == 0
    assert page.evaluate("window.__xss") is None and page.dialogs == []
    SHOT.parent.mkdir(parents=True, exist_ok=True)
    page.screenshot(path=str(SHOT), full_page=True)

    # Back on the session page, the run is listed with its verdict.
    page.goto(f"{tooltap.url}/_tooltap/sessions/{sid}")
    row = page.locator("[data-testid=runs] tbody tr").filter(has_text="recorded").first
    assert "differs" in row.inner_text() and "1/2" in row.inner_text()


def test_the_replay_command_a_session_page_suggests_is_safe_to_paste(tooltap, upstream, tmp_path):
    """The session id is whatever the client sent in X-Tooltap-Session: the suggested
    command quotes it, so pasted into a shell it replays that session and runs nothing."""
    import shlex
    import subprocess

    name = "x$(touch PWNED) `id` it's"
    upstream.routes["/chat/completions"] = Reply.sse(chat_sse("m", words("hi")))
    httpx.post(f"{tooltap.url}/chat/completions", headers={"x-tooltap-session": name},
               json={"model": "m", "stream": True, "messages": [{"role": "user", "content": "hi"}]})
    tooltap.flush()
    page = httpx.get(f"{tooltap.url}/_tooltap/sessions/{quote(name, safe='/')}").text
    shown = re.search(r'data-testid="replay-command">(.*?)</code>', page).group(1)
    line = html.unescape(shown)
    argv = shlex.split(line)
    assert argv[:4] == ["tooltap", "replay", "session", name] and argv[4:6] == ["--recorded", "--record-run"]
    assert argv[6:] == ["--db", f"sqlite:///{tooltap.db_path.resolve()}"]  # not the default database
    subprocess.run(["bash", "-c", "tooltap() { :; }; " + line], cwd=tmp_path, check=True, timeout=10)
    assert not (tmp_path / "PWNED").exists()


def test_the_replay_button_leaves_the_servers_log_as_it_was(upstream, tmp_path):
    """A replay runs a fresh tooltap inside `tooltap serve`'s process: its requests and its
    stop are not logged as if the server itself had stopped."""
    import signal
    import time

    from tests.processes import start

    upstream.routes["/chat/completions"] = Reply.sse(chat_sse("m", words("hi there")))
    tt = start(tmp_path, "--upstream", upstream.url)
    try:
        httpx.post(f"{tt.url}/chat/completions", timeout=30,
                   json={"model": "m", "stream": True, "messages": [{"role": "user", "content": "hi"}]})
        deadline = time.monotonic() + 20
        while not (sessions := httpx.get(f"{tt.url}/_tooltap/api/sessions").json()["sessions"]):
            assert time.monotonic() < deadline, tt.output()
            time.sleep(0.1)
        before = tt.output()
        started = httpx.post(f"{tt.url}/_tooltap/api/sessions/{sessions[0]['id']}/replays", headers=ACTION, timeout=60)
        assert started.status_code == 200 and started.json()["runs"][0]["ok"] is True
        added = tt.output()[len(before):]
        assert "stopping" not in added and "stopped" not in added and "HTTP Request" not in added, added
    finally:
        tt.signal(signal.SIGINT)
        assert tt.wait(15) == 0
    assert tt.output().count("stopping (SIGINT)") == 1  # its own stop still is
