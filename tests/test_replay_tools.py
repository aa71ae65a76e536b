"""`tooltap replay tools`: stored sessions (recorded through a real tooltap) fed through
every provider's tool format, by the real command line."""

from __future__ import annotations

import json
import re

import httpx
from click.testing import CliRunner

from proxy.cli import main
from proxy.replay.recording import load, open_reader
from proxy.replay.tools import TARGETS, ConverterReplay
from proxy.replay.tools_recording import ToolsLoader
from proxy.scripted import Reply
from tests.test_proxy_e2e import play_cline

ALL = [t.label for t in TARGETS]
KEEPS_CLOSED = [t.key for t in TARGETS if t.key != "gemini"]  # Gemini `parameters` has no additionalProperties
LONG = "lookup_" + "x" * 63  # 70 characters: over OpenAI's and Anthropic's 64
EVIL = "evil\x1b[31m|name"  # a control sequence and a table pipe, as a captured tool name


def replay_tools(*args: str):
    return CliRunner().invoke(main, ["replay", "tools", *args], catch_exceptions=False)


def db(tooltap) -> str:
    tooltap.flush()
    return f"sqlite:///{tooltap.db_path}"


def session_of(tooltap, title_start: str) -> dict:
    sessions = tooltap.api("/sessions")["sessions"]
    return next(s for s in sessions if (s["title"] or "").startswith(title_start))


def send_openai(tooltap, upstream, task: str, tools: list, calls: list[tuple[str, dict]]) -> None:
    upstream.routes["/chat/completions"] = Reply.json({
        "id": "c1", "object": "chat.completion", "created": 1, "model": "gpt-test",
        "choices": [{"index": 0, "finish_reason": "tool_calls", "message": {
            "role": "assistant", "content": None,
            "tool_calls": [{"id": f"call_{i}", "type": "function",
                            "function": {"name": name, "arguments": json.dumps(args)}}
                           for i, (name, args) in enumerate(calls)]}}],
        "usage": {"prompt_tokens": 10, "completion_tokens": 5, "total_tokens": 15}})
    r = httpx.post(f"{tooltap.url}/chat/completions", timeout=10, json={
        "model": "gpt-test", "messages": [{"role": "user", "content": task}], "tools": tools})
    assert r.status_code == 200


def send_anthropic(tooltap, upstream, task: str, tools: list, calls: list[tuple[str, dict]]) -> None:
    upstream.routes["/v1/messages"] = Reply.json({
        "id": "msg_1", "type": "message", "role": "assistant", "model": "claude-test", "stop_reason": "tool_use",
        "content": [{"type": "tool_use", "id": f"toolu_{i}", "name": name, "input": args}
                    for i, (name, args) in enumerate(calls)],
        "usage": {"input_tokens": 10, "output_tokens": 5}})
    r = httpx.post(f"{tooltap.url}/v1/messages", timeout=10, json={
        "model": "claude-test", "max_tokens": 100, "messages": [{"role": "user", "content": task}], "tools": tools})
    assert r.status_code == 200


def weather_tool(fmt: str) -> dict:
    schema = {"type": "object", "properties": {"city": {"type": "string"}, "days": {"type": "integer"}},
              "required": ["city"], "additionalProperties": False}
    if fmt == "openai":
        return {"type": "function", "function": {"name": "get_weather", "description": "Weather.", "parameters": schema}}
    return {"name": "get_weather", "description": "Weather.", "input_schema": schema}


def record_valid(tooltap, upstream) -> None:
    send_openai(tooltap, upstream, "weather in Paris", [weather_tool("openai")],
                [("get_weather", {"city": "Paris", "days": 2})])


def record_awkward(tooltap, upstream) -> None:
    """An Anthropic session: a name too long, a name with a control sequence, an `email`
    format and an untyped enum, a call with a wrong type."""
    tools = [
        weather_tool("anthropic"),
        {"name": LONG, "description": "Too long a name.",
         "input_schema": {"type": "object", "properties": {"q": {"type": "string", "format": "email"},
                                                           "mode": {"enum": ["fast", "slow"]}}}},
        {"name": EVIL, "input_schema": {"type": "object", "properties": {}}},
    ]
    send_anthropic(tooltap, upstream, "awkward tools", tools,
                   [("get_weather", {"city": "Oslo", "days": "three"}), (LONG, {"q": "a@b.c", "mode": "fast"})])


# -- the cline-weather session ----------------------------------------------------------------

def test_cline_weather_reports_the_leaked_task_progress_on_every_provider_that_keeps_the_constraint(tooltap, upstream):
    play_cline(tooltap, upstream)
    url = db(tooltap)
    session = tooltap.api("/sessions")["sessions"][0]
    turn_ids = [t["id"] for t in tooltap.api(f"/sessions/{session['id']}")["turns"]]
    mcp_turn = turn_ids[2]  # turn 3 calls cIya4J0mcp0get_forecast

    r = replay_tools(session["id"], "--db", url, "--format", "json")
    assert r.exit_code == 1
    report = json.loads(r.stdout)
    assert report["ok"] is False and [s["session_id"] for s in report["sessions"]] == [session["id"]]
    s = report["sessions"][0]
    assert (s["turns"], s["calls"], s["tool_sets"], s["tools"]) == (4, 3, 1, 15)
    assert s["unmatched_calls"] == [] and s["errors"] == []
    providers = {p["target"]: p for p in s["providers"]}
    assert list(providers) == [t.key for t in TARGETS]
    for key in KEEPS_CLOSED:
        # list_files and read_file are valid; only the MCP call is refused, at task_progress
        assert [(x["turn_id"], x["call_index"], x["tool"], x["name"], x["path"], x["kind"])
                for x in providers[key]["rejected"]] == [
            (mcp_turn, 0, "weather/get_forecast", "cIya4J0mcp0get_forecast", "$.task_progress", "undeclared_parameter")]
        assert "allows no other properties" in providers[key]["rejected"][0]["reason"]
        assert providers[key]["ok"] is False
    gemini = providers["gemini"]
    assert gemini["rejected"] == [] and gemini["ok"] is True
    # ... because Gemini's schema dropped the constraint, which is reported as lost
    assert {"tool": "cIya4J0mcp0get_forecast", "label": "weather/get_forecast",
            "path": "$.parameters.additionalProperties", "kind": "dropped", "via": "converter",
            "reason": "Gemini has no additionalProperties; dropped (was false)"} in gemini["lost"]
    # strict mode: the optional task_progress of the built-in tools makes OpenAI refuse them
    strict = {(x["tool"], x["path"]) for x in providers["openai-strict"]["lost"] if x["kind"] == "rejected"}
    assert ("read_file", "$.function.parameters.required") in strict
    assert all(p["invalid_names"] == [] for p in s["providers"])

    text = replay_tools(session["id"], "--db", url)
    assert text.exit_code == 1
    assert f"turn 3 (#{mcp_turn}) call 0  weather/get_forecast (cIya4J0mcp0get_forecast)  $.task_progress" \
        in text.stdout
    assert ("rejected by " + ", ".join(ALL[:4] + ALL[5:]) + "; accepted by Gemini parameters") in text.stdout
    assert "1 session: 1 with calls a provider would reject (1 rejected call in all)" in text.stdout
    assert text.stderr == ""  # one session, not a terminal: no progress bar

    md = replay_tools(session["id"], "--db", url, "--format", "markdown")
    assert md.exit_code == 1
    row = next(line for line in md.stdout.splitlines() if "`$.task_progress`" in line)
    assert row.startswith(f"| 3 (#{mcp_turn}) | 0 | `weather/get_forecast` (`cIya4J0mcp0get_forecast`) |")
    assert row.endswith("| " + ", ".join(ALL[:4] + ALL[5:]) + " |")
    assert "| Gemini parameters | `weather/get_forecast` (`cIya4J0mcp0get_forecast`) | " \
           "`$.parameters.additionalProperties` | dropped |" in md.stdout


def test_the_light_reader_gives_the_same_report_as_the_whole_recording(tooltap, upstream):
    play_cline(tooltap, upstream)
    record_awkward(tooltap, upstream)
    tooltap.flush()
    reader = open_reader(f"sqlite:///{tooltap.db_path}")
    for s in tooltap.api("/sessions")["sessions"]:
        whole = ConverterReplay().session(load(reader, s["id"])).to_dict()
        light = ConverterReplay().session(ToolsLoader(reader).load(s["id"])).to_dict()
        assert light == whole and whole["calls"] > 0


# -- other sessions -----------------------------------------------------------------------------

def test_a_session_whose_calls_are_all_valid_exits_0(tooltap, upstream):
    record_valid(tooltap, upstream)
    s = session_of(tooltap, "weather in Paris")
    r = replay_tools(s["id"], "--db", db(tooltap), "--format", "json")
    assert r.exit_code == 0, r.output
    report = json.loads(r.stdout)
    assert report["ok"] is True
    providers = report["sessions"][0]["providers"]
    assert all(p["rejected"] == [] and p["invalid_names"] == [] for p in providers)
    assert report["sessions"][0]["calls"] == 1
    text = replay_tools(s["id"], "--db", db(tooltap))
    assert text.exit_code == 0 and "no call would be rejected" in text.stdout


def test_names_lost_keywords_and_wrong_types_are_reported_for_the_right_providers(tooltap, upstream):
    record_awkward(tooltap, upstream)
    s = session_of(tooltap, "awkward tools")
    r = replay_tools(s["id"], "--db", db(tooltap), "--format", "json")
    assert r.exit_code == 1
    providers = {p["target"]: p for p in json.loads(r.stdout)["sessions"][0]["providers"]}

    long_bad = {k for k, p in providers.items() if any(n["tool"] == LONG for n in p["invalid_names"])}
    assert long_bad == {"openai", "openai-strict", "openai-responses", "anthropic"}  # Gemini and MCP allow 128
    bad = next(n for n in providers["anthropic"]["invalid_names"] if n["tool"] == LONG)
    assert "longer than 64 characters (70)" in bad["reason"] and len(bad["renamed_to"]) == 64
    evil_bad = {k for k, p in providers.items() if any(n["tool"] == EVIL for n in p["invalid_names"])}
    assert evil_bad == {t.key for t in TARGETS}

    # `format: email`: Gemini's subset has no such format; every other format keeps it
    def lost(key: str, path: str) -> list[dict]:
        return [x for x in providers[key]["lost"] if x["tool"] == LONG and x["path"] == path]
    assert lost("gemini", "$.parameters.properties.q.format")[0]["via"] == "converter"
    assert all(not lost(k, "$.parameters.properties.q.format") for k in providers if k != "gemini")
    # the untyped enum came back from Gemini with a type the converter never mentioned
    added = lost("gemini", "$.parameters.properties.mode.type")
    assert added and added[0]["via"] == "round trip" and added[0]["kind"] == "added"

    # "three" for an integer: refused by all seven (the type survives every conversion)
    for p in providers.values():
        assert [(x["tool"], x["path"], x["kind"]) for x in p["rejected"]] == [("get_weather", "$.days", "wrong_type")]

    # a captured name never reaches the terminal or the Markdown raw
    text = replay_tools(s["id"], "--db", db(tooltap)).stdout
    assert "\x1b" not in text and "evil\\x1b[31m|name" in text
    md = replay_tools(s["id"], "--db", db(tooltap), "--format", "markdown").stdout
    assert "\x1b" not in md and "`evil\\x1b[31m\\|name`" in md


def test_rejected_calls_count_calls_and_name_turns_by_place(tooltap, upstream):
    """One call refused for two reasons, in a session that is not the database's first."""
    record_valid(tooltap, upstream)
    send_openai(tooltap, upstream, "weather twice wrong", [weather_tool("openai")],
                [("get_weather", {"city": 5, "days": "three"})])
    s = session_of(tooltap, "weather twice wrong")
    (turn,) = tooltap.api(f"/sessions/{s['id']}")["turns"]
    assert turn["id"] == 2

    r = replay_tools(s["id"], "--db", db(tooltap), "--format", "json", "--record-run")
    providers = json.loads(r.stdout)["sessions"][0]["providers"]
    assert {len(p["rejected"]) for p in providers} == {2}  # $.city and $.days, for every provider
    assert {p["counts"]["rejected_calls"] for p in providers} == {1}
    assert {(x["turn_id"], x["place"]) for p in providers for x in p["rejected"]} == {(2, 1)}

    text = replay_tools(s["id"], "--db", db(tooltap)).stdout
    assert "1 tool call" in text and "(1 rejected call in all)" in text
    rows = [line.split() for line in text.splitlines() if line.strip().startswith(("OpenAI chat ", "MCP "))]
    assert [row[-3] for row in rows] == ["1", "1"]  # the rejected calls column
    assert "turn 1 (#2) call 0  get_weather  $.city" in text and "turn 1 (#2) call 0  get_weather  $.days" in text
    md = replay_tools(s["id"], "--db", db(tooltap), "--format", "markdown").stdout
    assert "| OpenAI chat | 1 | 0 |" in md and "| 1 (#2) | 0 | `get_weather` | `$.city` |" in md

    # The run's page says the same as the command line.
    from proxy.replay.runs import runs_of_session

    (run,) = runs_of_session(open_reader(db(tooltap)).engine, s["id"])
    page = httpx.get(f"{tooltap.url}/_tooltap/replays/{run['id']}").text
    table = page[page.index('data-testid="providers"'):page.index("</table>")]
    assert re.search(r"<td>MCP</td><td class=\"num\">1</td>", table), table
    assert 'turn 1 <span class="turn-id">#2</span></a> call 0' in page


def test_all_covers_every_session_with_a_progress_bar_and_records_runs(tooltap, upstream):
    play_cline(tooltap, upstream)
    record_valid(tooltap, upstream)
    record_awkward(tooltap, upstream)
    url = db(tooltap)
    stored = {s["id"]: s for s in tooltap.api("/sessions")["sessions"]}
    assert len(stored) == 3

    r = replay_tools("--all", "--db", url, "--format", "json", "--record-run")
    assert r.exit_code == 1
    report = json.loads(r.stdout)
    verdicts = {s["session_id"]: s["ok"] for s in report["sessions"]}
    assert set(verdicts) == set(stored)
    assert sorted(verdicts.values()) == [False, False, True]
    assert "3/3" in r.stderr  # the progress bar, on stderr: stdout stays parseable

    from proxy.replay.runs import runs_of_session

    engine = open_reader(url).engine
    for session_id, ok in verdicts.items():
        runs = runs_of_session(engine, session_id)
        assert [(x["kind"], x["target"], x["ok"]) for x in runs] == [("tools", "converters", ok)]

    several = replay_tools(*sorted(stored), "--db", url, "--format", "json")
    assert {s["session_id"] for s in json.loads(several.stdout)["sessions"]} == set(stored)


# -- usage errors: one line, exit 2 --------------------------------------------------------------

def test_usage_errors_exit_2_with_one_line(tooltap, upstream, tmp_path):
    record_valid(tooltap, upstream)
    url = db(tooltap)
    junk = tmp_path / "junk.db"
    junk.write_bytes(b"this is not a database" * 100)
    for args, says in [
        (["--db", url], "give one or more SESSION ids, or --all"),
        (["nope", "--db", url], "no session 'nope'"),
        (["--all", "--db", f"sqlite:///{tmp_path / 'missing.db'}"], "missing.db"),
        (["--all", "--db", f"sqlite:///{junk}"], "junk.db"),
    ]:
        r = replay_tools(*args)
        assert r.exit_code == 2, (args, r.output)
        assert r.stdout == ""
        lines = r.stderr.strip().splitlines()
        assert len(lines) == 1 and says in lines[0] and "Traceback" not in r.stderr, (args, r.stderr)
