"""OpenAI Responses stream assembly, checked by hand and against the openai SDK's
`ResponseStreamState` (openai.lib.streaming.responses)."""

from __future__ import annotations

import copy
import json

from hypothesis import given, settings
from hypothesis import strategies as st
from openai import omit
from openai._models import construct_type
from openai.lib.streaming.responses._responses import ResponseStreamState
from openai.types.responses import ResponseStreamEvent

from proxy.apis import by_name, detect
from proxy.apis.openai_responses import API
from proxy.sse import Event
from tests.streams import assemble_cut

RESP_ID = "resp_67ccd2bed1ec8190b14f964abc0542670bb6a6b452d3795b"

BASE = {
    "id": RESP_ID,
    "object": "response",
    "created_at": 1741476542,
    "model": "gpt-5-2025-08-07",
    "instructions": "You are a weather bot.",
    "parallel_tool_calls": True,
    "tool_choice": "auto",
    "tools": [{"type": "function", "name": "get_weather", "parameters": {"type": "object"}, "strict": True}],
    "usage": None,
    "error": None,
    "incomplete_details": None,
}

REASONING_ITEM = {
    "id": "rs_1",
    "type": "reasoning",
    "summary": [{"type": "summary_text", "text": "Need the weather: call the tool."}],
    "encrypted_content": "gAAAAABo...",
}
MESSAGE_ITEM = {
    "id": "msg_1",
    "type": "message",
    "status": "completed",
    "role": "assistant",
    "content": [
        {
            "type": "output_text",
            "text": "Checking Zürich\u2028now.",
            "annotations": [{"type": "url_citation", "start_index": 0, "end_index": 8, "title": "t", "url": "https://x"}],
            "logprobs": [],
        }
    ],
}
CALL_ITEM = {
    "id": "fc_1",
    "type": "function_call",
    "status": "completed",
    "call_id": "call_Xk2pV0",
    "name": "get_weather",
    "arguments": '{"city":"Zürich","unit":"c"}',
}
CALL_ITEM_2 = {**CALL_ITEM, "id": "fc_2", "call_id": "call_Yz9", "arguments": "{}"}
USAGE = {
    "input_tokens": 328,
    "input_tokens_details": {"cached_tokens": 0},
    "output_tokens": 97,
    "output_tokens_details": {"reasoning_tokens": 64},
    "total_tokens": 425,
}
FINAL = {**BASE, "status": "completed", "output": [REASONING_ITEM, MESSAGE_ITEM, CALL_ITEM, CALL_ITEM_2], "usage": USAGE}


def in_progress(item):
    """An item as `output_item.added` announces it: status in_progress, no content yet."""
    started = {**copy.deepcopy(item), "status": "in_progress"}
    if item["type"] == "message":
        started["content"] = []
    if item["type"] == "function_call":
        started["arguments"] = ""
    if item["type"] == "reasoning":
        started["summary"] = []
    return started


def events_of(final_type="response.completed", final=FINAL):
    e = [
        {"type": "response.created", "response": {**BASE, "status": "in_progress", "output": []}},
        {"type": "response.in_progress", "response": {**BASE, "status": "in_progress", "output": []}},
        {"type": "response.output_item.added", "output_index": 0, "item": in_progress(REASONING_ITEM)},
        {"type": "response.reasoning_summary_part.added", "item_id": "rs_1", "output_index": 0, "summary_index": 0,
         "part": {"type": "summary_text", "text": ""}},
        {"type": "response.reasoning_summary_text.delta", "item_id": "rs_1", "output_index": 0, "summary_index": 0,
         "delta": "Need the weather: "},
        {"type": "response.reasoning_summary_text.delta", "item_id": "rs_1", "output_index": 0, "summary_index": 0,
         "delta": "call the tool."},
        {"type": "response.reasoning_summary_part.done", "item_id": "rs_1", "output_index": 0, "summary_index": 0,
         "part": REASONING_ITEM["summary"][0]},
        {"type": "response.output_item.done", "output_index": 0, "item": REASONING_ITEM},
        {"type": "response.output_item.added", "output_index": 1, "item": in_progress(MESSAGE_ITEM)},
        {"type": "response.content_part.added", "item_id": "msg_1", "output_index": 1, "content_index": 0,
         "part": {"type": "output_text", "text": "", "annotations": [], "logprobs": []}},
        {"type": "response.output_text.delta", "item_id": "msg_1", "output_index": 1, "content_index": 0,
         "delta": "Checking Zü", "logprobs": []},
        {"type": "response.output_text.delta", "item_id": "msg_1", "output_index": 1, "content_index": 0,
         "delta": "rich\u2028now.", "logprobs": []},
        {"type": "response.output_text.annotation.added", "item_id": "msg_1", "output_index": 1, "content_index": 0,
         "annotation_index": 0, "annotation": MESSAGE_ITEM["content"][0]["annotations"][0]},
        {"type": "response.output_text.done", "item_id": "msg_1", "output_index": 1, "content_index": 0,
         "text": "Checking Zürich\u2028now.", "logprobs": []},
        {"type": "response.content_part.done", "item_id": "msg_1", "output_index": 1, "content_index": 0,
         "part": MESSAGE_ITEM["content"][0]},
        {"type": "response.output_item.done", "output_index": 1, "item": MESSAGE_ITEM},
        {"type": "response.output_item.added", "output_index": 2, "item": in_progress(CALL_ITEM)},
        {"type": "response.function_call_arguments.delta", "item_id": "fc_1", "output_index": 2, "delta": '{"city'},
        {"type": "response.function_call_arguments.delta", "item_id": "fc_1", "output_index": 2, "delta": '":"Zür'},
        {"type": "response.function_call_arguments.delta", "item_id": "fc_1", "output_index": 2, "delta": 'ich","unit":"c"}'},
        {"type": "response.function_call_arguments.done", "item_id": "fc_1", "output_index": 2,
         "arguments": CALL_ITEM["arguments"]},
        {"type": "response.output_item.done", "output_index": 2, "item": CALL_ITEM},
        {"type": "response.output_item.added", "output_index": 3, "item": in_progress(CALL_ITEM_2)},
        {"type": "response.function_call_arguments.delta", "item_id": "fc_2", "output_index": 3, "delta": "{}"},
        {"type": "response.function_call_arguments.done", "item_id": "fc_2", "output_index": 3, "arguments": "{}"},
        {"type": "response.output_item.done", "output_index": 3, "item": CALL_ITEM_2},
        {"type": final_type, "response": final},
    ]
    return [{**ev, "sequence_number": n} for n, ev in enumerate(e)]


EVENTS = events_of()


def encode(events, eol="\n"):
    return "".join(
        f"event: {e['type']}{eol}data: {json.dumps(e, ensure_ascii=False)}{eol}{eol}" for e in events
    ).encode()


def assemble(raw: bytes, cuts=()):
    return assemble_cut(API, raw, cuts)


def sdk_state(events):
    state = ResponseStreamState(input_tools=omit, text_format=omit)
    for e in events:
        state.handle_event(construct_type(type_=ResponseStreamEvent, value=copy.deepcopy(e)))
    return state


def plain(value):
    """The SDK's dicts, minus what it adds (parsed values) and its explicit nulls."""
    if isinstance(value, dict):
        return {k: plain(v) for k, v in value.items() if v is not None and k not in ("parsed", "parsed_arguments")}
    if isinstance(value, list):
        return [plain(v) for v in value]
    return value


# --- a finished stream ---------------------------------------------------------------------


def test_completed_stream_is_the_final_response():
    asm = assemble(encode(EVENTS))
    assert asm.result() == FINAL
    assert asm.error is None


def test_sdk_agrees_on_completed_stream():
    sdk = sdk_state(EVENTS)._completed_response.to_dict()
    assert plain(sdk) == plain(assemble(encode(EVENTS)).result())


def test_tool_calls():
    calls = API.tool_calls(assemble(encode(EVENTS)).result())
    assert [(c.index, c.id, c.name, c.arguments_raw, c.arguments) for c in calls] == [
        (0, "call_Xk2pV0", "get_weather", '{"city":"Zürich","unit":"c"}', {"city": "Zürich", "unit": "c"}),
        (1, "call_Yz9", "get_weather", "{}", {}),
    ]


def test_custom_and_mcp_tool_calls():
    response = {
        "output": [
            {"type": "custom_tool_call", "id": "ctc_1", "call_id": "call_c", "name": "apply_patch", "input": "*** Begin Patch"},
            {"type": "mcp_call", "id": "mcp_1", "name": "search", "server_label": "docs", "arguments": '{"q": 1}'},
            {"type": "function_call", "call_id": "call_bad", "name": "f", "arguments": '{"a": '},
            {"type": "web_search_call", "id": "ws_1", "status": "completed"},
        ]
    }
    calls = API.tool_calls(response)
    assert [(c.id, c.name, c.arguments) for c in calls] == [
        ("call_c", "apply_patch", "*** Begin Patch"),
        ("mcp_1", "search", {"q": 1}),
        ("call_bad", "f", None),
    ]
    assert calls[2].arguments_error.startswith("invalid JSON")


def test_incomplete_and_failed_final_events():
    incomplete = {**FINAL, "status": "incomplete", "incomplete_details": {"reason": "max_output_tokens"}}
    asm = assemble(encode(events_of("response.incomplete", incomplete)))
    assert asm.result() == incomplete and asm.error is None

    error = {"code": "server_error", "message": "The model failed."}
    failed = {**FINAL, "status": "failed", "error": error, "output": []}
    asm = assemble(encode(events_of("response.failed", failed)))
    assert asm.result() == failed
    assert asm.error == error


def test_final_response_without_output_is_rebuilt():
    # Some servers send a response.completed whose Response leaves `output` out.
    final = {k: v for k, v in FINAL.items() if k != "output"}
    events = events_of(final=final)
    result = assemble(encode(events)).result()
    assert result == FINAL
    assert plain(sdk_state(events)._completed_response.to_dict()) == plain(result)


def test_error_event():
    events = EVENTS[:12] + [{"type": "error", "code": "rate_limit_exceeded", "message": "Slow down", "param": None,
                             "sequence_number": 12}]
    asm = assemble(encode(events))
    assert asm.error == {"code": "rate_limit_exceeded", "message": "Slow down", "param": None}
    assert asm.result()["output"][1]["content"][0]["text"] == "Checking Zürich\u2028now."


def test_nested_error_event():
    asm = API.new_assembler()
    asm.feed(Event(data=json.dumps({"type": "error", "error": {"type": "server_error", "message": "boom"}}), event="error"))
    assert asm.error == {"type": "server_error", "message": "boom"}


# --- a dropped stream ------------------------------------------------------------------------


def test_dropped_after_items_done_uses_done_items():
    result = assemble(encode(EVENTS[:-1])).result()
    assert result == {**BASE, "status": "in_progress", "output": FINAL["output"]}
    assert [c.id for c in API.tool_calls(result)] == ["call_Xk2pV0", "call_Yz9"]


def test_dropped_while_text_streams():
    result = assemble(encode(EVENTS[:12])).result()  # two text deltas, nothing done
    assert result["status"] == "in_progress"
    reasoning, message = result["output"]
    assert reasoning == REASONING_ITEM
    assert message["status"] == "in_progress"
    assert message["content"] == [{"type": "output_text", "text": "Checking Zürich\u2028now.", "annotations": [], "logprobs": []}]


def test_dropped_while_arguments_stream():
    result = assemble(encode(EVENTS[:19])).result()  # two argument fragments
    call = result["output"][2]
    assert call == {**in_progress(CALL_ITEM), "arguments": '{"city":"Zür'}
    [tool] = API.tool_calls(result)
    assert (tool.id, tool.name, tool.arguments_raw, tool.arguments) == ("call_Xk2pV0", "get_weather", '{"city":"Zür', None)
    assert tool.arguments_error is not None


def test_dropped_at_each_event_agrees_with_sdk_snapshot():
    # The SDK's live snapshot is the `added` items plus deltas; ours prefers `.done` items,
    # which only add the final status. Texts and arguments must agree at every cut.
    for end in range(1, len(EVENTS)):
        state = sdk_state(EVENTS[:end])
        sdk = plain(state._ResponseStreamState__current_snapshot.to_dict(warnings=False))
        ours = plain(assemble(encode(EVENTS[:end])).result())
        assert len(sdk["output"]) == len(ours["output"]), end
        for s, o in zip(sdk["output"], ours["output"]):
            assert s["id"] == o["id"] and s["type"] == o["type"]
            assert s.get("arguments") == o.get("arguments"), end
            assert [p.get("text") for p in s.get("content", [])] == [p.get("text") for p in o.get("content", [])], end


def test_deltas_without_added_item_are_kept():
    asm = API.new_assembler()
    for e in [
        {"type": "response.output_text.delta", "item_id": "msg_9", "output_index": 0, "content_index": 0, "delta": "he"},
        {"type": "response.output_text.delta", "item_id": "msg_9", "output_index": 0, "content_index": 0, "delta": "llo"},
        {"type": "response.refusal.delta", "item_id": "msg_9", "output_index": 0, "content_index": 1, "delta": "no"},
        {"type": "response.custom_tool_call_input.delta", "item_id": "ctc_1", "output_index": 1, "delta": "*** Begin"},
    ]:
        asm.feed(Event(data=json.dumps(e), event=e["type"]))
    assert asm.result() == {
        "output": [
            {"id": "msg_9", "content": [
                {"type": "output_text", "text": "hello", "annotations": []},
                {"type": "refusal", "refusal": "no"},
            ]},
            {"id": "ctc_1", "input": "*** Begin"},
        ]
    }


def test_result_is_repeatable_and_detached():
    asm = assemble(encode(EVENTS[:19]))
    first = asm.result()
    again = copy.deepcopy(first)
    first["output"][2]["arguments"] = "changed"
    first["output"].clear()
    assert asm.result() == again


RAW = encode(EVENTS)


@settings(max_examples=150, deadline=None)
@given(st.lists(st.integers(0, len(RAW)), max_size=40))
def test_any_chunking_gives_the_same_response(cuts):
    assert assemble(RAW, cuts).result() == FINAL


@settings(max_examples=150, deadline=None)
@given(st.data())
def test_any_cut_gives_a_partial_response(data):
    end = data.draw(st.integers(0, len(RAW)))
    asm = assemble(RAW[:end], data.draw(st.lists(st.integers(0, end), max_size=5)))
    result = asm.result()
    calls = API.tool_calls(result)
    assert asm.error is None
    assert len(result["output"]) <= len(FINAL["output"])
    for got, want in zip(result["output"], FINAL["output"]):
        assert got["id"] == want["id"]
        if want["type"] == "function_call":
            assert want["arguments"].startswith(got["arguments"])
        if want["type"] == "message" and got["content"]:
            assert want["content"][0]["text"].startswith(got["content"][0]["text"])
    assert len(calls) <= 2


# --- the module's other duties ---------------------------------------------------------------


def test_matches_keys_and_registry():
    assert API.matches("POST", "/v1/responses")
    assert API.matches("POST", "/openai/v1/responses/")
    assert not API.matches("GET", "/v1/responses")
    assert not API.matches("POST", f"/v1/responses/{RESP_ID}/cancel")
    assert not API.matches("POST", "/v1/chat/completions")
    assert detect("POST", "/v1/responses") is API and by_name("openai.responses") is API
    assert (API.keys.messages, API.keys.system, API.keys.tools) == ("input", "instructions", "tools")


def test_usage_and_model():
    assert API.usage(FINAL) == USAGE
    assert API.model({"model": "gpt-5"}, FINAL) == "gpt-5-2025-08-07"
    assert API.model({"model": "gpt-5"}, None) == "gpt-5"
