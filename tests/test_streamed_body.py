"""A large request body (an agent's history late in a session) goes upstream as it
arrives, not after it has all arrived, and an agent that gives up halfway never leaves
the upstream a request it could take as whole (proxy/forward.py's _RequestBody)."""

from __future__ import annotations

import hashlib
import json
import socket
import time

import httpx
import openai
import pytest

from proxy.forward import STREAM_BODY_BYTES
from proxy.scripted import Reply
from tests.raw_upstream import ANSWER, WatchedUpstream

def chat_body(size: int) -> bytes:
    return json.dumps({"model": "m", "messages": [
        {"role": "system", "content": "history " * (size // 8)},
        {"role": "user", "content": "and now?"}]}).encode()


def head_for(tooltap, body: bytes) -> bytes:
    return (b"POST /v1/chat/completions HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\n"
            b"authorization: Bearer sk-test\r\ncontent-length: %d\r\n\r\n" % len(body))


def connect(tooltap) -> socket.socket:
    host, port = tooltap.url.removeprefix("http://").split(":")
    return socket.create_connection((host, int(port)))


def test_a_large_body_reaches_the_upstream_before_the_agent_has_sent_it_all(make_tooltap):
    body = chat_body(2 * STREAM_BODY_BYTES + 100_000)
    half = len(body) // 2
    with WatchedUpstream() as up:
        tt = make_tooltap(up.url)
        with connect(tt) as s:
            s.sendall(head_for(tt, body) + body[:half])
            # Read whole first, the upstream would see nothing until the rest is sent.
            assert up.wait_for(STREAM_BODY_BYTES), f"the upstream has {up.got} bytes of {half} sent"
            s.sendall(body[half:])
            answer = b""
            while not answer.endswith(ANSWER):
                piece = s.recv(65536)
                assert piece, answer
                answer += piece
        assert answer.startswith(b"HTTP/1.1 200")
        assert up.lengths == [len(body)] and hashlib.sha256(up.bodies[0]).digest() == hashlib.sha256(body).digest()
        (turn,) = tt.api("/turns")["turns"]
        stored = tt.api(f"/turns/{turn['id']}")
        assert stored["status"] == "ok" and stored["request"] == json.loads(body)


def test_an_agent_that_gives_up_halfway_leaves_the_upstream_short_of_the_length(make_tooltap):
    body = chat_body(3 * STREAM_BODY_BYTES)
    with WatchedUpstream() as up:
        tt = make_tooltap(up.url)
        with connect(tt) as s:
            s.sendall(head_for(tt, body) + body[:2 * STREAM_BODY_BYTES])
            assert up.wait_for(STREAM_BODY_BYTES)
        deadline = time.monotonic() + 5
        while not up.ended and time.monotonic() < deadline:
            time.sleep(0.01)
        # tooltap closed the upstream's connection short of the announced length: no
        # server takes that for a request, and nothing was answered.
        assert up.lengths == [len(body)] and up.bodies == []
        assert len(up.ended) == 1 and STREAM_BODY_BYTES <= up.ended[0] <= 2 * STREAM_BODY_BYTES
        (turn,) = tt.api("/turns")["turns"]
        stored = tt.api(f"/turns/{turn['id']}")
        assert stored["status"] == "client_aborted" and "sending its request" in stored["error"]
        assert stored["http_status"] is None


def test_the_official_sdk_with_a_large_history_gets_its_answer_and_the_turn_is_whole(tooltap, upstream):
    upstream.routes["/chat/completions"] = Reply.json(json.loads(ANSWER))
    client = openai.OpenAI(base_url=tooltap.url, api_key="sk-test", max_retries=0)
    history = [{"role": "user" if i % 2 else "assistant", "content": f"turn {i} " + "x" * 20_000}
               for i in range(40)]  # ~800 KB
    reply = client.chat.completions.create(model="m", messages=history)
    assert reply.id == "c"
    got = upstream.received[0]
    assert int(got.header("content-length")) == len(got.body) > 3 * STREAM_BODY_BYTES
    assert json.loads(got.body)["messages"] == history
    (turn,) = tooltap.api("/turns")["turns"]
    assert tooltap.api(f"/turns/{turn['id']}")["request"]["messages"] == history


def test_an_agent_gone_after_sending_a_large_body_is_noticed_before_the_answer(tooltap, upstream):
    """The hang-up watch starts once a streamed body is whole."""
    upstream.routes["/chat/completions"] = Reply.json({"too": "late"}, wait=3)
    with pytest.raises(httpx.ReadTimeout):
        httpx.post(f"{tooltap.url}/chat/completions", content=chat_body(2 * STREAM_BODY_BYTES),
                   headers={"content-type": "application/json"}, timeout=0.5)
    (turn,) = tooltap.api("/turns")["turns"]
    stored = tooltap.api(f"/turns/{turn['id']}")
    assert stored["status"] == "client_aborted" and stored["http_status"] is None
    assert stored["duration_ms"] < 2000  # at the hang-up, not at the answer (3 s)
