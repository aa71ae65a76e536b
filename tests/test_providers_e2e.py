"""The other wire APIs end to end: official SDKs (or raw httpx) through a real tooltap."""

from __future__ import annotations

import json

import anthropic
import httpx
import openai

from proxy.scripted import Reply


def sse(events: list[tuple[str | None, dict]]) -> bytes:
    out = b""
    for name, data in events:
        if name:
            out += f"event: {name}\n".encode()
        out += b"data: " + json.dumps(data).encode() + b"\n\n"
    return out


def test_anthropic_sdk_stream_with_tool_use(tooltap, upstream):
    events = [
        ("message_start", {"type": "message_start", "message": {
            "id": "msg_1", "type": "message", "role": "assistant", "model": "claude-test", "content": [],
            "stop_reason": None, "stop_sequence": None, "usage": {"input_tokens": 12, "output_tokens": 1}}}),
        ("ping", {"type": "ping"}),
        ("content_block_start", {"type": "content_block_start", "index": 0,
                                 "content_block": {"type": "text", "text": ""}}),
        ("content_block_delta", {"type": "content_block_delta", "index": 0,
                                 "delta": {"type": "text_delta", "text": "Let me look."}}),
        ("content_block_stop", {"type": "content_block_stop", "index": 0}),
        ("content_block_start", {"type": "content_block_start", "index": 1, "content_block": {
            "type": "tool_use", "id": "toolu_1", "name": "mcp__weather__get_forecast", "input": {}}}),
        ("content_block_delta", {"type": "content_block_delta", "index": 1,
                                 "delta": {"type": "input_json_delta", "partial_json": "{\"latitude\": 38.9,"}}),
        ("content_block_delta", {"type": "content_block_delta", "index": 1,
                                 "delta": {"type": "input_json_delta", "partial_json": " \"longitude\": -77.0}"}}),
        ("content_block_stop", {"type": "content_block_stop", "index": 1}),
        ("message_delta", {"type": "message_delta", "delta": {"stop_reason": "tool_use", "stop_sequence": None},
                           "usage": {"output_tokens": 40}}),
        ("message_stop", {"type": "message_stop"}),
    ]
    upstream.routes["/v1/messages"] = Reply.sse(sse(events), split=50)
    client = anthropic.Anthropic(base_url=tooltap.url, api_key="sk-ant-test-0123456789abcdef")
    with client.messages.stream(
        model="claude-test", max_tokens=100, messages=[{"role": "user", "content": "forecast?"}],
        tools=[{"name": "mcp__weather__get_forecast", "description": "forecast",
                "input_schema": {"type": "object", "properties": {"latitude": {"type": "number"},
                                                                  "longitude": {"type": "number"}},
                                 "required": ["latitude", "longitude"]}}],
    ) as stream:
        sdk_final = stream.get_final_message()
    assert sdk_final.content[1].input == {"latitude": 38.9, "longitude": -77.0}

    turn = tooltap.api(f"/turns/{tooltap.api('/turns')['turns'][0]['id']}")
    assert turn["api"] == "anthropic.messages" and turn["status"] == "ok"
    assert turn["response"]["content"][0] == {"type": "text", "text": "Let me look."}
    assert turn["usage"]["output_tokens"] == 40 and turn["usage"]["input_tokens"] == 12
    call = turn["tool_calls"][0]
    assert call["id"] == "toolu_1" and call["arguments"] == {"latitude": 38.9, "longitude": -77.0}
    assert (call["decoded"]["kind"], call["decoded"]["server"], call["decoded"]["tool"]) == (
        "mcp", "weather", "get_forecast")
    assert call["violations"] == []
    headers = json.dumps(turn["request_headers"], ensure_ascii=False)
    assert "sk-ant-test" not in headers and "…cdef#" in headers  # the SDK's key header, fingerprinted


def test_openai_responses_stream(tooltap, upstream):
    response = {"id": "resp_1", "object": "response", "created_at": 1, "model": "gpt-test", "status": "completed",
                "output": [{"type": "function_call", "id": "fc_1", "call_id": "call_1", "name": "lookup",
                            "arguments": "{\"q\": \"tooltap\"}", "status": "completed"}],
                "usage": {"input_tokens": 5, "output_tokens": 7, "total_tokens": 12}}
    partial = {**response, "status": "in_progress", "output": [], "usage": None}
    item = response["output"][0]
    events = [
        ("response.created", {"type": "response.created", "sequence_number": 0, "response": partial}),
        ("response.output_item.added", {"type": "response.output_item.added", "sequence_number": 1,
                                        "output_index": 0, "item": {**item, "arguments": "", "status": "in_progress"}}),
        ("response.function_call_arguments.delta", {"type": "response.function_call_arguments.delta",
                                                    "sequence_number": 2, "output_index": 0, "item_id": "fc_1",
                                                    "delta": "{\"q\": \"tooltap\"}"}),
        ("response.output_item.done", {"type": "response.output_item.done", "sequence_number": 3,
                                       "output_index": 0, "item": item}),
        ("response.completed", {"type": "response.completed", "sequence_number": 4, "response": response}),
    ]
    upstream.routes["/v1/responses"] = Reply.sse(sse(events))
    client = openai.OpenAI(base_url=f"{tooltap.url}/v1", api_key="sk-test-0123456789abcdef")
    with client.responses.stream(model="gpt-test", input="find tooltap") as stream:
        final = stream.get_final_response()
    assert final.output[0].name == "lookup"
    turn = tooltap.api(f"/turns/{tooltap.api('/turns')['turns'][0]['id']}")
    assert turn["api"] == "openai.responses" and turn["response"]["id"] == "resp_1"
    assert [(c["name"], c["arguments"]) for c in turn["tool_calls"]] == [("lookup", {"q": "tooltap"})]
    assert turn["request"]["input"] == "find tooltap"


def test_openai_responses_with_a_string_input_is_a_conversation(tooltap, upstream):
    """`input="..."`, the SDK's commonest call, is one user message: its own session, named
    by it and found by search (it went to the day's "requests without a conversation"),
    while the request is kept as sent, the tools stored as tool sets."""
    answer = {"id": "resp_2", "object": "response", "created_at": 1, "model": "gpt-test", "status": "completed",
              "output": [{"type": "message", "id": "msg_1", "role": "assistant", "status": "completed",
                          "content": [{"type": "output_text", "text": "High tide at 6.", "annotations": []}]}]}
    upstream.routes["/v1/responses"] = Reply.json(answer)
    client = openai.OpenAI(base_url=f"{tooltap.url}/v1", api_key="sk-test-0123456789abcdef")
    tool = {"type": "function", "name": "tide_table", "parameters": {"type": "object", "properties": {}}}
    for question in ("When is high tide in Brest?", "Is the moon full tonight?"):
        client.responses.create(model="gpt-test", input=question, instructions="Be brief.", tools=[tool])
    tooltap.flush()
    sessions = tooltap.api("/sessions")["sessions"]
    assert sorted(s["title"] for s in sessions) == ["Is the moon full tonight?", "When is high tide in Brest?"]
    brest = next(s for s in sessions if "Brest" in s["title"])
    (t,) = tooltap.api(f"/sessions/{brest['id']}")["turns"]
    turn = tooltap.api(f"/turns/{t['id']}")
    assert turn["request"]["input"] == "When is high tide in Brest?"  # as sent, not as a list
    assert turn["request"]["instructions"] == "Be brief." and turn["request"]["tools"] == [tool]
    found = httpx.get(f"{tooltap.url}/_tooltap/api/search", params={"q": "tide Brest"}).json()["sessions"]
    assert [s["id"] for s in found] == [brest["id"]]
    page = httpx.get(f"{tooltap.url}/_tooltap/sessions/{brest['id']}").text
    assert "When is high tide in Brest?" in page and "High tide at 6." in page


def test_gemini_stream_with_key_in_query(tooltap, upstream):
    chunks = [
        {"candidates": [{"content": {"role": "model", "parts": [{"text": "Checking "}]}, "index": 0}],
         "modelVersion": "gemini-test"},
        {"candidates": [{"content": {"role": "model", "parts": [{"text": "now."}]}, "index": 0}]},
        {"candidates": [{"content": {"role": "model", "parts": [
            {"functionCall": {"name": "get_forecast", "args": {"city": "Paris"}}}]}, "index": 0,
            "finishReason": "STOP"}],
         "usageMetadata": {"promptTokenCount": 9, "candidatesTokenCount": 4, "totalTokenCount": 13}},
    ]
    path = "/v1beta/models/gemini-test:streamGenerateContent"
    upstream.routes[path] = Reply.sse(sse([(None, c) for c in chunks]))
    body = {"contents": [{"role": "user", "parts": [{"text": "weather in Paris"}]}],
            "tools": [{"functionDeclarations": [{"name": "get_forecast", "parameters": {
                "type": "OBJECT", "properties": {"city": {"type": "STRING"}}}}]}]}
    r = httpx.post(f"{tooltap.url}{path}?alt=sse&key=AIza-secret-0123456789", json=body)
    assert r.status_code == 200
    assert upstream.received[0].query == "alt=sse&key=AIza-secret-0123456789"
    turn = tooltap.api(f"/turns/{tooltap.api('/turns')['turns'][0]['id']}")
    assert turn["api"] == "gemini" and turn["model"] == "gemini-test"
    assert "AIza-secret" not in turn["path"]
    parts = turn["response"]["candidates"][0]["content"]["parts"]
    assert parts[0] == {"text": "Checking now."}
    assert [(c["name"], c["arguments"]) for c in turn["tool_calls"]] == [("get_forecast", {"city": "Paris"})]
    assert turn["usage"]["totalTokenCount"] == 13
    assert turn["request"] == body
