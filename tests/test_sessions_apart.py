"""Conversations on different wire APIs or upstreams never share a session, however alike
their first words; each still threads its own turns. Official SDKs through a real tooltap."""

from __future__ import annotations

import anthropic
import httpx
import openai

from proxy.scripted import Reply

ASK = "Plan a weekend in Lisbon"
OPENAI_REPLY = Reply.json({"id": "c1", "object": "chat.completion", "created": 1, "model": "gpt-test",
                           "choices": [{"index": 0, "message": {"role": "assistant", "content": "Day one: Alfama."},
                                        "finish_reason": "stop"}]})
ANTHROPIC_REPLY = Reply.json({"id": "msg_1", "type": "message", "role": "assistant", "model": "claude-test",
                              "content": [{"type": "text", "text": "Day one: Alfama."}], "stop_reason": "end_turn",
                              "stop_sequence": None, "usage": {"input_tokens": 5, "output_tokens": 4}})


def sessions_by_model(tooltap) -> dict[str, list[int]]:
    """model -> ids of the turns of its session(s), one entry per session."""
    out = {}
    for s in tooltap.api("/sessions")["sessions"]:
        turns = tooltap.api(f"/sessions/{s['id']}")["turns"]
        assert len(s["models"]) == 1, s  # a session never mixes the two conversations
        out.setdefault(s["models"][0], []).append([t["id"] for t in turns])
    return out


def test_same_first_words_on_two_wire_apis_are_two_sessions(tooltap, upstream):
    upstream.routes["/v1/chat/completions"] = OPENAI_REPLY
    upstream.routes["/v1/messages"] = ANTHROPIC_REPLY
    oa = openai.OpenAI(base_url=f"{tooltap.url}/v1", api_key="sk-test-0123456789abcdef")
    an = anthropic.Anthropic(base_url=tooltap.url, api_key="sk-ant-test-0123456789abcdef")
    history = [{"role": "user", "content": ASK}]
    follow_up = [*history, {"role": "assistant", "content": "Day one: Alfama."}, {"role": "user", "content": "And day two?"}]
    for messages in (history, follow_up):
        oa.chat.completions.create(model="gpt-test", messages=messages)
        an.messages.create(model="claude-test", max_tokens=100, messages=messages)

    by_model = sessions_by_model(tooltap)
    assert sorted(by_model) == ["claude-test", "gpt-test"]
    # One session each, and each has both of its own turns, the second a child of the first.
    assert [len(ids) for ids in by_model["gpt-test"]] == [2]
    assert [len(ids) for ids in by_model["claude-test"]] == [2]
    for (first, second), in (by_model["gpt-test"], by_model["claude-test"]):
        assert tooltap.api(f"/turns/{second}")["parent_id"] == first


def test_same_conversation_on_two_upstreams_is_two_sessions(make_tooltap, upstream):
    upstream.routes["/v1/chat/completions"] = OPENAI_REPLY
    upstream.routes["/eu/v1/chat/completions"] = OPENAI_REPLY
    tooltap = make_tooltap(upstream.url, f"eu={upstream.url}/eu")
    body = {"model": "gpt-test", "messages": [{"role": "user", "content": ASK}]}
    for path in ("/v1/chat/completions", "/eu/v1/chat/completions"):
        assert httpx.post(tooltap.url + path, json=body).status_code == 200
    sessions = tooltap.api("/sessions")["sessions"]
    assert len(sessions) == 2 and all(s["turns"] == 1 for s in sessions)
    # The client's own session header still wins over everything.
    for path in ("/v1/chat/completions", "/eu/v1/chat/completions"):
        httpx.post(tooltap.url + path, json=body, headers={"x-tooltap-session": "both"})
    assert len(tooltap.api("/sessions/both")["turns"]) == 2
