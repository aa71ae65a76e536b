"""translate.py: request bodies between OpenAI chat, Anthropic Messages and Gemini, and
what each move loses."""

from __future__ import annotations

import copy
import json

import pytest

from proxy.replay.translate import DEFAULT_MAX_TOKENS, TranslationError, translate
from tests.conftest import CLINE

PNG = "iVBORw0KGgo="
WEATHER = {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}
TOOL = {"type": "function", "function": {"name": "get_weather", "description": "Weather for a city.",
                                         "parameters": WEATHER}}
OPENAI = {
    "model": "gpt-test", "stream": True, "stream_options": {"include_usage": True}, "temperature": 0.5,
    "max_tokens": 200, "stop": ["END"], "tool_choice": "auto", "parallel_tool_calls": False, "tools": [TOOL],
    "messages": [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": [{"type": "text", "text": "Weather here?"},
                                     {"type": "image_url", "image_url": {"url": f"data:image/png;base64,{PNG}"}}]},
        {"role": "assistant", "content": "Checking.", "tool_calls": [
            {"id": "call_1", "type": "function", "function": {"name": "get_weather", "arguments": '{"city":"Paris"}'}},
            {"id": "call_2", "type": "function", "function": {"name": "get_weather", "arguments": '{"city":"Rome"}'}}]},
        {"role": "tool", "tool_call_id": "call_1", "content": "12C"},
        {"role": "tool", "tool_call_id": "call_2", "content": "20C"},
        {"role": "user", "content": "And tomorrow?"},
    ],
}


def test_openai_to_anthropic():
    t = translate(OPENAI, "openai.chat", "anthropic", model="claude-test", stream=True)
    assert t.body == {
        "model": "claude-test", "max_tokens": 200, "system": "Be brief.",
        "messages": [
            {"role": "user", "content": [
                {"type": "text", "text": "Weather here?"},
                {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": PNG}}]},
            {"role": "assistant", "content": [
                {"type": "text", "text": "Checking."},
                {"type": "tool_use", "id": "call_1", "name": "get_weather", "input": {"city": "Paris"}},
                {"type": "tool_use", "id": "call_2", "name": "get_weather", "input": {"city": "Rome"}}]},
            {"role": "user", "content": [  # both results open one user turn, the text follows
                {"type": "tool_result", "tool_use_id": "call_1", "content": [{"type": "text", "text": "12C"}]},
                {"type": "tool_result", "tool_use_id": "call_2", "content": [{"type": "text", "text": "20C"}]},
                {"type": "text", "text": "And tomorrow?"}]},
        ],
        "tools": [{"name": "get_weather", "description": "Weather for a city.", "input_schema": WEATHER}],
        "tool_choice": {"type": "auto", "disable_parallel_tool_use": True},
        "temperature": 0.5, "stop_sequences": ["END"], "stream": True,
    }
    assert t.lost == [] and t.renamed == {}


def test_openai_to_gemini():
    t = translate(OPENAI, "openai", "gemini", model="ignored: Gemini names it in the URL")
    assert t.body == {
        "contents": [
            {"role": "user", "parts": [{"text": "Weather here?"}, {"inlineData": {"mimeType": "image/png", "data": PNG}}]},
            {"role": "model", "parts": [{"text": "Checking."},
                                        {"functionCall": {"name": "get_weather", "args": {"city": "Paris"}}},
                                        {"functionCall": {"name": "get_weather", "args": {"city": "Rome"}}}]},
            {"role": "user", "parts": [{"functionResponse": {"name": "get_weather", "response": {"output": "12C"}}},
                                       {"functionResponse": {"name": "get_weather", "response": {"output": "20C"}}},
                                       {"text": "And tomorrow?"}]},
        ],
        "systemInstruction": {"parts": [{"text": "Be brief."}]},
        "tools": [{"functionDeclarations": [{"name": "get_weather", "description": "Weather for a city.",
                                              "parameters": {"type": "OBJECT", "properties": {"city": {"type": "STRING"}},
                                                             "required": ["city"]}}]}],
        "toolConfig": {"functionCallingConfig": {"mode": "AUTO"}},
        "generationConfig": {"maxOutputTokens": 200, "temperature": 0.5, "stopSequences": ["END"]},
    }
    assert t.lost == ["parallel_tool_calls = false (one tool call at a time) has no Gemini counterpart; dropped"]


def without(body: dict, *keys: str) -> dict:
    return {k: v for k, v in body.items() if k not in keys}


@pytest.mark.parametrize("via", ["anthropic", "gemini"])
def test_openai_there_and_back(via):
    there = translate(OPENAI, "openai", via, model="x", stream=True)
    back = translate(there.body, via, "openai", model="gpt-test", stream=True)
    expected = without(OPENAI, "stream_options")  # stream mechanics of OpenAI only
    if via == "gemini":  # Gemini pairs calls and results by name and order, without ids
        expected = copy.deepcopy(expected)
        expected["parallel_tool_calls"] = True
        for m in expected["messages"]:
            for c in m.get("tool_calls") or []:
                c["id"] = {"call_1": "call_1_1", "call_2": "call_1_2"}[c["id"]]
            if m["role"] == "tool":
                m["tool_call_id"] = {"call_1": "call_1_1", "call_2": "call_1_2"}[m["tool_call_id"]]
        back.body["parallel_tool_calls"] = True  # Gemini has no such switch: tested in the loss report
    assert back.body == expected
    assert back.lost == []


ANTHROPIC = {
    "model": "claude-test", "max_tokens": 300, "temperature": 0.2, "top_k": 5,
    "system": [{"type": "text", "text": "Be brief."}, {"type": "text", "text": "Use tools."}],
    "tools": [{"name": "get_weather", "description": "Weather for a city.", "input_schema": WEATHER}],
    "tool_choice": {"type": "tool", "name": "get_weather"},
    "messages": [
        {"role": "user", "content": "Weather in Paris?"},
        {"role": "assistant", "content": [{"type": "tool_use", "id": "toolu_1", "name": "get_weather",
                                           "input": {"city": "Paris"}}]},
        {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "toolu_1", "is_error": True,
                                      "content": [{"type": "text", "text": "service down"}]}]},
    ],
}


def test_anthropic_to_openai():
    t = translate(ANTHROPIC, "anthropic.messages", "openai", model="gpt-test")
    assert t.body == {
        "model": "gpt-test",
        "messages": [
            {"role": "system", "content": "Be brief."}, {"role": "system", "content": "Use tools."},
            {"role": "user", "content": "Weather in Paris?"},
            {"role": "assistant", "content": None, "tool_calls": [
                {"id": "toolu_1", "type": "function", "function": {"name": "get_weather", "arguments": '{"city":"Paris"}'}}]},
            {"role": "tool", "tool_call_id": "toolu_1", "content": "service down"},
        ],
        "tools": [TOOL],
        "tool_choice": {"type": "function", "function": {"name": "get_weather"}},
        "max_tokens": 300, "temperature": 0.2,
    }
    assert t.lost == ["message 2 (user): a tool result's error flag (OpenAI has none; the text stays)",
                      "top_k = 5 has no OpenAI counterpart; dropped"]


def test_anthropic_to_gemini_and_back():
    t = translate(ANTHROPIC, "anthropic", "gemini", stream=True)
    assert t.body["contents"][2] == {"role": "user", "parts": [
        {"functionResponse": {"name": "get_weather", "response": {"error": "service down"}}}]}
    assert t.body["toolConfig"] == {"functionCallingConfig": {"mode": "ANY", "allowedFunctionNames": ["get_weather"]}}
    assert t.body["generationConfig"] == {"maxOutputTokens": 300, "temperature": 0.2, "topK": 5}
    assert "stream" not in t.body  # Gemini streams by its URL
    back = translate(t.body, "gemini", "anthropic", model="claude-test")
    expected = copy.deepcopy(ANTHROPIC)
    expected["messages"][0]["content"] = [{"type": "text", "text": "Weather in Paris?"}]
    expected["messages"][1]["content"][0]["id"] = expected["messages"][2]["content"][0]["tool_use_id"] = "call_1_0"
    assert back.body == {**expected, "messages": expected["messages"]}
    assert back.lost == []


GEMINI = {
    "systemInstruction": {"parts": [{"text": "Be brief."}]},
    "contents": [
        {"role": "user", "parts": [{"text": "Weather in Paris and Rome?"}]},
        {"role": "model", "parts": [
            {"text": "thinking...", "thought": True},
            {"functionCall": {"name": "get_weather", "args": {"city": "Paris"}}, "thoughtSignature": "c2ln"},
            {"functionCall": {"name": "get_weather", "args": {"city": "Rome"}}}]},
        {"role": "user", "parts": [
            {"functionResponse": {"name": "get_weather", "response": {"output": "12C"}}},
            {"functionResponse": {"name": "get_weather", "response": {"temp": 20}}}]},
    ],
    "tools": [{"functionDeclarations": [{"name": "get_weather", "parameters": {
        "type": "OBJECT", "properties": {"city": {"type": "STRING"}}, "required": ["city"]}}]}, {"googleSearch": {}}],
    "generationConfig": {"temperature": 1.5, "topP": 0.9, "seed": 7, "responseMimeType": "text/plain"},
    "safetySettings": [{"category": "HARM_CATEGORY_HARASSMENT", "threshold": "BLOCK_NONE"}],
}


def test_gemini_to_openai_pairs_results_by_order_and_says_what_it_lost():
    t = translate(GEMINI, "gemini", "openai", model="gpt-test", stream=True)
    messages = t.body["messages"]
    assert messages[2] == {"role": "assistant", "content": None, "tool_calls": [
        {"id": "call_1_0", "type": "function", "function": {"name": "get_weather", "arguments": '{"city":"Paris"}'}},
        {"id": "call_1_1", "type": "function", "function": {"name": "get_weather", "arguments": '{"city":"Rome"}'}}]}
    assert messages[3:] == [{"role": "tool", "tool_call_id": "call_1_0", "content": "12C"},
                            {"role": "tool", "tool_call_id": "call_1_1", "content": '{"temp": 20}'}]
    assert t.body["tools"] == [{"type": "function", "function": {"name": "get_weather", "parameters": WEATHER}}]
    assert (t.body["temperature"], t.body["top_p"], t.body["seed"], t.body["stream"]) == (1.5, 0.9, 7, True)
    lost = "\n".join(t.lost)
    for words in ("thoughtSignature", "contents[1] (model): a thought part", "googleSearch",
                  "generationConfig.responseMimeType", "`safetySettings`"):
        assert words in lost


def test_gemini_to_anthropic_clamps_temperature():
    t = translate(GEMINI, "gemini", "anthropic", model="claude-test")
    assert t.body["temperature"] == 1.0 and t.body["max_tokens"] == DEFAULT_MAX_TOKENS
    assert "temperature 1.5 is above Anthropic's maximum: sent 1.0" in t.lost
    assert "seed = 7 has no Anthropic counterpart; dropped" in t.lost
    assert [b["type"] for b in t.body["messages"][2]["content"]] == ["tool_result", "tool_result"]


def test_losses_are_reported_in_words():
    body = {
        "model": "m", "n": 2, "logprobs": True, "seed": 1,
        "tools": [{"type": "function", "function": {"name": "get.weather", "parameters": WEATHER}}],
        "tool_choice": {"type": "function", "function": {"name": "get.weather"}},
        "messages": [
            {"role": "user", "content": [{"type": "image_url", "image_url": {"url": "https://img.test/a.png"}},
                                         {"type": "input_audio", "input_audio": {"data": "x", "format": "wav"}}]},
            {"role": "assistant", "reasoning_content": "hmm", "content": None, "tool_calls": [
                {"id": "c1", "type": "function", "function": {"name": "get.weather", "arguments": "{not json"}}]},
            {"role": "tool", "tool_call_id": "c1", "content": "ok"},
            {"role": "system", "content": "Late instructions."},
        ],
    }
    to_gemini = translate(body, "openai", "gemini")
    lost = "\n".join(to_gemini.lost)
    assert "messages[0] (user): a `input_audio` part (only text and images carry over); dropped" in lost
    assert "the assistant's `reasoning_content`" in lost
    assert "a system message inside the conversation became user text" in lost
    assert "`n` = 2: only one answer is asked for" in lost and "`logprobs` (OpenAI setting)" in lost
    assert "an image given by URL (Gemini takes images inline); dropped" in lost
    assert "call 'get.weather': its arguments are not a JSON object ('{not json'); Gemini takes an object: sent {}" in lost
    assert to_gemini.renamed == {}  # Gemini accepts dots in names

    to_anthropic = translate(body, "openai", "anthropic", model="c")
    assert to_anthropic.renamed == {"get_weather": "get.weather"}  # sent name -> recorded name
    assert to_anthropic.body["tools"][0]["name"] == "get_weather"
    assert to_anthropic.body["tool_choice"] == {"type": "tool", "name": "get_weather"}
    assert to_anthropic.body["messages"][1]["content"][0]["name"] == "get_weather"
    assert to_anthropic.body["messages"][0]["content"][0] == {"type": "image", "source": {"type": "url",
                                                                                          "url": "https://img.test/a.png"}}
    assert any("renamed to 'get_weather'" in loss for loss in to_anthropic.lost)
    assert "seed = 1 has no Anthropic counterpart; dropped" in to_anthropic.lost


def test_anthropic_only_content_is_reported():
    body = {"model": "c", "max_tokens": 10, "metadata": {"user_id": "u"},
            "system": [{"type": "text", "text": "Sys", "cache_control": {"type": "ephemeral"}}],
            "tools": [{"name": "get_weather", "input_schema": WEATHER},
                      {"type": "web_search_20250305", "name": "web_search"}],
            "messages": [{"role": "user", "content": [{"type": "document", "source": {"type": "text", "data": "d"}}]},
                         {"role": "assistant", "content": [{"type": "thinking", "thinking": "hm", "signature": "s"},
                                                           {"type": "text", "text": "Hi"}]},
                         {"role": "user", "content": "ok"}]}
    t = translate(body, "anthropic", "openai", model="g")
    lost = "\n".join(t.lost)
    for words in ("cache_control", "`metadata` (Anthropic setting)", "a `document` block", "a `thinking` block",
                  "tools[1] (web_search_20250305): not a function tool", "message 0 (user): an empty message"):
        assert words in lost
    assert t.body["tools"] == [{"type": "function", "function": {"name": "get_weather", "parameters": WEATHER}}]
    assert t.body["messages"] == [{"role": "system", "content": "Sys"}, {"role": "assistant", "content": "Hi"},
                                  {"role": "user", "content": "ok"}]


def test_the_cline_session_keeps_every_call_and_result():
    body = json.loads((CLINE / "turn4" / "request.json").read_text())
    for target in ("anthropic", "gemini"):
        t = translate(body, "openai.chat", target, model="m", stream=True)
        back = translate(t.body, target, "openai", model="deepseek-chat", stream=True)
        original = [m for m in body["messages"]]
        assert len(back.body["messages"]) == len(original)
        for got, want in zip(back.body["messages"], original):
            assert got["role"] == want["role"]
            if want["role"] == "assistant":
                assert [json.loads(c["function"]["arguments"]) for c in got["tool_calls"]] == \
                       [json.loads(c["function"]["arguments"]) for c in want["tool_calls"]]
            elif want["role"] == "tool":
                assert got["content"] == want["content"] == "result missing"


def test_what_cannot_be_translated():
    with pytest.raises(TranslationError, match="openai.responses"):
        translate({"input": "hi"}, "openai.responses", "anthropic")
    with pytest.raises(TranslationError, match="not a JSON object"):
        translate("text", "openai", "gemini")
