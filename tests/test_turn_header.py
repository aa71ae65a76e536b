"""serve --turn-header: each forwarded response names its turn, and the API gives that
turn once stored, waiting for it, so a test (or an agent's harness) finds its own turn
without polling the turns list."""

from __future__ import annotations

import json

import httpx
import openai

from proxy.demo import chat_sse, words
from proxy.scripted import Reply

TOOL_CALL_SSE = b"".join(
    b"data: " + json.dumps(c).encode() + b"\n\n" for c in [
        {"id": "c1", "object": "chat.completion.chunk", "created": 1, "model": "m",
         "choices": [{"index": 0, "delta": {"role": "assistant", "tool_calls": [
             {"index": 0, "id": "call_1", "type": "function",
              "function": {"name": "read_file", "arguments": "{\"path\": \"src/app.py\"}"}}]},
             "finish_reason": None}]},
        {"id": "c1", "object": "chat.completion.chunk", "created": 1, "model": "m",
         "choices": [{"index": 0, "delta": {}, "finish_reason": "tool_calls"}]},
    ]) + b"data: [DONE]\n\n"


def test_each_response_names_its_turn_and_the_api_waits_for_it(make_tooltap, upstream):
    upstream.routes["/chat/completions"] = Reply.sse(TOOL_CALL_SSE)
    tt = make_tooltap(upstream.url, turn_header=True)
    client = openai.OpenAI(base_url=tt.url, api_key="sk-test", max_retries=0)
    uids = []
    for n in range(3):
        raw = client.chat.completions.with_raw_response.create(
            model="m", stream=True, messages=[{"role": "user", "content": f"read it {n}"}])
        assert b"".join(raw.http_response.iter_bytes()) == TOOL_CALL_SSE  # the body is untouched
        uids.append(raw.headers["x-tooltap-turn"])
    assert len(set(uids)) == 3 and all(len(u) == 32 for u in uids)
    for n, uid in enumerate(uids):
        # No flush, no polling: the API waits until the writer has stored it.
        r = httpx.get(f"{tt.url}/_tooltap/api/turns/uid/{uid}", params={"wait": 10}, timeout=15)
        assert r.status_code == 200
        turn = r.json()
        assert turn["request"]["messages"][0]["content"] == f"read it {n}"
        assert [c["name"] for c in turn["tool_calls"]] == ["read_file"]
        assert turn["tool_calls"][0]["arguments"] == {"path": "src/app.py"}


def test_tooltaps_own_error_answer_names_its_turn_too(make_tooltap):
    tt = make_tooltap("http://127.0.0.1:9", turn_header=True)  # nothing listens there
    r = httpx.post(f"{tt.url}/chat/completions", json={"model": "m", "messages": []}, timeout=15)
    assert r.status_code == 502
    turn = httpx.get(f"{tt.url}/_tooltap/api/turns/uid/{r.headers['x-tooltap-turn']}",
                     params={"wait": 10}, timeout=15).json()
    assert turn["status"] == "proxy_error"


def test_without_the_flag_no_header_and_unknown_uids_are_404(tooltap, upstream):
    upstream.routes["/chat/completions"] = Reply.sse(chat_sse("m", words("hi")))
    r = httpx.post(f"{tooltap.url}/chat/completions", json={"model": "m", "stream": True, "messages": []})
    assert r.status_code == 200 and "x-tooltap-turn" not in r.headers
    missing = httpx.get(f"{tooltap.url}/_tooltap/api/turns/uid/{'0' * 32}", params={"wait": 0.2})
    assert missing.status_code == 404 and "after 0.2 s" in missing.json()["detail"]
    assert httpx.get(f"{tooltap.url}/_tooltap/api/turns/uid/x", params={"wait": 31}).status_code == 422
