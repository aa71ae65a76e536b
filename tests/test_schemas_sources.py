"""Loading tool sets from files of every format, MCP tools/list results, and the database."""

import json
import time
from pathlib import Path

import pytest

from proxy.schemas.convert import convert_tools
from proxy.schemas.sources import SourceError, detect, from_document, from_file, load

FIXTURES = Path(__file__).parent / "fixtures" / "cline-weather"
TURN1 = FIXTURES / "turn1" / "request.json"


def weather():
    return from_file(TURN1)


def write(tmp_path, name, doc) -> Path:
    p = tmp_path / name
    p.write_text(json.dumps(doc) if not isinstance(doc, str) else doc)
    return p


def test_request_body_is_a_source():
    ts = weather()
    assert ts.format == "openai" and len(ts.tools) == 15
    forecast = ts.tools[-1]
    assert forecast.name == "cIya4J0mcp0get_forecast"
    assert forecast.description.startswith("weather: ")
    assert forecast.meta == {"strict": False}


@pytest.mark.parametrize("target,fmt", [
    ("openai", "openai"), ("openai-responses", "openai-responses"), ("anthropic", "anthropic"),
    ("gemini", "gemini"), ("gemini-jsonschema", "gemini"), ("mcp", "mcp"),
])
def test_every_format_is_detected_from_a_plain_list(tmp_path, target, fmt):
    tools, _ = convert_tools(weather().tools, target)
    ts = from_file(write(tmp_path, "tools.json", tools))
    assert ts.format == fmt
    assert [t.name for t in ts.tools] == [t.name for t in weather().tools]


def test_gemini_request_shape(tmp_path):
    decls, _ = convert_tools(weather().tools, "gemini")
    doc = {"contents": [], "tools": [{"functionDeclarations": decls}, {"googleSearch": {}}]}
    ts = from_file(write(tmp_path, "gemini.json", doc))
    assert ts.format == "gemini" and len(ts.tools) == 15
    assert ts.skipped and "not a function tool" in ts.skipped[0]
    assert ts.tools[-1].parameters["properties"]["latitude"]["type"] == "number"


def test_anthropic_request_with_server_tool(tmp_path):
    tools, _ = convert_tools(weather().tools, "anthropic")
    doc = {"model": "claude", "messages": [], "tools": tools + [{"type": "web_search_20250305", "name": "web_search"}]}
    ts = from_file(write(tmp_path, "a.json", doc))
    assert ts.format == "anthropic" and len(ts.tools) == 15 and len(ts.skipped) == 1


MCP_TOOLS = [{"name": "get_forecast", "description": "Get weather forecast for a location.",
              "inputSchema": {"type": "object", "properties": {"latitude": {"type": "number", "title": "Latitude"}},
                              "required": ["latitude"]}}]


def test_mcp_tools_list_result_and_jsonrpc_response(tmp_path):
    plain = from_file(write(tmp_path, "result.json", {"tools": MCP_TOOLS}))
    rpc = from_file(write(tmp_path, "rpc.json", {"jsonrpc": "2.0", "id": 1, "result": {"tools": MCP_TOOLS}}))
    assert plain.format == rpc.format == "mcp"
    assert plain.tools == rpc.tools and plain.tools[0].name == "get_forecast"


def test_mcp_capture_jsonl(tmp_path):
    lines = [
        {"direction": "host_to_server", "message": {"jsonrpc": "2.0", "id": 1, "method": "tools/list"}},
        {"direction": "server_to_host", "message": {"jsonrpc": "2.0", "id": 1, "result": {"tools": MCP_TOOLS}}},
    ]
    ts = from_file(write(tmp_path, "cap.jsonl", "\n".join(json.dumps(l) for l in lines)))
    assert [t.name for t in ts.tools] == ["get_forecast"]


def test_the_fixture_capture_has_no_tools_list():
    with pytest.raises(SourceError, match="no tools/list result"):
        from_file(FIXTURES / "mcp_stdio.jsonl")


def test_legacy_functions_and_single_tool(tmp_path):
    ts = from_file(write(tmp_path, "f.json", {"functions": [{"name": "f", "parameters": {"type": "object"}}]}))
    assert ts.format == "openai-function" and ts.tools[0].name == "f"
    one = from_document({"name": "x", "input_schema": {"type": "object"}})
    assert one.format == "anthropic"


def test_detect_rejects_non_tools():
    assert detect({"type": "web_search"}) is None
    assert detect("read_file") is None


@pytest.mark.parametrize("content,match", [("{not json", "not JSON"), ('{"x": 1}', "no tools found"), ("3", "expected a JSON list")])
def test_bad_files_give_clear_errors(tmp_path, content, match):
    with pytest.raises(SourceError, match=match):
        from_file(write(tmp_path, "bad.json", content))


def test_missing_file():
    with pytest.raises(SourceError, match="cannot read"):
        load("/nonexistent/tools.json")


# --- database sources ---------------------------------------------------------

def record_turns(db_url: str, tmp_path, bodies: list[bytes]) -> None:
    from proxy.capture import TurnRecord
    from proxy.store.writer import Writer

    writer = Writer(db_url, str(tmp_path / "spool"))
    writer.start()
    try:
        for body in bodies:
            writer.submit(TurnRecord(started_at=time.time(), method="POST", path="/chat/completions",
                                     upstream="http://upstream", request_headers=[], request_body=body,
                                     api="openai.chat", http_status=200, response={}))
        writer.flush()
    finally:
        writer.close()


@pytest.fixture
def weather_db(tmp_path):
    db_url = f"sqlite:///{tmp_path / 'tooltap.db'}"
    record_turns(db_url, tmp_path, [TURN1.read_bytes(), (FIXTURES / "turn2" / "request.json").read_bytes()])
    return db_url


def test_turn_and_session_sources(weather_db):
    from proxy.store.read import tool_sets

    rows = tool_sets(weather_db)
    assert len(rows) == 1 and rows[0]["tool_count"] == 15  # same tools in both turns: one set
    turn = load(f"turn:{rows[0]['turn_id']}", weather_db)
    session = load(f"session:{rows[0]['session_id']}", weather_db)
    assert [t.name for t in turn.tools] == [t.name for t in session.tools] == [t.name for t in weather().tools]
    assert turn.source.startswith("turn:")
    sid = rows[0]["session_id"]
    assert [t.name for t in load(f"session:{sid[:4]}", weather_db).tools] == [t.name for t in session.tools]
    with pytest.raises(SourceError, match=f"session:{sid[:3]}: '{sid[:3]}' is too short to name a session"):
        load(f"session:{sid[:3]}", weather_db)


def test_unknown_turn_and_bad_id(weather_db):
    with pytest.raises(SourceError, match="not found"):
        load("turn:999", weather_db)
    with pytest.raises(SourceError, match="must be a number"):
        load("turn:abc", weather_db)


def test_db_url_from_environment(weather_db, monkeypatch):
    monkeypatch.setenv("TOOLTAP_DB", weather_db)
    assert len(load("turn:1").tools) == 15
