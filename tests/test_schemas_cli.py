"""`tooltap schemas ...` through click's CliRunner: output and exit codes."""

import copy
import json
from pathlib import Path

import pytest
from click.testing import CliRunner

from proxy.schemas.cli import schemas
from proxy.schemas.convert import convert_tools
from proxy.schemas.sources import from_file

from .test_schemas_sources import TURN1, record_turns

try:  # CliRunner kept stderr apart by default only from click 8.2 on
    RUNNER = CliRunner(mix_stderr=False)
except TypeError:
    RUNNER = CliRunner()


def run(*args, env=None):
    return RUNNER.invoke(schemas, [str(a) for a in args], env=env, catch_exceptions=False)


def tools_file(tmp_path, name, tools) -> Path:
    p = tmp_path / name
    p.write_text(json.dumps(tools))
    return p


@pytest.fixture
def renamed_uid(tmp_path):
    body = json.loads(TURN1.read_text())
    tools = copy.deepcopy(body["tools"])
    for t in tools:
        t["function"]["name"] = t["function"]["name"].replace("cIya4J", "cAbCdE")
    return tools_file(tmp_path, "after.json", tools)


def test_diff_identical_exits_0():
    result = run("diff", TURN1, TURN1)
    assert result.exit_code == 0
    assert "0 breaking of 0 changes" in result.output


def test_diff_renamed_uid_is_reported_not_breaking(renamed_uid):
    """A Cline restart changes every MCP uid; the agent offers the new names itself."""
    result = run("diff", TURN1, renamed_uid)
    assert result.exit_code == 0
    assert "cIya4J0mcp0get_forecast -> cAbCdE0mcp0get_forecast (renamed)" in result.output


def test_diff_plain_rename_is_breaking(tmp_path):
    tools = json.loads(TURN1.read_text())["tools"]
    tools[0]["function"]["name"] = "renamed_tool"
    result = run("diff", TURN1, tools_file(tmp_path, "b.json", tools))
    assert result.exit_code == 1
    assert "-> renamed_tool (renamed, BREAKING)" in result.output


def test_diff_compatible_change_exits_0(tmp_path):
    tools = json.loads(TURN1.read_text())["tools"]
    tools[0]["function"]["parameters"]["properties"]["extra"] = {"type": "string"}
    tools[1]["function"]["description"] = "changed"
    result = run("diff", TURN1, tools_file(tmp_path, "b.json", tools), "--format", "json")
    assert result.exit_code == 0
    data = json.loads(result.output)
    assert data["breaking"] is False and data["summary"]["changed"] == 2
    assert data["a"]["format"] == "openai"


def test_diff_breaking_change_exits_1_in_every_format(tmp_path):
    tools = json.loads(TURN1.read_text())["tools"]
    tools[0]["function"]["parameters"]["required"].append("task_progress")
    after = tools_file(tmp_path, "b.json", tools)
    for fmt in ("text", "json", "markdown"):
        result = run("diff", TURN1, after, "--format", fmt)
        assert result.exit_code == 1, fmt
    assert "| `ask_followup_question` | 'task_progress' is now required |" in result.output


def test_diff_across_formats(tmp_path):
    gemini, _ = convert_tools(from_file(TURN1).tools, "gemini")
    result = run("diff", TURN1, tools_file(tmp_path, "g.json", gemini), "--format", "json")
    data = json.loads(result.output)
    assert result.exit_code == 0 and data["b"]["format"] == "gemini"
    assert {c["kind"] for c in data["changes"]} == {"additional_properties_changed"}


def test_bad_source_exits_2():
    result = run("diff", TURN1, "/nonexistent.json")
    assert result.exit_code == 2
    assert "cannot read" in result.stderr


def test_convert_raw_prints_tools_and_losses_on_stderr():
    result = run("convert", "--to", "gemini", TURN1)
    assert result.exit_code == 0
    tools = json.loads(result.stdout)
    assert len(tools) == 15 and tools[-1]["parameters"]["type"] == "OBJECT"
    assert "cIya4J0mcp0get_forecast $.parameters.additionalProperties: [dropped]" in result.stderr
    assert "15 tools, 15 losses" in result.stderr


def test_one_tool_is_said_in_the_singular(tmp_path):
    one = tools_file(tmp_path, "one.json", json.loads(TURN1.read_text())["tools"][-1:])  # get_forecast
    result = run("convert", "--to", "gemini", one)
    assert result.exit_code == 0 and result.stderr.splitlines()[-1] == "1 tool, 1 loss"
    assert run("show", one).output.splitlines()[0] == f"{one}: 1 tool (openai)"


def test_convert_json_envelope_with_cline_profile():
    result = run("convert", "--to", "openai", "--profile", "cline", "--format", "json", TURN1)
    data = json.loads(result.stdout)
    assert data["profile"] == "cline" and data["losses"] == []
    assert data["tools"] == json.loads(TURN1.read_text())["tools"]


def test_convert_cline_to_mcp_is_an_error():
    result = run("convert", "--to", "mcp", "--profile", "cline", TURN1)
    assert result.exit_code == 2 and "no converter" in result.stderr


def test_convert_rejects_unknown_target():
    assert run("convert", "--to", "cohere", TURN1).exit_code == 2


def test_show_text_and_json():
    result = run("show", TURN1)
    assert result.exit_code == 0
    assert "15 tools (openai)" in result.output
    assert "* latitude: number" in result.output
    assert "gemini 15" in result.output
    data = json.loads(run("show", TURN1, "--format", "json").output)
    assert data["losses_per_target"] == {"openai": 0, "anthropic": 0, "gemini": 15, "mcp": 0}
    assert data["tools"][-1]["name"] == "cIya4J0mcp0get_forecast"


def test_list_and_db_sources(tmp_path, renamed_uid):
    db_url = f"sqlite:///{tmp_path / 'tooltap.db'}"
    record_turns(db_url, tmp_path, [TURN1.read_bytes()])
    listed = run("list", "--db", db_url, "--format", "json")
    rows = json.loads(listed.output)["tool_sets"]
    assert listed.exit_code == 0 and rows[0]["tool_count"] == 15
    text = run("list", "--db", db_url)
    assert rows[0]["session_id"][:24] in text.output and "deepseek-chat" in text.output
    assert run("diff", f"turn:{rows[0]['turn_id']}", TURN1, "--db", db_url).exit_code == 0
    from_session = run("diff", f"session:{rows[0]['session_id']}", renamed_uid, "--db", db_url)
    assert from_session.exit_code == 0 and "-> cAbCdE0mcp0get_forecast (renamed)" in from_session.output
    env_show = run("show", f"turn:{rows[0]['turn_id']}", env={"TOOLTAP_DB": db_url})
    assert "15 tools" in env_show.output
    by_start = run("show", f"session:{rows[0]['session_id'][:6]}", "--db", db_url)  # as the other commands
    assert by_start.exit_code == 0 and "15 tools" in by_start.output


def test_list_empty_db(tmp_path):
    from proxy.store.db import make_engine, migrate

    db_url = f"sqlite:///{tmp_path / 'empty.db'}"
    migrate(make_engine(db_url))
    result = run("list", "--db", db_url)
    assert result.exit_code == 0 and "no tool sets recorded" in result.output


def test_help_names_every_source_a_tool_set_is_read_from(tmp_path):
    """The help of `schemas` and its commands names the mcp: sources beside files, turn:
    and session:, and --db serves them all: each source the help names is read."""
    from proxy.mcp.store import Connection, Recorder, new_id

    for args in (["--help"], ["show", "--help"], ["diff", "--help"], ["convert", "--help"]):
        shown = " ".join(run(*args).output.split())
        assert "mcp:NAME" in shown and "turn:<id>" in shown and "session:<id>" in shown, args
        if args != ["--help"]:
            assert "for turn:, session: and mcp: sources" in shown, args
    assert "mcp:NAME@session:<id>" in run("--help").output

    db_url = f"sqlite:///{tmp_path / 'tooltap.db'}"
    recorder = Recorder(db_url, tmp_path / "spool")
    recorder.start()
    conn = Connection(new_id(), "stdio", name="weather")
    for tools in ([{"name": "get_alerts", "inputSchema": {"type": "object"}}],
                  [{"name": "get_alerts", "inputSchema": {"type": "object", "properties": {"state": {"type": "string"}},
                                                          "required": ["state"]}}]):
        recorder.record(conn, "to_server", b'{"jsonrpc": "2.0", "id": 1, "method": "tools/list"}')
        answer = {"jsonrpc": "2.0", "id": 1, "result": {"tools": tools}}
        recorder.record(conn, "from_server", json.dumps(answer).encode())
    recorder.close()
    shown = run("show", "mcp:weather", "--db", db_url)
    assert shown.exit_code == 0 and "* state: string" in shown.output
    changed = run("diff", "mcp:weather@1", "mcp:weather", "--db", db_url)  # a required argument added: breaking
    assert changed.exit_code == 1 and "state" in changed.output


def test_a_tool_set_from_standard_input_and_a_file_that_is_not_utf8(tmp_path):
    """`-` reads the tools from a pipe; a file that is not UTF-8 is one line, not a traceback."""
    tools = [{"type": "function", "function": {"name": "get_forecast", "description": "d",
                                               "parameters": {"type": "object", "properties": {}}}}]
    r = RUNNER.invoke(schemas, ["convert", "--to", "anthropic", "-"], input=json.dumps(tools))
    assert r.exit_code == 0, r.output
    assert json.loads(r.stdout)[0]["name"] == "get_forecast"
    twice = RUNNER.invoke(schemas, ["diff", "-", "-"], input=json.dumps(tools))
    assert twice.exit_code == 2 and "standard input can be read once" in twice.stderr
    bad = tmp_path / "tools.json"
    bad.write_bytes(b"\xff\xfe[]")
    r = run("show", bad)
    assert r.exit_code == 2 and f"{bad}: not UTF-8 (invalid start byte at byte 0)" in r.stderr
