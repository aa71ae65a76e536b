"""ChatAssembler and OpenAIChat: stream reassembly with every quirk in DESIGN.md.

Where the official SDK's accumulator (`openai.lib.streaming.chat.ChatCompletionStreamState`)
handles a case, the result is compared with it; where it is known to be wrong, the test
asserts a hand-written expectation and says what the SDK does.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from openai.lib.streaming.chat import ChatCompletionStreamState
from openai.types.chat import ChatCompletionChunk

from proxy.apis import by_name, detect
from proxy.apis.openai_chat import API, ChatAssembler
from proxy.capture import StreamAssembly
from proxy.sse import Event, SSEDecoder, data_only

FIXTURES = Path(__file__).parent / "fixtures" / "cline-weather"
TURNS = (1, 2, 3)


# -- helpers ---------------------------------------------------------------------------

def chunk(*choices: dict, **top: Any) -> dict:
    out = {"id": "chatcmpl-1", "object": "chat.completion.chunk", "created": 1700000000, "model": "m"}
    out.update(top)
    out["choices"] = list(choices)
    return out


def choice(delta: dict | None = None, index: int = 0, finish: str | None = None, **extra: Any) -> dict:
    return {"index": index, "delta": delta or {}, "logprobs": None, "finish_reason": finish, **extra}


def call(index: int | None = None, id: str | None = None, name: str | None = None,
         args: str | None = None, type: str | None = None, **extra: Any) -> dict:
    entry: dict[str, Any] = {} if index is None else {"index": index}
    if id is not None:
        entry["id"] = id
        type = "function" if type is None else type  # first fragments carry it
    if type is not None:
        entry["type"] = type
    fn = {}
    if name is not None:
        fn["name"] = name
    if args is not None:
        fn["arguments"] = args
    if fn:
        entry["function"] = fn
    entry.update(extra)
    return entry


def calls(*entries: dict, index: int = 0, finish: str | None = None, **delta: Any) -> dict:
    return choice({**delta, "tool_calls": list(entries)}, index=index, finish=finish)


def assemble(chunks: list[dict], done: bool = True) -> ChatAssembler:
    asm = ChatAssembler()
    for c in chunks:
        asm.feed(Event(data=json.dumps(c, ensure_ascii=False)))
    if done:
        asm.feed(Event(data="[DONE]"))
    return asm


def message(asm: ChatAssembler, i: int = 0) -> dict:
    return asm.result()["choices"][i]["message"]


def sdk(chunks: list[dict]) -> dict:
    state = ChatCompletionStreamState()
    for c in chunks:
        state.handle_chunk(ChatCompletionChunk.model_validate(c))
    return state.current_completion_snapshot.model_dump(mode="json")


def norm(value: Any, key: str = "") -> Any:
    """Drop what differs only in presentation: null fields (the SDK's models add
    `refusal`, `audio`, `annotations`... as null), the SDK's `parsed*` additions and the
    stream-only `index` of tool calls."""
    if isinstance(value, dict):
        out = {}
        for k, v in value.items():
            if (v is None and k != "content") or k in ("parsed", "parsed_arguments"):
                continue
            if key == "tool_calls" and k == "index":
                continue
            out[k] = norm(v, k)
        return out
    if isinstance(value, list):
        return [norm(v, key) for v in value]
    return value


def assert_same_as_sdk(chunks: list[dict]) -> dict:
    mine = assemble(chunks).result()
    theirs = sdk(chunks)
    for c in theirs["choices"]:  # the SDK leaves role unset when no delta sent it
        c["message"]["role"] = c["message"].get("role") or "assistant"
    assert norm(mine) == norm(theirs)
    return mine


def sse_bytes(turn: int) -> bytes:
    return (FIXTURES / f"turn{turn}" / "response.sse").read_bytes()


def load(turn: int, name: str) -> dict:
    return json.loads((FIXTURES / f"turn{turn}" / name).read_text())


def assemble_bytes(chunks: list[bytes]) -> ChatAssembler:
    dec, asm = SSEDecoder(), ChatAssembler()
    for piece in chunks:
        for event in dec.feed(piece):
            asm.feed(event)
    for event in dec.close():
        asm.feed(event)
    return asm


def fixture_chunks(turn: int) -> list[dict]:
    events = SSEDecoder().feed(sse_bytes(turn))
    return [json.loads(e.data) for e in events if e.data != "[DONE]"]


# -- the cline-weather fixture -----------------------------------------------------------

@pytest.mark.parametrize("turn", TURNS)
def test_fixture_reassembles_exactly(turn):
    asm = assemble_bytes([sse_bytes(turn)])
    assert asm.result() == load(turn, "expected_completion.json")
    assert asm.done and asm.error is None and asm.unparsed == []


@pytest.mark.parametrize("turn", TURNS)
def test_fixture_reassembles_exactly_the_writers_way(turn, monkeypatch):
    """A whole stream, as the writer assembles it: its keep-alive comments passed over,
    most of its chunks read by their shape."""
    merged = []
    merge = ChatAssembler._chunk
    monkeypatch.setattr(ChatAssembler, "_chunk", lambda self, c, e: (merged.append(c), merge(self, c, e)))
    whole = StreamAssembly(API, None)
    whole.feed_stream(sse_bytes(turn))
    asm = whole._assembler
    assert asm.result() == load(turn, "expected_completion.json") and asm.done
    assert len(merged) < asm.chunks / 5


@settings(max_examples=40, deadline=None)
@given(turn=st.sampled_from(TURNS), cuts=st.lists(st.integers(min_value=0), max_size=60))
def test_fixture_reassembles_exactly_under_any_chunking(turn, cuts):
    data = sse_bytes(turn)
    edges = [0, *sorted(c % (len(data) + 1) for c in cuts), len(data)]
    asm = assemble_bytes([data[a:b] for a, b in zip(edges, edges[1:])])
    assert asm.result() == load(turn, "expected_completion.json")


def test_fixture_reassembles_byte_by_byte():
    data = sse_bytes(2)
    asm = assemble_bytes([data[i : i + 1] for i in range(len(data))])
    assert asm.result() == load(2, "expected_completion.json")


@pytest.mark.parametrize("turn", TURNS)
def test_fixture_is_not_the_published_wrong_reassembly(turn):
    result = assemble_bytes([sse_bytes(turn)]).result()
    published = load(turn, "published_completion.json")
    assert result != published
    # What the published capture lost: the text before the call...
    assert published["choices"][0]["message"]["content"] is None
    assert result["choices"][0]["message"]["content"]
    # ...and, in turn 2, the tool name.
    names = [c["function"]["name"] for c in result["choices"][0]["message"]["tool_calls"]]
    assert all(names)
    if turn == 2:
        assert published["choices"][0]["message"]["tool_calls"][0]["function"]["name"] == ""
        assert names == ["read_file"]


@pytest.mark.parametrize("turn", TURNS)
def test_fixture_matches_the_sdk(turn):
    assert_same_as_sdk(fixture_chunks(turn))


def test_fixture_tool_calls():
    names = []
    for turn in TURNS:
        calls_ = API.tool_calls(assemble_bytes([sse_bytes(turn)]).result())
        assert len(calls_) == 1 and calls_[0].index == 0 and calls_[0].arguments_error is None
        assert calls_[0].id.startswith("call_00_")
        assert "task_progress" in calls_[0].arguments
        names.append(calls_[0].name)
    assert names == ["list_files", "read_file", "cIya4J0mcp0get_forecast"]


# -- tool call quirks --------------------------------------------------------------------

def test_plain_tool_call_fragments():
    chunks = [
        chunk(choice({"role": "assistant", "content": None})),
        chunk(calls(call(0, "call_1", "get_weather", "", type="function"))),
        chunk(calls(call(0, args='{"city":'))),
        chunk(calls(call(0, args=' "Paris"}'))),
        chunk(choice(finish="tool_calls")),
    ]
    result = assert_same_as_sdk(chunks)
    assert result["choices"][0] == {
        "index": 0,
        "message": {
            "role": "assistant",
            "content": None,
            "tool_calls": [{"id": "call_1", "type": "function",
                            "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'}}],
        },
        "logprobs": None,
        "finish_reason": "tool_calls",
    }


def test_repeated_id_type_name_are_not_concatenated():
    # Some servers repeat id, type and name on every fragment. The SDK concatenates them
    # (id "call_1call_1call_1", name "fff"): expectation written by hand.
    chunks = [chunk(calls(call(0, "call_1", "f", part, type="function"))) for part in ('{"a"', ":", "1}")]
    chunks.append(chunk(calls(call(0, "", "", "", type=""))))  # and blanks (the SDK rejects type "")
    tc = message(assemble(chunks))["tool_calls"]
    assert tc == [{"id": "call_1", "type": "function", "function": {"name": "f", "arguments": '{"a":1}'}}]


def test_empty_id_and_name_later_do_not_overwrite():
    chunks = [
        chunk(calls(call(0, "call_1", "f", "{", type="function"))),
        chunk(calls(call(0, "", "", "}"))),
    ]
    result = assert_same_as_sdk(chunks)
    assert result["choices"][0]["message"]["tool_calls"][0] == {
        "id": "call_1", "type": "function", "function": {"name": "f", "arguments": "{}"}}


def test_a_different_name_later_does_not_replace_the_first():
    chunks = [chunk(calls(call(0, "c1", "read_file", "{"))), chunk(calls(call(0, None, "file", "}")))]
    assert message(assemble(chunks))["tool_calls"][0]["function"] == {"name": "read_file", "arguments": "{}"}


def test_bare_fragments_and_fragments_that_say_more():
    # A fragment of arguments alone on a known call takes a short way; one that names a
    # function its call lacks, carries an extra field, or names an unseen index does not.
    chunks = [
        chunk(calls(call(0, "c0", None, "{"))),
        chunk(calls(call(0, args='"a":'))),
        chunk(calls({"index": 0, "function": {"name": "late_name", "arguments": "1"}})),
        chunk(calls({"index": 0, "function": {"arguments": ""}})),
        chunk(calls({"index": 0, "signature": "s1"})),
        chunk(calls(call(1, args="{}"))),
        chunk(calls(call(0, args="}"))),
    ]
    assert message(assemble(chunks))["tool_calls"] == [
        {"id": "c0", "type": "function", "function": {"name": "late_name", "arguments": '{"a":1}'},
         "signature": "s1"},
        {"id": None, "type": "function", "function": {"name": "", "arguments": "{}"}},
    ]


def test_interleaved_calls():
    chunks = [
        chunk(calls(call(0, "c0", "a", ""), call(1, "c1", "b", ""))),
        chunk(calls(call(1, args='{"y":'))),
        chunk(calls(call(0, args='{"x":'))),
        chunk(calls(call(0, args="1}"))),
        chunk(calls(call(1, args="2}"))),
    ]
    result = assert_same_as_sdk(chunks)
    tc = result["choices"][0]["message"]["tool_calls"]
    assert [(c["id"], c["function"]["name"], c["function"]["arguments"]) for c in tc] == [
        ("c0", "a", '{"x":1}'), ("c1", "b", '{"y":2}')]


def test_several_entries_in_one_delta_even_with_the_same_index():
    chunks = [
        chunk(choice({"role": "assistant"})),
        chunk(calls(call(0, "c0", "a", "{"), call(0, args='"k"'), call(1, "c1", "b", "{}"), call(0, args=":0}"))),
    ]
    result = assert_same_as_sdk(chunks)
    tc = result["choices"][0]["message"]["tool_calls"]
    assert [c["function"] for c in tc] == [{"name": "a", "arguments": '{"k":0}'}, {"name": "b", "arguments": "{}"}]


def test_missing_index_gemini_whole_calls():
    # Gemini's compat endpoint sends each call whole, with an id and no index. The SDK
    # rejects the chunk (pydantic: tool_calls.0.index required) and its accumulator raises
    # RuntimeError("Expected list delta entry to have an `index` key").
    chunks = [
        chunk(choice({"role": "assistant"})),
        chunk(calls(call(None, "g1", "get_weather", '{"city":"Paris"}', type="function"),
                    call(None, "g2", "get_time", '{"tz":"CET"}', type="function"))),
        chunk(calls(call(None, "g3", "noop", "{}", type="function"), finish="tool_calls")),
    ]
    tc = message(assemble(chunks))["tool_calls"]
    assert [(c["id"], c["function"]["name"], c["function"]["arguments"]) for c in tc] == [
        ("g1", "get_weather", '{"city":"Paris"}'), ("g2", "get_time", '{"tz":"CET"}'), ("g3", "noop", "{}")]


def test_missing_index_fragments_continue_the_last_call():
    chunks = [
        chunk(calls(call(None, "g1", "f", '{"a":'))),
        chunk(calls(call(None, None, None, "1}"))),
        chunk(calls(call(None, "g1", "f", ""))),  # the same id again: still the same call
        chunk(calls(call(None, "g2", "h", "{}"))),  # a new id: a new call
        chunk(calls(call(None, None, None, ""))),
    ]
    tc = message(assemble(chunks))["tool_calls"]
    assert [(c["id"], c["function"]) for c in tc] == [
        ("g1", {"name": "f", "arguments": '{"a":1}'}), ("g2", {"name": "h", "arguments": "{}"})]


def test_missing_index_first_entry_without_id_starts_a_call():
    tc = message(assemble([chunk(calls(call(None, None, "f", "{}")))]))["tool_calls"]
    assert tc == [{"id": None, "type": "function", "function": {"name": "f", "arguments": "{}"}}]


def test_ollama_reuses_index_zero_for_a_parallel_batch():
    # Ollama numbers every call of a parallel batch 0. The SDK merges them into one call
    # (id "o1o2", name "get_weatherget_time", arguments '{"city":"Paris"}{}').
    chunks = [
        chunk(choice({"role": "assistant", "content": ""})),
        chunk(calls(call(0, "o1", "get_weather", '{"city":"Paris"}', type="function"))),
        chunk(calls(call(0, "o2", "get_time", "{}", type="function"))),
        chunk(choice(finish="tool_calls")),
    ]
    tc = message(assemble(chunks))["tool_calls"]
    assert [(c["id"], c["function"]["name"], c["function"]["arguments"]) for c in tc] == [
        ("o1", "get_weather", '{"city":"Paris"}'), ("o2", "get_time", "{}")]
    assert [c.index for c in API.tool_calls(assemble(chunks).result())] == [0, 1]


def test_reused_index_then_fragments_go_to_the_newest_call():
    chunks = [
        chunk(calls(call(0, "o1", "a", "{}"))),
        chunk(calls(call(0, "o2", "b", '{"x"'))),
        chunk(calls(call(0, args=":1}"))),
    ]
    tc = message(assemble(chunks))["tool_calls"]
    assert [c["function"] for c in tc] == [{"name": "a", "arguments": "{}"}, {"name": "b", "arguments": '{"x":1}'}]


def test_tool_call_extra_fields_are_kept():
    # Gemini's compat endpoint puts the thought signature on the call.
    extra = {"google": {"thought_signature": "sig=="}}
    tc = message(assemble([chunk(calls(call(0, "g1", "f", "{}", extra_content=extra)))]))["tool_calls"]
    assert tc[0]["extra_content"] == extra


def test_arguments_sent_as_an_object():
    tc = message(assemble([chunk(calls({"index": 0, "id": "c", "function": {"name": "f", "arguments": {"a": 1}}}))]))
    assert tc["tool_calls"][0]["function"]["arguments"] == '{"a":1}'


# -- content, refusal, reasoning ---------------------------------------------------------

def test_content_and_tool_calls_in_the_same_delta_and_text_before():
    chunks = [
        chunk(choice({"role": "assistant", "content": "Let me "})),
        chunk(choice({"content": "check."})),
        chunk(calls(call(0, "c1", "f", "{}"), content=" Calling.")),
        chunk(choice({"content": " Done."}, finish="tool_calls")),
    ]
    result = assert_same_as_sdk(chunks)
    msg = result["choices"][0]["message"]
    assert msg["content"] == "Let me check. Calling. Done."
    assert msg["tool_calls"][0]["function"]["name"] == "f"


def test_no_content_stays_null():
    msg = message(assemble([chunk(choice({"role": "assistant"})), chunk(calls(call(0, "c", "f", "{}")))]))
    assert "content" in msg and msg["content"] is None
    msg = message(assemble([chunk(choice({"role": "assistant", "content": None}), choice(finish="stop"))]))
    assert msg["content"] is None


def test_only_empty_content_pieces_give_empty_string_like_the_sdk():
    # DeepSeek opens with content "" even for a tool-only answer, and its non-streaming
    # API returns "" there.
    result = assert_same_as_sdk([chunk(choice({"role": "assistant", "content": ""})),
                                 chunk(calls(call(0, "c", "f", "{}")))])
    assert result["choices"][0]["message"]["content"] == ""


def test_role_defaults_to_assistant():
    assert message(assemble([chunk(choice({"content": "hi"}))]))["role"] == "assistant"


def test_refusal():
    chunks = [
        chunk(choice({"role": "assistant", "content": None, "refusal": None})),
        chunk(choice({"refusal": "I can't "})),
        chunk(choice({"refusal": "help with that."}, finish="stop")),
    ]
    msg = assert_same_as_sdk(chunks)["choices"][0]["message"]
    assert msg["refusal"] == "I can't help with that." and msg["content"] is None


def test_refusal_null_is_kept_as_sent():
    # OpenAI sends `refusal: null`; its non-streaming message has `refusal: null`.
    msg = message(assemble([chunk(choice({"role": "assistant", "content": "", "refusal": None})),
                            chunk(choice({"content": "hi"}))]))
    assert msg == {"role": "assistant", "content": "hi", "refusal": None}


def test_reasoning_content_deepseek_llamacpp():
    chunks = [
        chunk(choice({"role": "assistant", "content": None, "reasoning_content": ""})),
        chunk(choice({"content": None, "reasoning_content": "The user wants "})),
        chunk(choice({"content": None, "reasoning_content": "weather."})),
        chunk(choice({"content": "Sunny.", "reasoning_content": None}, finish="stop")),
    ]
    msg = assert_same_as_sdk(chunks)["choices"][0]["message"]
    assert msg["reasoning_content"] == "The user wants weather." and msg["content"] == "Sunny."


def test_reasoning_openrouter_vllm_ollama():
    chunks = [
        chunk(choice({"role": "assistant", "content": "", "reasoning": "Think"}), provider="DeepInfra"),
        chunk(choice({"content": "", "reasoning": "ing..."}), provider="DeepInfra"),
        chunk(choice({"content": "Answer", "reasoning": None}, finish="stop", native_finish_reason="stop"),
              provider="DeepInfra"),
    ]
    result = assemble(chunks).result()
    msg = result["choices"][0]["message"]
    assert msg["reasoning"] == "Thinking..." and msg["content"] == "Answer"
    assert result["provider"] == "DeepInfra"
    # The SDK keeps choice extras from a choice's first chunk only, so it drops this one.
    assert result["choices"][0].pop("native_finish_reason") == "stop"
    assert norm(result) == norm(sdk(chunks))


def test_unknown_delta_fields_are_kept():
    chunks = [
        chunk(choice({"role": "assistant", "annotations": [{"type": "url_citation", "n": 1}]})),
        chunk(choice({"annotations": [{"type": "url_citation", "n": 2}], "thinking": "a"})),
        chunk(choice({"thinking": "b", "annotations": None})),
    ]
    msg = message(assemble(chunks))
    assert msg["annotations"] == [{"type": "url_citation", "n": 1}, {"type": "url_citation", "n": 2}]
    assert msg["thinking"] == "ab"


# -- usage ------------------------------------------------------------------------------

DEEPSEEK_USAGE = {"prompt_tokens": 10, "completion_tokens": 3, "total_tokens": 13,
                  "prompt_tokens_details": {"cached_tokens": 8},
                  "prompt_cache_hit_tokens": 8, "prompt_cache_miss_tokens": 2}


def test_usage_from_the_final_chunk_without_choices():
    chunks = [chunk(choice({"role": "assistant", "content": "hi"}), usage=None),
              chunk(choice(finish="stop"), usage=None),
              chunk(usage=DEEPSEEK_USAGE)]
    result = assert_same_as_sdk(chunks)
    assert result["usage"] == DEEPSEEK_USAGE
    assert API.usage(result) == DEEPSEEK_USAGE


def test_cumulative_usage_last_wins_never_summed():
    chunks = [chunk(choice({"content": "a"}), usage={"prompt_tokens": 5, "completion_tokens": 1, "total_tokens": 6}),
              chunk(choice({"content": "b"}), usage={"prompt_tokens": 5, "completion_tokens": 2, "total_tokens": 7}),
              chunk(choice(finish="stop"), usage={"prompt_tokens": 5, "completion_tokens": 3, "total_tokens": 8})]
    result = assert_same_as_sdk(chunks)
    assert result["usage"] == {"prompt_tokens": 5, "completion_tokens": 3, "total_tokens": 8}


def test_usage_survives_a_later_chunk_without_it():
    # The SDK sets `usage = chunk.usage` on every chunk, so a trailing chunk without usage
    # erases it there.
    chunks = [chunk(choice({"content": "a"}), usage=DEEPSEEK_USAGE), chunk(choice(finish="stop"))]
    assert assemble(chunks).result()["usage"] == DEEPSEEK_USAGE


def test_no_usage_sent():
    result = assemble([chunk(choice({"content": "a"}, finish="stop"))]).result()
    assert "usage" not in result and API.usage(result) is None


def test_groq_usage_under_x_groq():
    usage = {"prompt_tokens": 1, "completion_tokens": 1, "total_tokens": 2}
    chunks = [chunk(choice({"content": "a"}), x_groq={"id": "req_1"}),
              chunk(choice(finish="stop"), x_groq={"id": "req_1", "usage": usage})]
    assert assemble(chunks).result()["usage"] == usage


# -- several choices, legacy function_call, logprobs, finish_reason ----------------------

def test_n_greater_than_one_interleaved():
    chunks = [
        chunk(choice({"role": "assistant", "content": ""}, index=0), choice({"role": "assistant", "content": ""}, index=1)),
        chunk(choice({"content": "B1 "}, index=1)),
        chunk(choice({"content": "A1 "}, index=0)),
        chunk(calls(call(0, "b_call", "g", "{"), index=1)),
        chunk(calls(call(0, "a_call", "f", "{}"), index=0)),
        chunk(calls(call(0, args="}"), index=1), choice(finish="tool_calls", index=0)),
        chunk(choice(finish="tool_calls", index=1)),
    ]
    result = assert_same_as_sdk(chunks)
    a, b = result["choices"]
    assert (a["index"], a["message"]["content"], a["message"]["tool_calls"][0]["id"]) == (0, "A1 ", "a_call")
    assert (b["index"], b["message"]["content"], b["message"]["tool_calls"][0]["id"]) == (1, "B1 ", "b_call")
    found = API.tool_calls(result)
    assert [(c.index, c.choice, c.id) for c in found] == [(0, 0, "a_call"), (1, 1, "b_call")]


def test_choices_sorted_by_index_even_if_seen_out_of_order():
    result = assemble([chunk(choice({"content": "second"}, index=1)), chunk(choice({"content": "first"}, index=0))]).result()
    assert [(c["index"], c["message"]["content"]) for c in result["choices"]] == [(0, "first"), (1, "second")]


def test_legacy_function_call():
    chunks = [
        chunk(choice({"role": "assistant", "content": None, "function_call": {"name": "get_weather", "arguments": ""}})),
        chunk(choice({"function_call": {"arguments": '{"city"'}})),
        chunk(choice({"function_call": {"arguments": ':"Oslo"}'}})),
        chunk(choice(finish="function_call")),
    ]
    result = assert_same_as_sdk(chunks)
    msg = result["choices"][0]["message"]
    assert msg["function_call"] == {"name": "get_weather", "arguments": '{"city":"Oslo"}'}
    assert "tool_calls" not in msg
    found = API.tool_calls(result)
    assert len(found) == 1
    assert (found[0].id, found[0].name, found[0].arguments) == (None, "get_weather", {"city": "Oslo"})


def test_legacy_function_call_name_repeated_is_not_concatenated():
    # The SDK would give "ff" here.
    chunks = [chunk(choice({"function_call": {"name": "f", "arguments": "{"}})),
              chunk(choice({"function_call": {"name": "f", "arguments": "}"}}))]
    assert message(assemble(chunks))["function_call"] == {"name": "f", "arguments": "{}"}


def test_logprobs_concatenated():
    def tok(t):
        return {"token": t, "logprob": -0.1, "bytes": list(t.encode()), "top_logprobs": []}
    chunks = [
        chunk({"index": 0, "delta": {"role": "assistant", "content": "Hel"}, "finish_reason": None,
               "logprobs": {"content": [tok("Hel")], "refusal": None}}),
        chunk({"index": 0, "delta": {"content": "lo"}, "finish_reason": None,
               "logprobs": {"content": [tok("lo")], "refusal": None}}),
        chunk({"index": 0, "delta": {}, "finish_reason": "stop", "logprobs": None}),
    ]
    result = assert_same_as_sdk(chunks)
    assert result["choices"][0]["logprobs"] == {"content": [tok("Hel"), tok("lo")], "refusal": None}


def test_refusal_logprobs_concatenated():
    def tok(t):
        return {"token": t, "logprob": -1.0, "bytes": None, "top_logprobs": []}
    chunks = [chunk({"index": 0, "delta": {"refusal": t}, "finish_reason": None,
                     "logprobs": {"content": None, "refusal": [tok(t)]}}) for t in ("No", "pe")]
    result = assert_same_as_sdk(chunks)
    assert result["choices"][0]["logprobs"] == {"content": None, "refusal": [tok("No"), tok("pe")]}


def test_finish_reason_not_reset_by_later_null():
    chunks = [chunk(choice({"content": "a"})), chunk(choice(finish="length")), chunk(choice({}, finish=None))]
    assert assert_same_as_sdk(chunks)["choices"][0]["finish_reason"] == "length"


def test_partial_stream_has_no_finish_reason():
    result = assemble([chunk(choice({"content": "a"}))], done=False).result()
    assert result["choices"][0]["finish_reason"] is None


# -- chunk-level fields ------------------------------------------------------------------

def test_chunk_level_fields_kept_and_stream_fields_dropped():
    chunks = [
        chunk(choice({"role": "assistant", "content": "x"}), system_fingerprint="fp_1",
              service_tier="default", obfuscation="abc"),
        chunk(choice(finish="stop"), system_fingerprint="fp_1", service_tier="default", obfuscation="de"),
    ]
    result = assemble(chunks).result()
    assert result["object"] == "chat.completion"
    assert (result["system_fingerprint"], result["service_tier"]) == ("fp_1", "default")
    assert "obfuscation" not in result
    assert list(result)[:4] == ["id", "object", "created", "model"]
    assert norm(result) == norm(sdk(chunks))


def test_azure_prompt_filter_chunk_does_not_blank_the_identity():
    filt = [{"prompt_index": 0, "content_filter_results": {}}]
    chunks = [
        {"id": "", "object": "", "created": 0, "model": "", "choices": [], "prompt_filter_results": filt},
        chunk(choice({"role": "assistant", "content": "hi"}), id="chatcmpl-az", model="gpt-4o"),
        chunk(choice(finish="stop"), id="chatcmpl-az", model="gpt-4o"),
        # Azure's asynchronous filter sends late chunks with blank identity fields.
        {"id": "", "object": "", "created": 0, "model": "",
         "choices": [{"index": 0, "delta": {}, "finish_reason": None,
                      "content_filter_results": {"hate": {"filtered": False}}}]},
    ]
    result = assemble(chunks).result()
    assert (result["id"], result["model"], result["created"]) == ("chatcmpl-az", "gpt-4o", 1700000000)
    assert result["prompt_filter_results"] == filt
    assert result["choices"][0]["content_filter_results"] == {"hate": {"filtered": False}}


# -- errors, junk, [DONE] ------------------------------------------------------------------

def test_mid_stream_error_keeps_partial_content():
    err = {"message": "Upstream overloaded", "type": "server_error", "code": 502}
    asm = ChatAssembler()
    asm.feed(Event(data=json.dumps(chunk(choice({"role": "assistant", "content": "Partial "})))))
    asm.feed(Event(data=json.dumps(chunk(choice({"content": "answer"})))))
    asm.feed(Event(data=json.dumps({"error": err})))
    assert asm.error == err
    assert message(asm)["content"] == "Partial answer"


def test_openrouter_error_chunk_with_choices():
    err = {"code": "server_error", "message": "Provider disconnected"}
    chunks = [chunk(choice({"content": "abc"})), chunk(choice(finish="error"), error=err)]
    asm = assemble(chunks)
    assert asm.error == err
    assert asm.result()["choices"][0]["finish_reason"] == "error"
    assert "error" not in asm.result()


def test_error_event_type():
    asm = ChatAssembler()
    asm.feed(Event(data=json.dumps(chunk(choice({"content": "x"})))))
    asm.feed(Event(data='{"message": "rate limited"}', event="error"))
    assert asm.error == {"message": "rate limited"}
    assert message(asm)["content"] == "x"


def test_the_latest_error_stands_when_an_envelope_repeats():
    """A chunk that repeats the last one's envelope is not merged again, except after an
    error event came between them: then its own error field is the latest error again."""
    first, second = {"message": "first"}, {"message": "second"}
    asm = assemble([chunk(choice({"content": "a"}), error=first)], done=False)
    asm.feed(Event(data='{"message": "an error event"}', event="error"))
    assert asm.error == {"message": "an error event"}
    asm.feed(Event(data=json.dumps(chunk(choice({"content": "b"}), error=first))))
    assert asm.error == first
    asm.feed(Event(data=json.dumps(chunk(choice({"content": "c"}), error=second, usage={"total_tokens": 3}))))
    asm.feed(Event(data=json.dumps(chunk(choice({"content": "d"}), error=second, usage={"total_tokens": 3}))))
    assert asm.error == second and asm.result()["usage"] == {"total_tokens": 3}
    assert message(asm)["content"] == "abcd" and asm.chunks == 5  # the error event too


def test_non_json_data_is_recorded_not_raised():
    asm = ChatAssembler()
    asm.feed(Event(data=json.dumps(chunk(choice({"content": "a"})))))
    for junk in ("not json", "{truncated", "42", '"str"', ""):
        asm.feed(Event(data=junk))
    asm.feed(Event(data=json.dumps(chunk(choice({"content": "b"}, finish="stop")))))
    assert asm.unparsed == ["not json", "{truncated", "42", '"str"', ""]
    assert message(asm)["content"] == "ab"
    assert asm.error is None


def test_done_ends_the_stream():
    asm = ChatAssembler()
    asm.feed(Event(data=json.dumps(chunk(choice({"content": "a"}, finish="stop")))))
    assert not asm.done
    asm.feed(Event(data="[DONE]"))
    asm.feed(Event(data=json.dumps(chunk(choice({"content": "late"})))))
    assert asm.done and message(asm)["content"] == "a"


def test_done_without_final_blank_line_through_the_decoder():
    # llama.cpp ends with `data: [DONE]` and no blank line.
    raw = b"data: " + json.dumps(chunk(choice({"content": "hi"}, finish="stop"))).encode() + b"\n\ndata: [DONE]"
    asm = assemble_bytes([raw])
    assert asm.done and message(asm)["content"] == "hi"


def test_result_is_repeatable_and_grows():
    asm = ChatAssembler()
    asm.feed(Event(data=json.dumps(chunk(calls(call(0, "c", "f", "{"), content="a")))))
    first = asm.result()
    assert asm.result() == first
    assert first["choices"][0]["message"]["tool_calls"][0]["function"]["arguments"] == "{"
    asm.feed(Event(data=json.dumps(chunk(calls(call(0, args="}"), content="b")))))
    second = asm.result()
    assert second["choices"][0]["message"]["content"] == "ab"
    assert second["choices"][0]["message"]["tool_calls"][0]["function"]["arguments"] == "{}"
    # The earlier snapshot was not changed behind the caller's back.
    assert first["choices"][0]["message"]["content"] == "a"


def test_empty_stream():
    asm = ChatAssembler()
    asm.feed(Event(data="[DONE]"))
    result = asm.result()
    assert result["object"] == "chat.completion" and result["choices"] == []


# -- property: random well-formed streams agree with the SDK ------------------------------

_step = st.one_of(
    st.tuples(st.just("text"), st.integers(0, 1), st.text(max_size=5)),
    st.tuples(st.just("call"), st.integers(0, 1), st.integers(0, 2), st.text(max_size=5)),
)


@settings(max_examples=60, deadline=None)
@given(steps=st.lists(_step, max_size=25))
def test_random_streams_agree_with_the_sdk(steps):
    chunks = [chunk(choice({"role": "assistant", "content": ""}, index=0),
                    choice({"role": "assistant", "content": ""}, index=1))]
    started: set[tuple[int, int]] = set()
    for step in steps:
        if step[0] == "text":
            _, ch, text = step
            chunks.append(chunk(choice({"content": text}, index=ch)))
        else:
            _, ch, idx, args = step
            # Well-formed for the SDK: indexes appear in order, id and name only first.
            idx = min(idx, len([k for k in started if k[0] == ch]))
            if (ch, idx) in started:
                entry = call(idx, args=args)
            else:
                started.add((ch, idx))
                entry = call(idx, f"call_{ch}_{idx}", f"tool_{idx}", args, type="function")
            chunks.append(chunk(calls(entry, index=ch)))
    assert_same_as_sdk(chunks)


# -- OpenAIChat --------------------------------------------------------------------------

def test_tool_calls_from_a_non_streamed_response():
    response = {
        "id": "x", "object": "chat.completion", "model": "gpt-4o",
        "choices": [
            {"index": 0, "message": {"role": "assistant", "content": None, "tool_calls": [
                {"id": "a", "type": "function", "function": {"name": "f", "arguments": '{"x": 1}'}},
                {"id": "b", "type": "function", "function": {"name": "g", "arguments": ""}},
            ]}, "finish_reason": "tool_calls"},
            {"index": 1, "message": {"role": "assistant", "content": "no calls"}, "finish_reason": "stop"},
            {"index": 2, "message": {"role": "assistant", "content": None, "tool_calls": [
                {"id": "c", "type": "function", "function": {"name": "h", "arguments": '{"broken'}},
            ]}, "finish_reason": "tool_calls"},
        ],
    }
    found = API.tool_calls(response)
    assert [(c.index, c.choice, c.id, c.name) for c in found] == [
        (0, 0, "a", "f"), (1, 0, "b", "g"), (2, 2, "c", "h")]
    assert found[0].arguments == {"x": 1} and found[0].arguments_raw == '{"x": 1}'
    assert found[1].arguments == {} and found[1].arguments_error is None
    assert found[2].arguments is None and "invalid JSON" in found[2].arguments_error


def test_tool_calls_of_a_response_without_any():
    assert API.tool_calls({"choices": [{"index": 0, "message": {"role": "assistant", "content": "hi"}}]}) == []
    assert API.tool_calls({}) == []


def test_model_usage_and_registration():
    assert API.model({"model": "req"}, {"model": "resp"}) == "resp"
    assert API.model({"model": "req"}, None) == "req"
    assert API.usage({"usage": {"total_tokens": 3}}) == {"total_tokens": 3}
    assert detect("POST", "/v1/chat/completions") is API and by_name("openai.chat") is API
    assert not API.matches("GET", "/v1/chat/completions") and not API.matches("POST", "/v1/responses")
    assert isinstance(API.new_assembler(), ChatAssembler)


def test_an_envelope_that_changes_and_changes_back_ends_at_its_last_value():
    """Chunks whose envelope repeats the last one's are not merged again: one that differs
    from the last, even one seen before, still is."""
    fps = ["fp_1", "fp_1", "fp_2", None, "fp_1", "fp_1"]
    chunks = [chunk(choice({"role": "assistant", "content": str(i)} if i == 0 else {"content": str(i)}),
                    system_fingerprint=fp) for i, fp in enumerate(fps)]
    result = assemble(chunks).result()
    assert result["system_fingerprint"] == "fp_1" and result["choices"][0]["message"]["content"] == "012345"
    assert assemble(chunks[:4]).result()["system_fingerprint"] == "fp_2"  # a null does not undo a value
    assert norm(result) == norm(sdk(chunks))


# -- a whole data-only stream, its data not decoded first (the writer's way) ------------

_payloads = st.one_of(
    st.builds(lambda text, finish: json.dumps(chunk(choice({"content": text}, finish=finish)), ensure_ascii=False),
              st.text(max_size=8), st.sampled_from([None, "stop"])).map(str.encode),
    st.builds(lambda i, args: json.dumps(chunk(calls(call(i, args=args)))), st.integers(0, 2), st.text(max_size=5))
    .map(str.encode),
    st.just(json.dumps(chunk(choice(), error={"message": "overloaded"})).encode()),
    st.just(json.dumps(chunk(usage={"total_tokens": 7})).encode()),
    st.sampled_from([b"[DONE]", b" [DONE] ", b"42", b'"text"', b"{broken", b"", b"{\"content\": \"\xff\"}",
                     b'{"choices":[{"delta":{"content":"\xe2\x80\xa8 \xf0\x9f\x8c\xa6"}}]}']),
)


# Texts that look like the bytes around them once encoded: quotes, backslashes, the
# end of a delta, another delta, escapes written either way.
_tricky = st.sampled_from(["", "a", '"', "\\", '\\"', '"}', '"},"logprobs":null', '","content":"x',
                           "\u2028", "\U0001f326", "\x01", "é", '{"arguments":"'])
_text = st.one_of(st.text(max_size=6), _tricky, st.lists(_tricky, max_size=3).map("".join))
_dumps = st.sampled_from([
    lambda obj: json.dumps(obj, ensure_ascii=False, separators=(",", ":")),  # OpenAI's bytes
    lambda obj: json.dumps(obj),  # spaces, \u escapes
])


def _padded(obj: dict, pad: str | None) -> dict:
    return obj if pad is None else {**obj, "obfuscation": pad}


_padding = st.one_of(st.none(), st.text(max_size=4), _tricky)
_chunk_shapes = st.one_of(
    st.builds(lambda key, text: chunk(choice({key: text})), st.sampled_from(["content", "reasoning_content"]), _text),
    st.builds(lambda i, args: chunk(calls(call(i, args=args))), st.sampled_from([0, 1, 0.0, True]), _text),
    st.builds(lambda i, id: chunk(calls(call(i, id, "tool", ""))), st.integers(0, 1), st.sampled_from(["c1", "c2"])),
    st.builds(lambda fp: chunk(choice({"content": "."}), system_fingerprint=fp), st.sampled_from(["fp_1", "fp_2"])),
    st.just(chunk(choice({"role": "assistant", "content": ""}))),
    st.just(chunk(choice({}, finish="stop"))),
)
_openai_payloads = st.builds(lambda obj, pad, dumps: dumps(_padded(obj, pad)).encode(), _chunk_shapes, _padding, _dumps)


def _same_either_way(payloads: list[bytes]) -> ChatAssembler:
    stream = b"".join(b"data: " + p + b"\n\n" for p in payloads)
    assert data_only(stream) is not None  # the way under test is taken
    whole, decoded = StreamAssembly(API, None), StreamAssembly(API, None)
    whole.feed_stream(stream)
    decoded.feed(stream)
    a, b = whole._assembler, decoded._assembler
    assert a.result() == b.result()
    assert (a.error, a.unparsed, a.done, a.chunks) == (b.error, b.unparsed, b.done, b.chunks)
    return a


@settings(max_examples=300, deadline=None)
@given(payloads=st.lists(_payloads, max_size=25))
def test_a_data_only_stream_assembles_the_same_either_way(payloads):
    _same_either_way(payloads)


@settings(max_examples=300, deadline=None)
@given(payloads=st.lists(_openai_payloads, max_size=30), repeats=st.lists(st.integers(1, 4), max_size=30))
def test_chunks_read_by_their_shape_assemble_as_chunks_parsed_whole(payloads, repeats):
    """Runs of chunks of one shape (the fast way) with every kind of text in them,
    OpenAI's padding or not, compact or spaced, and shapes that change under them."""
    _same_either_way([p for p, n in zip(payloads, repeats + [1] * len(payloads)) for _ in range(n)])


@pytest.mark.parametrize("turn", TURNS)
def test_a_stream_cut_short_assembles_the_same_the_writers_way(turn):
    """A stream cut anywhere near its end (a stop, a dropped upstream) is read the fast
    way, its last event as far as it came, and gives what the decoder gives."""
    data = sse_bytes(turn)
    for cut in range(1, 60, 3):
        stream = data[:-cut]
        assert data_only(stream) is not None or not stream.rstrip(b"\n").rpartition(b"\n")[2].startswith(b"data: ")
        whole = StreamAssembly(API, None)
        whole.feed_stream(stream)
        for event in whole._sse.close():  # what finish() does: nothing, if the decoder was not used
            whole._assembler.feed(event)
        a, b = whole._assembler, assemble_bytes([stream])
        assert (a.result(), a.unparsed, a.done, a.chunks) == (b.result(), b.unparsed, b.done, b.chunks), cut


def test_fragments_whose_index_is_not_an_int_go_to_the_last_call_either_way():
    start = [chunk(calls(call(0, "c0", "a", ""))), chunk(calls(call(1, "c1", "b", "")))]
    fragments = [chunk(calls(call(0.0, args=piece))) for piece in ("x", "y", "z")]
    asm = _same_either_way([json.dumps(c).encode() for c in start + fragments])
    assert [c["function"]["arguments"] for c in asm.result()["choices"][0]["message"]["tool_calls"]] == ["", "xyz"]


def test_a_run_of_text_chunks_is_parsed_whole_once(monkeypatch):
    merged = []
    merge = ChatAssembler._chunk
    monkeypatch.setattr(ChatAssembler, "_chunk", lambda self, c, e: (merged.append(c), merge(self, c, e)))
    texts = [f"piece {i} \"quoted\" \\ " for i in range(50)]
    payloads = [json.dumps(_padded(chunk(choice({"content": t})), "x" * (i % 7)), separators=(",", ":")).encode()
                for i, t in enumerate(texts)]
    asm = _same_either_way([*payloads, b"[DONE]"])
    assert asm.result()["choices"][0]["message"]["content"] == "".join(texts) and asm.chunks == 50
    assert len(merged) == 1 + 50  # the first chunk only; the decoded way compared against merges all 50
