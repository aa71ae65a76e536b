"""The typed read API (`proxy.client`): the same Cline session read from a database file
and from a running tooltap gives the same sessions, turns and tool calls."""

from __future__ import annotations

import json
from datetime import datetime, timezone

import pytest

from proxy import client
from tests.conftest import cline_turn
from tests.test_proxy_e2e import play_cline


def _check(tt: client.Tooltap) -> tuple:
    [session] = tt.sessions()
    assert isinstance(session, client.Session)
    assert session.title == "华盛顿明天天气如何？" and session.agent == "cline"
    assert (session.turns, session.tool_calls, session.models) == (4, 3, ["deepseek-chat"])
    assert session.started_at.tzinfo == timezone.utc and session.last_at >= session.started_at
    assert tt.session(session.id).turn_ids == sorted(tt.session(session.id).turn_ids)
    assert tt.session("no-such-session") is None

    turns = tt.turns(session.id)
    assert [t.parent_id for t in turns] == [None] + [t.id for t in turns[:-1]]
    for n, turn in enumerate(turns[:3]):
        assert isinstance(turn, client.Turn) and isinstance(turn.started_at, datetime)
        assert turn.response == cline_turn(n + 1)["expected"]
        assert turn.request == json.loads(cline_turn(n + 1)["request"])
        assert dict(turn.request_headers)["authorization"].startswith("Bearer …")

    calls = tt.tool_calls(session.id)
    assert [(c.tool, c.server, c.kind) for c in calls] == [
        ("list_files", None, "builtin"), ("read_file", None, "builtin"), ("get_forecast", "weather", "mcp")]
    forecast = calls[2]
    assert isinstance(forecast, client.ToolCall) and forecast.name == "cIya4J0mcp0get_forecast"
    assert forecast.arguments["latitude"] == 38.9072 and forecast.result_text.lstrip().startswith("Today:")
    assert (forecast.task_progress["done"], forecast.task_progress["total"]) == (2, 4)
    assert forecast.turn_id == turns[2].id and forecast.source == "wire"
    assert tt.tool_calls() == calls  # every session's calls: here, the one session's
    return session, turns, calls


def test_a_file_and_a_running_tooltap_read_the_same(make_tooltap, upstream):
    tooltap = make_tooltap(upstream.url, ui_token="s3cret-token")
    play_cline(tooltap, upstream)
    tooltap.app.writer.flush()

    with client.connect(str(tooltap.db_path)) as from_file:
        on_file = _check(from_file)
    with client.connect(tooltap.url, token="s3cret-token") as from_server:
        on_server = _check(from_server)
    assert on_file == on_server

    with pytest.raises(client.ClientError, match="asks for its UI token"):
        client.connect(tooltap.url).sessions()


def test_errors_say_what_is_wrong(tmp_path):
    with pytest.raises(client.ClientError, match="no tooltap database"):
        client.connect(str(tmp_path / "missing.db"))
    with pytest.raises(client.ClientError, match="cannot reach tooltap"):
        client.connect("http://127.0.0.1:9").sessions()
