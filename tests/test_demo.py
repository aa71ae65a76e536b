"""`tooltap demo` and the serve options it shares: scenarios land as expected sessions, the
inspector refuses to face a network without a token."""

from __future__ import annotations

import os
import signal
import sqlite3
import subprocess
import sys
import time

import httpx
from click.testing import CliRunner

from proxy import demo
from proxy.cli import main
from proxy.config import Settings
from tests.conftest import free_port


def test_demo_plays_every_scenario_through_tooltap(tmp_path):
    with demo.running(db_url=f"sqlite:///{tmp_path}/demo.db") as d:
        d.play_all()
        sessions = httpx.get(d.url + "/_tooltap/api/sessions").json()["sessions"]
        by_model = {s["models"][0]: s for s in sessions if not s["title"].startswith("What's the weather")}
        assert set(by_model) == {"deepseek-chat", "gpt-4.1-mini", "claude-sonnet-4-5", "qwen3-coder"}
        assert by_model["deepseek-chat"]["turns"] == 4 and by_model["deepseek-chat"]["tool_calls"] == 3
        # The English Cline session: a retried request is a branch of its session, and
        # its second request offers a newer tool set, which the schemas page compares.
        seattle = next(s for s in sessions if s["title"].startswith("What's the weather in Seattle"))
        turns = httpx.get(f"{d.url}/_tooltap/api/sessions/{seattle['id']}").json()["turns"]
        assert [t["status"] for t in turns] == ["ok", "upstream_error", "ok"]
        assert turns[1]["parent_id"] == turns[2]["parent_id"] == turns[0]["id"]
        html = httpx.get(f"{d.url}/_tooltap/sessions/{seattle['id']}").text
        assert "branch 2/2 from turn 1 " in html and "Service temporarily unavailable" in html
        # Its turns are named by their places in it, whatever their ids (other sessions came first).
        assert turns[0]["id"] > 1
        for n, t in enumerate(turns, 1):
            assert f'turn {n} <span class="turn-id">#{t["id"]}</span>' in html
        # Its MCP server's side was recorded too, and the call is tied to the turn that made it.
        servers = httpx.get(d.url + "/_tooltap/api/mcp/servers").json()["servers"]
        assert [(s["name"], s["calls"], s["errors"]) for s in servers] == [("weather", 1, 0)]
        # The forecast reached the model in the retry, not in the request the upstream refused.
        (call,) = httpx.get(f"{d.url}/_tooltap/api/turns/{turns[0]['id']}").json()["tool_calls"]
        assert call["mcp"]["next_turn_id"] == turns[2]["id"] and call["mcp"]["result_match"] == "same"
        assert f'in <a href="#turn-{turns[2]["id"]}">turn 3 <span class="muted">#{turns[2]["id"]}</span>' in html
        turn_page = httpx.get(f"{d.url}/_tooltap/turns/{turns[0]['id']}").text  # no anchors there: the turn's page
        assert f'in <a href="/_tooltap/turns/{turns[2]["id"]}">turn 3 <span class="muted">#{turns[2]["id"]}</span>' \
            in turn_page
        # The Chinese session ran before that server was recorded: its calls are not news.
        chinese = next(s for s in sessions if s["title"].startswith("华盛顿"))
        assert httpx.get(f"{d.url}/_tooltap/api/mcp/sessions/{chinese['id']}").json()["unreached"] == []
        mcp_page = httpx.get(d.url + "/_tooltap/mcp/weather").text
        assert f'#turn-{turns[0]["id"]}">turn 1 <span class="muted">#{turns[0]["id"]}</span></a>' in mcp_page
        assert "<code>get_alerts</code>, <code>get_forecast</code>" in mcp_page  # its tools/list
        tools = httpx.get(f"{d.url}/_tooltap/sessions/{seattle['id']}/tools").text
        assert f'1 call in turn <a href="/_tooltap/sessions/{seattle["id"]}#turn-{turns[0]["id"]}">1</a>' in tools
        page = httpx.get(f"{d.url}/_tooltap/turns/{turns[2]['id']}").text
        assert f'turn 3 <span class="muted">of 3 · #{turns[2]["id"]}</span>' in page
        assert f'turn 1 <span class="muted">#{turns[0]["id"]}</span>' in page  # its parent
        schemas = httpx.get(f"{d.url}/_tooltap/schemas", params={"a": f"turn:{turns[0]['id']}",
                                                                 "b": f"turn:{turns[2]['id']}"}).text
        assert "weather › get_forecast" in schemas and "$.parameters.properties.days" in schemas
        # With nothing chosen, the schemas page opens on that change.
        assert "$.parameters.properties.days" in httpx.get(f"{d.url}/_tooltap/schemas").text
        assert by_model["gpt-4.1-mini"]["tool_calls"] == 2
        statuses = {t["model"]: t["status"] for t in httpx.get(d.url + "/_tooltap/api/turns").json()["turns"]}
        assert statuses["claude-sonnet-4-5"] == "upstream_error"
        assert statuses["qwen3-coder"] == "upstream_aborted"
        parallel = httpx.get(f"{d.url}/_tooltap/api/sessions/{by_model['gpt-4.1-mini']['id']}").json()
        calls = httpx.get(f"{d.url}/_tooltap/api/turns/{parallel['turns'][0]['id']}").json()["tool_calls"]
        assert [c["arguments"]["city"] for c in calls] == ["Paris", "Tokyo"]
        assert calls[1]["violations"]  # "kelvin" is not in the enum
        page = httpx.get(d.inspector)
        assert page.status_code == 200 and "华盛顿明天天气如何？" in page.text


def test_slow_haiku_streams(tmp_path):
    with demo.running(db_url=f"sqlite:///{tmp_path}/demo.db") as d:
        assert d.play(demo.slow_haiku(delay=0.01)) == [200]


def test_serve_and_demo_refuse_a_public_host_without_a_token(monkeypatch):
    monkeypatch.delenv("TOOLTAP_UI_TOKEN", raising=False)
    runner = CliRunner()
    for args in (["serve", "--upstream", "http://127.0.0.1:9", "--host", "0.0.0.0"],
                 ["demo", "--host", "192.168.1.10"]):
        r = runner.invoke(main, args)
        assert r.exit_code == 2 and "--ui-token" in r.output, r.output


def test_loopback_hosts():
    from inspector_ui.security import is_loopback_name

    assert all(is_loopback_name(h) for h in ("127.0.0.1", "localhost", "::1", "[::1]", "127.1.2.3"))
    assert not any(is_loopback_name(h) for h in ("0.0.0.0", "::", "10.0.0.1", "example.com",
                                                  "127.0.0.1.attacker.example", "localhost.evil"))


def _demo(args: list[str], cwd, tmp, log) -> subprocess.Popen:
    """`tooltap demo` started from `cwd`, its temporary folder in `tmp`, once its sessions
    are played."""
    env = {**os.environ, "TMPDIR": str(tmp)}
    for name in ("TOOLTAP_DB", "TOOLTAP_SPOOL", "TOOLTAP_JOURNAL", "TOOLTAP_UI_TOKEN"):
        env.pop(name, None)
    with open(log, "wb") as out:
        proc = subprocess.Popen([sys.executable, "-m", "proxy", "demo", "--live-every", "0",
                                 "--port", str(free_port()), *args], cwd=cwd, env=env, stdout=out,
                                stderr=subprocess.STDOUT, start_new_session=True)
    deadline = time.monotonic() + 60
    while "Ctrl-C to stop" not in log.read_text(errors="replace"):
        if proc.poll() is not None or time.monotonic() > deadline:
            os.killpg(proc.pid, signal.SIGKILL)
            raise AssertionError(log.read_text(errors="replace"))
        time.sleep(0.1)
    return proc


def _modes(folder, pattern: str) -> dict[str, str]:
    return {p.name: oct(p.stat().st_mode & 0o777) for p in folder.glob(pattern)}


def test_demo_keeps_its_journal_beside_its_database_and_leaves_no_file_behind(tmp_path):
    """`demo --db PATH` (a bare path) stores as `serve --db PATH` does: spool and journal
    beside the database, never in the folder it was started from; the demo's own temporary
    database is owner-only, as serve makes a database, and goes with its folder."""
    cwd, tmp, data = tmp_path / "cwd", tmp_path / "tmp", tmp_path / "data"
    for folder in (cwd, tmp, data):
        folder.mkdir()
    for args in ([], ["--db", str(data / "x.db")]):
        log = tmp_path / f"demo{len(args)}.log"
        proc = _demo(args, cwd, tmp, log)
        try:
            if args:
                assert (data / ".x.db.journal").is_dir()
                database = _modes(data, "x.db*")
            else:
                (own,) = tmp.glob("tooltap-demo-*")
                database = _modes(own, "demo.db*")
            assert "demo.db" in database or "x.db" in database, database
            assert set(database.values()) == {"0o600"}, database  # the -wal and -shm too
            assert list(cwd.iterdir()) == []
            proc.send_signal(signal.SIGINT)
            assert proc.wait(30) == 0, log.read_text()
        finally:
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGKILL)
        assert list(cwd.iterdir()) == [] and list(tmp.iterdir()) == [], log.read_text()
        assert "Traceback" not in log.read_text()
    with sqlite3.connect(data / "x.db") as db:
        turns = db.execute("SELECT count(*) FROM turns").fetchone()[0]
    assert turns >= 10
    # A database that holds turns (the demo's own, or an agent's) is not played into again.
    again = CliRunner().invoke(main, ["demo", "--db", str(data / "x.db")])
    assert again.exit_code == 2 and f"already holds {turns:,} turns: the demo's made-up sessions" in again.output
    with sqlite3.connect(data / "x.db") as db:
        assert db.execute("SELECT count(*) FROM turns").fetchone()[0] == turns


def test_a_bare_database_path_has_its_spool_beside_it():
    settings = Settings(upstreams=(), db_url="/srv/tooltap/x.db")
    assert settings.spool_file() == "/srv/tooltap/x.db.spool.jsonl"
    assert Settings(upstreams=(), db_url="sqlite:///x.db").spool_file() == "x.db.spool.jsonl"
    assert Settings(upstreams=(), db_url="postgres://h/db").spool_file() == "tooltap-spool.jsonl"
