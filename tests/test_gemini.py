"""Gemini `:streamGenerateContent?alt=sse` assembly: every event is a whole
GenerateContentResponse chunk; parts are appended per candidate and text re-merged."""

from __future__ import annotations

import copy
import json

from hypothesis import given, settings
from hypothesis import strategies as st

from proxy.apis import by_name, detect
from proxy.apis.gemini import API
from proxy.sse import Event
from tests.streams import assemble_cut

MODEL = "gemini-2.5-flash"
SAFETY = [{"category": "HARM_CATEGORY_HARASSMENT", "probability": "NEGLIGIBLE"}]
SAFETY_LATE = [{"category": "HARM_CATEGORY_HARASSMENT", "probability": "LOW"}]
CITATIONS = {"citationSources": [{"startIndex": 0, "endIndex": 8, "uri": "https://weather.example"}]}


def usage(out, thoughts=12):
    return {"promptTokenCount": 40, "candidatesTokenCount": out, "thoughtsTokenCount": thoughts,
            "totalTokenCount": 40 + out + thoughts}


def chunk(parts, i=0, **extra):
    """One stream event as Gemini sends it: candidates, usage so far, model, response id."""
    candidate_extra = {k: extra.pop(k) for k in ("finishReason", "safetyRatings", "citationMetadata") if k in extra}
    body = {
        "candidates": [{"content": {"parts": parts, "role": "model"}, "index": 0, **candidate_extra}],
        "usageMetadata": usage(i),
        "modelVersion": MODEL,
        "responseId": "mKdNaPqrEoWxnvgP1ouCsAk",
    }
    body.update(extra)
    return body


CALL_1 = {"name": "get_weather", "args": {"city": "Zürich", "unit": "celsius"}, "id": "call-1"}
CALL_2 = {"name": "get_time", "args": {}}

STREAM = [
    chunk([{"text": "**Planning**\n", "thought": True}], 1),
    chunk([{"text": "I need the weather.", "thought": True}], 2, safetyRatings=SAFETY),
    # The first answer part after the thoughts carries the signature: a new part.
    chunk([{"text": "Let me ", "thoughtSignature": "c2lnLTE="}], 3),
    chunk([{"text": "check Zü"}, {"text": "rich\u2028now."}], 4, citationMetadata=CITATIONS),
    chunk([{"functionCall": CALL_1, "thoughtSignature": "c2lnLTI="}], 5),
    chunk([{"functionCall": CALL_2}, {"text": "Done"}], 6, safetyRatings=SAFETY_LATE),
    chunk([{"text": "."}], 7),
    # Gemini often ends with the signature alone on an empty text part: kept apart.
    chunk([{"text": "", "thoughtSignature": "c2lnLTM="}], 8, finishReason="STOP"),
]

EXPECTED = {
    "candidates": [
        {
            "content": {
                "parts": [
                    {"text": "**Planning**\nI need the weather.", "thought": True},
                    {"text": "Let me check Zürich\u2028now.", "thoughtSignature": "c2lnLTE="},
                    {"functionCall": CALL_1, "thoughtSignature": "c2lnLTI="},
                    {"functionCall": CALL_2},
                    {"text": "Done."},
                    {"text": "", "thoughtSignature": "c2lnLTM="},
                ],
                "role": "model",
            },
            "safetyRatings": SAFETY_LATE,
            "citationMetadata": CITATIONS,
            "finishReason": "STOP",
            "index": 0,
        }
    ],
    "usageMetadata": usage(8),
    "modelVersion": MODEL,
    "responseId": "mKdNaPqrEoWxnvgP1ouCsAk",
}


def encode(chunks, eol="\r\n"):
    # Gemini's SSE uses CRLF line endings and only `data:` lines.
    return "".join(f"data: {json.dumps(c, ensure_ascii=False)}{eol}{eol}" for c in chunks).encode()


def assemble(raw: bytes, cuts=()):
    return assemble_cut(API, raw, cuts)


def test_stream_gives_the_non_streaming_response():
    asm = assemble(encode(STREAM))
    assert asm.result() == EXPECTED
    assert asm.error is None


def test_tool_calls():
    calls = API.tool_calls(assemble(encode(STREAM)).result())
    assert [(c.index, c.id, c.name, c.arguments, c.choice) for c in calls] == [
        (0, "call-1", "get_weather", {"city": "Zürich", "unit": "celsius"}, 0),
        (1, None, "get_time", {}, 0),
    ]
    assert json.loads(calls[0].arguments_raw) == CALL_1["args"]


def test_thought_flag_change_starts_a_new_part():
    chunks = [
        chunk([{"text": "a", "thought": True}]),
        chunk([{"text": "b"}]),
        chunk([{"text": "c", "thought": True}]),
        chunk([{"text": "d", "thought": True}, {"text": "e", "thought": False}, {"text": "f"}]),
    ]
    parts = assemble(encode(chunks)).result()["candidates"][0]["content"]["parts"]
    assert parts == [
        {"text": "a", "thought": True},
        {"text": "b"},
        {"text": "cd", "thought": True},
        {"text": "ef", "thought": False},
    ]


def test_non_text_parts_are_not_merged():
    blob = {"inlineData": {"mimeType": "image/png", "data": "iVBORw0KGgo="}}
    code = {"executableCode": {"language": "PYTHON", "code": "print(1)"}}
    chunks = [chunk([{"text": "x"}, blob]), chunk([{"text": "y"}, code, {"text": "z"}])]
    parts = assemble(encode(chunks)).result()["candidates"][0]["content"]["parts"]
    assert parts == [{"text": "x"}, blob, {"text": "y"}, code, {"text": "z"}]


def test_candidates_interleave_by_index():
    def two(i, text, **extra):
        return {"candidates": [{"content": {"parts": [{"text": text}], "role": "model"}, "index": i, **extra}]}

    chunks = [two(0, "A1"), two(1, "B1"), two(1, "B2", finishReason="STOP"), two(0, "A2", finishReason="MAX_TOKENS")]
    result = assemble(encode(chunks)).result()
    assert result["candidates"] == [
        {"content": {"parts": [{"text": "A1A2"}], "role": "model"}, "finishReason": "MAX_TOKENS", "index": 0},
        {"content": {"parts": [{"text": "B1B2"}], "role": "model"}, "finishReason": "STOP", "index": 1},
    ]
    both = {"candidates": [
        {"content": {"parts": [{"functionCall": {"name": "f", "args": {"a": 1}}}]}, "index": 0},
        {"content": {"parts": [{"functionCall": {"name": "g", "args": {}}}]}, "index": 1},
    ]}
    assert [(c.index, c.name, c.choice) for c in API.tool_calls(both)] == [(0, "f", 0), (1, "g", 1)]


def test_candidates_without_index_use_their_position():
    chunks = [{"candidates": [{"content": {"parts": [{"text": "he"}]}}]},
              {"candidates": [{"content": {"parts": [{"text": "llo"}]}, "finishReason": "STOP"}]}]
    assert assemble(encode(chunks)).result() == {
        "candidates": [{"content": {"parts": [{"text": "hello"}]}, "finishReason": "STOP"}]
    }


def test_non_streaming_response_is_returned_whole():
    whole = copy.deepcopy(EXPECTED)
    asm = API.new_assembler()
    asm.feed(Event(data=json.dumps(whole)))
    assert asm.result() == EXPECTED


def test_json_array_stream_without_alt_sse():
    asm = API.new_assembler()
    asm.feed(Event(data=json.dumps(STREAM)))
    assert asm.result() == EXPECTED


def test_error_chunk():
    error = {"code": 503, "message": "The model is overloaded. Please try again later.", "status": "UNAVAILABLE"}
    asm = assemble(encode(STREAM[:4] + [{"error": error}]))
    assert asm.error == error
    result = asm.result()
    assert "error" not in result
    assert result["candidates"][0]["content"]["parts"][1] == {"text": "Let me check Zürich\u2028now.", "thoughtSignature": "c2lnLTE="}


def test_prompt_blocked_has_no_candidates():
    blocked = {"promptFeedback": {"blockReason": "SAFETY"}, "usageMetadata": {"promptTokenCount": 9}, "modelVersion": MODEL}
    result = assemble(encode([blocked])).result()
    assert result == blocked
    assert API.tool_calls(result) == []


def test_garbage_events_are_ignored():
    asm = API.new_assembler()
    asm.feed(Event(data="not json"))
    asm.feed(Event(data="42"))
    for c in STREAM:
        asm.feed(Event(data=json.dumps(c)))
    assert asm.result() == EXPECTED


def test_result_is_repeatable_and_detached():
    asm = assemble(encode(STREAM))
    first = asm.result()
    first["candidates"][0]["content"]["parts"][1]["text"] = "changed"
    first["candidates"][0]["content"]["parts"][5]["thoughtSignature"] = "changed"
    first["candidates"].clear()
    assert asm.result() == EXPECTED


def test_lf_line_endings():
    assert assemble(encode(STREAM, eol="\n")).result() == EXPECTED


RAW = encode(STREAM)


@settings(max_examples=150, deadline=None)
@given(st.lists(st.integers(0, len(RAW)), max_size=40))
def test_any_chunking_gives_the_same_response(cuts):
    assert assemble(RAW, cuts).result() == EXPECTED


@settings(max_examples=150, deadline=None)
@given(st.data())
def test_any_cut_gives_a_partial_response(data):
    end = data.draw(st.integers(0, len(RAW)))
    asm = assemble(RAW[:end], data.draw(st.lists(st.integers(0, end), max_size=5)))
    result = asm.result()
    calls = API.tool_calls(result)
    assert asm.error is None
    want = EXPECTED["candidates"][0]["content"]["parts"]
    got = result["candidates"][0]["content"]["parts"] if result else []
    assert len(got) <= len(want)
    for g, w in zip(got, want):
        assert g.keys() == w.keys()
        if "text" in w:
            assert w["text"].startswith(g["text"])
        else:
            assert g == w
    assert [c.name for c in calls] == ["get_weather", "get_time"][: len(calls)]


def test_matches_keys_and_registry():
    assert API.matches("POST", "/v1beta/models/gemini-2.5-flash:streamGenerateContent")
    assert API.matches("POST", "/v1beta/models/gemini-2.5-flash:generateContent")
    assert API.matches("POST", "/v1/projects/p/locations/us-central1/publishers/google/models/gemini-2.5-pro:generateContent")
    assert not API.matches("GET", "/v1beta/models/gemini-2.5-flash:generateContent")
    assert not API.matches("POST", "/v1beta/models/gemini-2.5-flash:countTokens")
    assert not API.matches("POST", "/v1beta/models/text-embedding-004:embedContent")
    assert detect("POST", "/v1beta/models/x:streamGenerateContent") is API and by_name("gemini") is API
    assert (API.keys.messages, API.keys.system, API.keys.tools) == ("contents", "systemInstruction", "tools")


def test_usage_and_model():
    assert API.usage(EXPECTED) == usage(8)
    assert API.model({}, EXPECTED) == MODEL
    assert API.model({}, None) is None
