"""Anthropic Messages stream assembly, checked by hand and against the anthropic SDK's own
accumulator (`anthropic.lib.streaming._messages.accumulate_event`)."""

from __future__ import annotations

import copy
import json

from anthropic.lib.streaming._messages import accumulate_event
from hypothesis import given, settings
from hypothesis import strategies as st

from proxy.apis import by_name, detect
from proxy.apis.anthropic_messages import API, MessagesAssembler
from proxy.capture import StreamAssembly
from proxy.sse import Event, named_events
from tests.streams import assemble_cut

MODEL = "claude-sonnet-4-5-20250929"


def message_start(**usage):
    return {
        "type": "message_start",
        "message": {
            "id": "msg_01XFDUDYJgAACzvnptvVoYEL",
            "type": "message",
            "role": "assistant",
            "model": MODEL,
            "content": [],
            "stop_reason": None,
            "stop_sequence": None,
            "usage": {"input_tokens": 472, "output_tokens": 2, **usage},
        },
    }


def start(index, block):
    return {"type": "content_block_start", "index": index, "content_block": block}


def delta(index, **d):
    return {"type": "content_block_delta", "index": index, "delta": d}


def stop(index):
    return {"type": "content_block_stop", "index": index}


def message_delta(stop_reason="end_turn", **usage):
    return {"type": "message_delta", "delta": {"stop_reason": stop_reason, "stop_sequence": None}, "usage": usage}


PING = {"type": "ping"}
MESSAGE_STOP = {"type": "message_stop"}

# Thinking, text, a tool call whose JSON is split mid-token and mid-character, and a tool
# call with no arguments at all (no input_json_delta: its input is `{}`).
TOOL_STREAM = [
    message_start(cache_creation_input_tokens=0, cache_read_input_tokens=2048),
    PING,
    start(0, {"type": "thinking", "thinking": "", "signature": ""}),
    delta(0, type="thinking_delta", thinking="The user wants the weather. "),
    delta(0, type="thinking_delta", thinking="I should call get_weather."),
    delta(0, type="signature_delta", signature="EqQBCgIYAhIM1gbcDa9GJwZA2b3h"),
    stop(0),
    start(1, {"type": "text", "text": ""}),
    delta(1, type="text_delta", text="Let me check "),
    PING,
    delta(1, type="text_delta", text="the weather in Zürich."),
    stop(1),
    start(2, {"type": "tool_use", "id": "toolu_01T1x1fJ34qAmk2tNTrN7Up6", "name": "get_weather", "input": {}}),
    delta(2, type="input_json_delta", partial_json=""),
    delta(2, type="input_json_delta", partial_json='{"loc'),
    delta(2, type="input_json_delta", partial_json='ation": "Zür'),
    delta(2, type="input_json_delta", partial_json='ich, CH", "unit": "c'),
    delta(2, type="input_json_delta", partial_json='elsius", "days": [1, 2]}'),
    stop(2),
    start(3, {"type": "tool_use", "id": "toolu_02", "name": "get_time", "input": {}}),
    stop(3),
    message_delta("tool_use", output_tokens=89),
    MESSAGE_STOP,
]

TOOL_EXPECTED = {
    "id": "msg_01XFDUDYJgAACzvnptvVoYEL",
    "type": "message",
    "role": "assistant",
    "model": MODEL,
    "content": [
        {
            "type": "thinking",
            "thinking": "The user wants the weather. I should call get_weather.",
            "signature": "EqQBCgIYAhIM1gbcDa9GJwZA2b3h",
        },
        {"type": "text", "text": "Let me check the weather in Zürich."},
        {
            "type": "tool_use",
            "id": "toolu_01T1x1fJ34qAmk2tNTrN7Up6",
            "name": "get_weather",
            "input": {"location": "Zürich, CH", "unit": "celsius", "days": [1, 2]},
        },
        {"type": "tool_use", "id": "toolu_02", "name": "get_time", "input": {}},
    ],
    "stop_reason": "tool_use",
    "stop_sequence": None,
    "usage": {
        "input_tokens": 472,
        "output_tokens": 89,
        "cache_creation_input_tokens": 0,
        "cache_read_input_tokens": 2048,
    },
}

CITATION_1 = {
    "type": "web_search_result_location",
    "cited_text": "Zürich: 14°C, light rain",
    "url": "https://weather.example/zurich",
    "title": "Zürich weather",
    "encrypted_index": "Eo8BCioIAhgBIiQ",
}
CITATION_2 = {**CITATION_1, "cited_text": "Tomorrow: 17°C", "encrypted_index": "Eo8BCioIAhgBIiR"}
SEARCH_RESULT = {
    "type": "web_search_tool_result",
    "tool_use_id": "srvtoolu_014hJH82Qum7Td6UV8gDXThB",
    "content": [
        {
            "type": "web_search_result",
            "title": "Zürich weather",
            "url": "https://weather.example/zurich",
            "encrypted_content": "EqgfCioIARgBIiQ3YTAwMjY1Mi1mZjM5",
            "page_age": "April 30, 2025",
        }
    ],
}

# Server tool use, its result block (arrives whole), text with streamed citations, a
# redacted thinking block, several message_delta events (server tools send more than one),
# an unknown event type and an unknown delta type.
SEARCH_STREAM = [
    message_start(),
    start(0, {"type": "redacted_thinking", "data": "EmwKAhgBEgy3va3pzix/LafPsn4a"}),
    stop(0),
    start(1, {"type": "server_tool_use", "id": "srvtoolu_014hJH82Qum7Td6UV8gDXThB", "name": "web_search", "input": {}}),
    delta(1, type="input_json_delta", partial_json='{"query": "weather Zü'),
    delta(1, type="input_json_delta", partial_json='rich"}'),
    stop(1),
    message_delta(None, output_tokens=20, server_tool_use={"web_search_requests": 1}),
    start(2, SEARCH_RESULT),
    stop(2),
    {"type": "content_block_ping_v9", "index": 2},
    start(3, {"type": "text", "text": "", "citations": None}),
    delta(3, type="citations_delta", citation=CITATION_1),
    delta(3, type="text_delta", text="It is 14°C with light rain"),
    delta(3, type="citations_delta", citation=CITATION_2),
    delta(3, type="text_delta", text=", 17°C tomorrow."),
    delta(3, type="hologram_delta", hologram="ignored"),
    stop(3),
    message_delta("end_turn", output_tokens=310, input_tokens=9000, server_tool_use={"web_search_requests": 1}),
    MESSAGE_STOP,
]

SEARCH_EXPECTED_CONTENT = [
    {"type": "redacted_thinking", "data": "EmwKAhgBEgy3va3pzix/LafPsn4a"},
    {
        "type": "server_tool_use",
        "id": "srvtoolu_014hJH82Qum7Td6UV8gDXThB",
        "name": "web_search",
        "input": {"query": "weather Zürich"},
    },
    SEARCH_RESULT,
    {"type": "text", "text": "It is 14°C with light rain, 17°C tomorrow.", "citations": [CITATION_1, CITATION_2]},
]


def encode(events, eol="\n"):
    """The stream as Anthropic sends it: `event: <type>` then the JSON, one per block."""
    out = []
    for e in events:
        out.append(f"event: {e['type']}{eol}data: {json.dumps(e, ensure_ascii=False)}{eol}{eol}")
    return "".join(out).encode()


def assemble(raw: bytes, cuts=()):
    return assemble_cut(API, raw, cuts)


def sdk_accumulate(events):
    """The anthropic SDK's own Message accumulation over the same events (it knows only
    the documented event types)."""
    known = {"message_start", "message_delta", "message_stop", "content_block_start", "content_block_delta", "content_block_stop"}
    snapshot, bufs = None, {}
    for e in events:
        if e["type"] not in known:
            continue
        if e["type"] == "content_block_delta" and e["delta"]["type"] == "hologram_delta":
            continue
        snapshot = accumulate_event(event=copy.deepcopy(e), current_snapshot=snapshot, json_bufs=bufs)
    return snapshot.to_dict()


def drop_none(value):
    """The SDK writes explicit nulls for fields the wire omitted (stop_details, ...)."""
    if isinstance(value, dict):
        return {k: drop_none(v) for k, v in value.items() if v is not None}
    if isinstance(value, list):
        return [drop_none(v) for v in value]
    return value


# --- the rules, by hand ------------------------------------------------------------------


def test_tool_stream_gives_the_non_streaming_message():
    asm = assemble(encode(TOOL_STREAM))
    assert asm.result() == TOOL_EXPECTED
    assert asm.error is None


def test_tool_calls():
    calls = API.tool_calls(assemble(encode(TOOL_STREAM)).result())
    assert [(c.index, c.id, c.name, c.arguments) for c in calls] == [
        (0, "toolu_01T1x1fJ34qAmk2tNTrN7Up6", "get_weather", {"location": "Zürich, CH", "unit": "celsius", "days": [1, 2]}),
        (1, "toolu_02", "get_time", {}),
    ]
    assert json.loads(calls[0].arguments_raw) == calls[0].arguments
    assert all(c.arguments_error is None for c in calls)


def test_search_stream_blocks_citations_and_usage():
    result = assemble(encode(SEARCH_STREAM)).result()
    assert result["content"] == SEARCH_EXPECTED_CONTENT
    assert result["stop_reason"] == "end_turn"
    # output_tokens is cumulative: the last message_delta replaces it, never sums (20+310).
    # Fields a delta reports replace, fields it omits keep the message_start value.
    assert result["usage"] == {"input_tokens": 9000, "output_tokens": 310, "server_tool_use": {"web_search_requests": 1}}


def test_server_tool_use_is_a_tool_call():
    calls = API.tool_calls(assemble(encode(SEARCH_STREAM)).result())
    assert [(c.id, c.name, c.arguments) for c in calls] == [
        ("srvtoolu_014hJH82Qum7Td6UV8gDXThB", "web_search", {"query": "weather Zürich"})
    ]


def test_signature_delta_replaces():
    events = [
        message_start(),
        start(0, {"type": "thinking", "thinking": "", "signature": ""}),
        delta(0, type="thinking_delta", thinking="hm"),
        delta(0, type="signature_delta", signature="first"),
        delta(0, type="signature_delta", signature="second"),
        stop(0),
    ]
    assert assemble(encode(events)).result()["content"] == [{"type": "thinking", "thinking": "hm", "signature": "second"}]


def test_message_delta_keeps_usage_fields_it_omits_or_nulls():
    events = [
        message_start(cache_read_input_tokens=100),
        message_delta("max_tokens", output_tokens=5, cache_read_input_tokens=None),
    ]
    result = assemble(encode(events)).result()
    assert result["usage"] == {"input_tokens": 472, "output_tokens": 5, "cache_read_input_tokens": 100}
    assert result["stop_reason"] == "max_tokens"


def test_unparseable_tool_input_is_kept_not_raised():
    events = [
        message_start(),
        start(0, {"type": "tool_use", "id": "toolu_bad", "name": "write_file", "input": {}}),
        delta(0, type="input_json_delta", partial_json='{"path": "a.txt", "content": "x"'),
        delta(0, type="input_json_delta", partial_json=', oops}'),
        stop(0),
        message_delta("tool_use", output_tokens=9),
        MESSAGE_STOP,
    ]
    block = assemble(encode(events)).result()["content"][0]
    assert block["input_raw"] == '{"path": "a.txt", "content": "x", oops}'
    assert block["input_error"].startswith("invalid JSON")
    assert block["input"] == {}
    [call] = API.tool_calls({"content": [block]})
    assert (call.id, call.name, call.arguments_raw) == ("toolu_bad", "write_file", block["input_raw"])
    assert call.arguments is None and call.arguments_error.startswith("invalid JSON")


def test_error_event_mid_stream():
    events = TOOL_STREAM[:9] + [{"type": "error", "error": {"type": "overloaded_error", "message": "Overloaded"}}]
    asm = assemble(encode(events))
    assert asm.error == {"type": "overloaded_error", "message": "Overloaded"}
    result = asm.result()
    assert result["content"][1] == {"type": "text", "text": "Let me check "}
    assert result["stop_reason"] is None


def test_not_json_and_unknown_events_are_ignored():
    asm = API.new_assembler()
    asm.feed(Event(data="not json", event="message_start"))
    asm.feed(Event(data="[1, 2]"))
    for e in TOOL_STREAM:
        asm.feed(Event(data=json.dumps(e), event=e["type"]))
        asm.feed(Event(data=json.dumps({"type": "future_event", "index": 0, "delta": {"type": "text_delta"}})))
    assert asm.result() == TOOL_EXPECTED


def test_result_is_repeatable_and_detached():
    asm = assemble(encode(TOOL_STREAM))
    first = asm.result()
    first["content"][1]["text"] = "changed"
    first["usage"]["output_tokens"] = 0
    first["content"].append({"type": "text", "text": "extra"})
    assert asm.result() == TOOL_EXPECTED


def test_crlf_line_endings():
    assert assemble(encode(TOOL_STREAM, eol="\r\n")).result() == TOOL_EXPECTED


# --- the anthropic SDK agrees ------------------------------------------------------------


def test_sdk_accumulator_agrees_on_tool_stream():
    assert drop_none(sdk_accumulate(TOOL_STREAM)) == drop_none(assemble(encode(TOOL_STREAM)).result())


def test_sdk_accumulator_agrees_on_search_stream():
    sdk = drop_none(sdk_accumulate(SEARCH_STREAM))
    ours = drop_none(assemble(encode(SEARCH_STREAM)).result())
    assert sdk == ours
    assert ours["content"][3]["citations"] == [CITATION_1, CITATION_2]


# --- any chunking, any cut ---------------------------------------------------------------

RAW_TOOL = encode(TOOL_STREAM)
RAW_SEARCH = encode(SEARCH_STREAM)


@settings(max_examples=150, deadline=None)
@given(st.data())
def test_any_chunking_gives_the_same_message(data):
    raw = data.draw(st.sampled_from([RAW_TOOL, RAW_SEARCH]))
    cuts = data.draw(st.lists(st.integers(0, len(raw)), max_size=40))
    assert assemble(raw, cuts).result() == assemble(raw).result()


def streamed_json(events):
    """Per block index, the whole input_json_delta text the stream sends."""
    out = {}
    for e in events:
        if e["type"] == "content_block_delta" and e["delta"]["type"] == "input_json_delta":
            out[e["index"]] = out.get(e["index"], "") + e["delta"]["partial_json"]
    return out


@settings(max_examples=150, deadline=None)
@given(st.data())
def test_dropped_stream_gives_a_partial_message(data):
    events = data.draw(st.sampled_from([TOOL_STREAM, SEARCH_STREAM]))
    raw = encode(events)
    full = assemble(raw).result()
    end = data.draw(st.integers(0, len(raw)))
    asm = assemble(raw[:end], data.draw(st.lists(st.integers(0, end), max_size=5)))
    partial = asm.result()
    API.tool_calls(partial)  # never raises either
    assert asm.error is None
    assert len(partial["content"]) <= len(full["content"])
    for index, (got, want) in enumerate(zip(partial["content"], full["content"])):
        assert got["type"] == want["type"]
        for field in ("text", "thinking"):
            if field in want:
                assert want[field].startswith(got.get(field, ""))
        if "input_raw" in got:  # cut inside the tool input: the fragment so far is visible
            assert got["input_error"].startswith("incomplete")
            assert streamed_json(events)[index].startswith(got["input_raw"])
        elif "input" in want:
            assert got["input"] in (want["input"], {})


def test_cut_inside_tool_input():
    events = TOOL_STREAM[:17]  # four fragments of get_weather's arguments, no stop
    result = assemble(encode(events)).result()
    block = result["content"][2]
    assert block["input_raw"] == '{"location": "Zürich, CH", "unit": "c'
    assert block["input_error"].startswith("incomplete")
    [call] = API.tool_calls(result)
    assert call.name == "get_weather" and call.arguments is None and call.arguments_raw == block["input_raw"]
    assert result["usage"]["output_tokens"] == 2  # nothing later arrived


def test_empty_stream():
    result = assemble(b"").result()
    assert result["content"] == [] and API.tool_calls(result) == []


# --- the module's other duties ------------------------------------------------------------


def test_matches_keys_and_registry():
    assert API.matches("POST", "/v1/messages")
    assert API.matches("POST", "/anthropic/v1/messages/")
    assert not API.matches("GET", "/v1/messages")
    assert not API.matches("POST", "/v1/messages/count_tokens")
    assert not API.matches("POST", "/v1/chat/completions")
    assert detect("POST", "/v1/messages") is API and by_name("anthropic.messages") is API
    assert (API.keys.messages, API.keys.system, API.keys.tools) == ("messages", "system", "tools")


def test_usage_and_model():
    assert API.usage(TOOL_EXPECTED) == TOOL_EXPECTED["usage"]
    assert API.model({"model": "claude-alias"}, TOOL_EXPECTED) == MODEL
    assert API.model({"model": "claude-alias"}, None) == "claude-alias"


# --- a whole stream, its data not decoded first (the writer's way) ---------------------

# Texts that look like the bytes around them once encoded.
_tricky = st.sampled_from(["", "a", '"', "\\", '\\"', '"}}', '","text":"x', "\u2028", "\U0001f326", "\x01", "é"])
_piece = st.one_of(st.text(max_size=6), _tricky, st.lists(_tricky, max_size=3).map("".join))
_dumps = st.sampled_from([lambda e: json.dumps(e, ensure_ascii=False, separators=(",", ":")), json.dumps])
_events = st.one_of(
    st.builds(lambda i, text: delta(i, type="text_delta", text=text), st.integers(0, 1), _piece),
    st.builds(lambda i, part: delta(i, type="input_json_delta", partial_json=part), st.integers(0, 1), _piece),
    st.builds(lambda i, text: delta(i, type="thinking_delta", thinking=text), st.integers(0, 1), _piece),
    st.builds(lambda i: start(i, {"type": "text", "text": ""}), st.integers(0, 1)),
    st.builds(lambda i: start(i, {"type": "tool_use", "id": "t", "name": "n", "input": {}}), st.integers(0, 1)),
    st.builds(stop, st.integers(0, 1)),
    st.just(PING), st.just(message_delta("end_turn", output_tokens=3)),
)


def _same_either_way(raw: bytes):
    assert named_events(raw) is not None  # the way under test is taken
    whole = StreamAssembly(API, None)
    whole.feed_stream(raw)
    decoded = assemble(raw)
    assert whole._assembler.result() == decoded.result() and whole._assembler.error == decoded.error
    return whole._assembler


@settings(max_examples=300, deadline=None)
@given(events=st.lists(st.tuples(_events, _dumps, st.integers(1, 4)), max_size=30))
def test_deltas_read_by_their_shape_assemble_as_events_parsed_whole(events):
    """Runs of deltas of one shape (the fast way) with every kind of text in them, and
    blocks started and stopped under them."""
    stream = [message_start()] + [e for e, _, n in events for _ in range(n)]
    dumps = [d for _, d, n in events for _ in range(n)]
    raw = b"".join(f"event: {e['type']}\ndata: {d(e) if d else json.dumps(e)}\n\n".encode()
                   for e, d in zip(stream, [None] + dumps))
    _same_either_way(raw)


def test_a_run_of_text_deltas_is_parsed_whole_once(monkeypatch):
    parsed = []
    merge = MessagesAssembler._event
    monkeypatch.setattr(MessagesAssembler, "_event", lambda self, p, n: (parsed.append(p), merge(self, p, n)))
    texts = [f"word {i} \"quoted\" \\ " for i in range(50)]
    raw = encode([message_start(), start(0, {"type": "text", "text": ""}),
                  *[delta(0, type="text_delta", text=t) for t in texts], stop(0), MESSAGE_STOP])
    whole = StreamAssembly(API, None)
    whole.feed_stream(raw)
    assert whole._assembler.result()["content"] == [{"type": "text", "text": "".join(texts)}]
    assert len(parsed) == 2 + 1 + 2  # start, its block, the first delta, stop, message_stop


def test_deltas_after_their_block_stopped_are_dropped_the_writers_way_too():
    late = [delta(0, type="text_delta", text=t) for t in ("late", "r", "!")]
    asm = _same_either_way(encode([message_start(), start(0, {"type": "text", "text": ""}),
                                   delta(0, type="text_delta", text="on time"), stop(0), *late]))
    assert asm.result()["content"] == [{"type": "text", "text": "on time"}]


def test_a_stream_cut_short_assembles_the_same_the_writers_way():
    raw = encode(TOOL_STREAM)
    taken = 0
    for cut in range(1, 400, 7):
        stream = raw[:-cut]
        taken += named_events(stream) is not None
        whole = StreamAssembly(API, None)
        whole.feed_stream(stream)
        for event in whole._sse.close():  # what finish() does: nothing, if the decoder was not used
            whole._assembler.feed(event)
        decoded = assemble(stream)
        assert whole._assembler.result() == decoded.result() and whole._assembler.error == decoded.error, cut
    assert taken > 20  # most cuts land in a data line: the fast way


def test_the_fixture_streams_assemble_the_same_the_writers_way():
    for events in (TOOL_STREAM, SEARCH_STREAM):
        _same_either_way(encode(events))
