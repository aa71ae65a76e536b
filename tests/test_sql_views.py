"""The SQL views (migration 0005): a recorded Cline session queried with plain SQL, by
sqlite3's own command line and on Postgres, with the example queries the README shows."""

from __future__ import annotations

import json
import re
import sqlite3
import subprocess
from pathlib import Path

import pytest
from alembic import command
from sqlalchemy import create_engine, text

from proxy.har.export import session_har
from proxy.har.load import import_har, records, store
from proxy.store.db import alembic_config, open_database
from proxy.store.read import Reader
from tests.cline_db import recorded_cline_db
from tests.conftest import postgres_url
from tests.har_samples import mitmproxy_har

README = (Path(__file__).parent.parent / "README.md").read_text(encoding="utf-8")

# The README's examples, word for word (checked below).
BY_TOOL = "select tool, count(*) from tool_calls_v group by 1 order by 2 desc, 1"
MCP = ("select server, tool, result_status, count(*) from tool_calls_v "
       "where kind = 'mcp' group by 1, 2, 3 order by 1, 2")
PROGRESS = ("select started_at, tool, progress_done, progress_total from tool_calls_v "
            "where progress_total is not null order by started_at")
TURNS = ("select s.title, t.model, t.input_tokens, t.output_tokens, t.tools from sessions_v s "
         "join turns_v t on t.session_id = s.id order by t.started_unix")


@pytest.fixture(scope="module")
def cline(tmp_path_factory):
    return recorded_cline_db(tmp_path_factory)


def test_the_readme_shows_these_queries():
    for query in (BY_TOOL, MCP, PROGRESS, TURNS):
        assert query in README


def test_sqlite3_command_line_reads_the_views(cline):
    db, _ = cline

    def sqlite3_cli(query: str) -> list[list[str]]:
        out = subprocess.run(["sqlite3", "-readonly", "-separator", "|", str(db), query],
                             capture_output=True, text=True, timeout=30, check=True).stdout
        return [line.split("|") for line in out.splitlines()]

    assert sqlite3_cli(BY_TOOL) == [["get_forecast", "1"], ["list_files", "1"], ["read_file", "1"]]
    assert sqlite3_cli(MCP) == [["weather", "get_forecast", "ok", "1"]]
    progress = sqlite3_cli(PROGRESS)
    assert [(tool, done, total) for _, tool, done, total in progress] == [
        ("list_files", "0", "4"), ("read_file", "1", "4"), ("get_forecast", "2", "4")]
    assert re.fullmatch(r"\d{4}-\d\d-\d\d \d\d:\d\d:\d\d\.\d{3}", progress[0][0])  # UTC, readable
    assert sqlite3_cli(TURNS) == [
        ["华盛顿明天天气如何？", "deepseek-chat", "6878", "149", "list_files"],
        ["华盛顿明天天气如何？", "deepseek-chat", "7204", "127", "read_file"],
        ["华盛顿明天天气如何？", "deepseek-chat", "8320", "226", "get_forecast"],
        ["华盛顿明天天气如何？", "deepseek-chat", "", "", ""],
    ]


def test_views_show_decoded_readable_columns(cline):
    db, session_id = cline
    conn = sqlite3.connect(f"file:{db}?mode=ro", uri=True)
    conn.row_factory = sqlite3.Row
    [session] = conn.execute("select * from sessions_v").fetchall()
    assert (session["id"], session["agent"], session["turns"], session["tool_calls"]) == (session_id, "cline", 4, 3)
    assert (session["models"], session["mcp_servers"]) == ("deepseek-chat", "weather")
    assert session["input_tokens"] == 6878 + 7204 + 8320

    turns = conn.execute("select * from turns_v order by id").fetchall()
    assert [t["mode"] for t in turns] == ["ACT"] * 4
    assert turns[3]["response_text"] == "Sunny, 21°C."  # the reply, decompressed into plain text
    assert turns[0]["response_text"].startswith("我来帮您查询华盛顿明天的天气")

    mcp = conn.execute("select * from tool_calls_v where kind = 'mcp'").fetchone()
    assert (mcp["name"], mcp["tool"], mcp["server"], mcp["source"]) == (
        "cIya4J0mcp0get_forecast", "get_forecast", "weather", "wire")
    assert json.loads(mcp["arguments"])["latitude"] == 38.9072
    assert mcp["result_text"].lstrip().startswith("Today:")
    assert mcp["task_progress"].splitlines()[0] == "- [x] 分析项目结构和可用工具"  # unescaped
    # The model added task_progress to an MCP tool whose schema forbids it: one violation.
    assert mcp["violations"] == 1


def test_calls_written_as_xml_are_in_tool_calls_v(tmp_path):
    """A model without native tool calls writes them in its reply (kept in turns.decoding)."""
    path = tmp_path / "flows.har"
    path.write_text(json.dumps(mitmproxy_har()))
    db = tmp_path / "x.db"
    import_har(path, f"sqlite:///{db}")
    rows = sqlite3.connect(db).execute(
        "select tool, server, kind, name, source, result_status, result_text, \"index\" from tool_calls_v").fetchall()
    assert rows == [("get_forecast", "weather", "mcp", "use_mcp_tool", "text", "ok", "Sunny, 24°C", 0)]


def test_an_older_database_gets_the_readable_reply_on_upgrade(cline, tmp_path):
    """Turns stored before migration 0005 get their reply's text filled in by it."""
    db, _ = cline
    copy = tmp_path / "old.db"
    with sqlite3.connect(db) as source, sqlite3.connect(copy) as conn:
        source.backup(conn)  # the file and its write-ahead log
    # The migrations after 0005 undo themselves; 0005 is undone by hand below.
    engine = create_engine(f"sqlite:///{copy}")
    with engine.begin() as conn:
        cfg = alembic_config(f"sqlite:///{copy}")
        cfg.attributes["connection"] = conn
        command.downgrade(cfg, "0005")
    engine.dispose()
    with sqlite3.connect(copy) as conn:
        for view in ("turns_v", "tool_calls_v", "sessions_v"):
            conn.execute(f"drop view {view}")
        conn.execute("alter table turns drop column response_text")
        conn.execute("update alembic_version set version_num = '0004'")
    open_database(f"sqlite:///{copy}").dispose()
    texts = sqlite3.connect(copy).execute("select response_text from turns_v order by id").fetchall()
    assert texts[3] == ("Sunny, 21°C.",) and all(t[0] for t in texts)


def backends() -> list[str]:
    return ["sqlite"] + (["postgres"] if postgres_url() else [])


@pytest.mark.parametrize("backend", backends())
def test_the_same_queries_on_each_backend(backend, cline, tmp_path):
    db, session_id = cline
    if backend == "sqlite":
        url = f"sqlite:///{tmp_path / 'b.db'}"
    else:
        url = postgres_url()
        with create_engine(url).begin() as conn:  # a clean schema for this run
            conn.execute(text("DROP SCHEMA public CASCADE; CREATE SCHEMA public"))
    har = session_har(Reader(open_database(f"sqlite:///{db}", create=False)), session_id)
    store(url, records(har))
    store(url, records(mitmproxy_har()))
    engine = open_database(url, create=False)
    with engine.connect() as conn:
        def rows(query: str) -> list[tuple]:
            return [tuple(r) for r in conn.execute(text(query))]

        assert rows(BY_TOOL) == [("get_forecast", 2), ("list_files", 1), ("read_file", 1)]
        assert rows(MCP) == [("weather", "get_forecast", "ok", 2)]
        assert [r[1:] for r in rows(PROGRESS)] == [("list_files", 0, 4), ("read_file", 1, 4), ("get_forecast", 2, 4)]
        assert rows(TURNS) == [  # the mitmproxy capture is the older session
            ("weather in Paris tomorrow?", "gpt-4o-2024-08-06", 50, 40, None),
            ("weather in Paris tomorrow?", "gpt-4o-2024-08-06", 120, 6, None),
            ("华盛顿明天天气如何？", "deepseek-chat", 6878, 149, "list_files"),
            ("华盛顿明天天气如何？", "deepseek-chat", 7204, 127, "read_file"),
            ("华盛顿明天天气如何？", "deepseek-chat", 8320, 226, "get_forecast"),
            ("华盛顿明天天气如何？", "deepseek-chat", None, None, None),
        ]
        assert rows("select mcp_servers, models from sessions_v order by started_at") == [
            (None, "gpt-4o-2024-08-06"), ("weather", "deepseek-chat")]
    engine.dispose()
