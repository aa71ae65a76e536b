"""A pooled upstream connection that the upstream closed while it idled.

Servers close idle keep-alive connections after a few seconds (uvicorn and Node after 5),
and a request sent on one just as it closes fails before any answer. Nothing reached the
model, so tooltap sends it again on a new connection, once, POST included; the agent
(here the official SDK, with its own retries off) never sees the race. A new connection
that fails is the upstream's answer: tooltap does not send the request twice."""

from __future__ import annotations

import asyncio
import json
import socket
import struct

import openai
import pytest

from proxy.forward import STREAM_BODY_BYTES
from tests.raw_upstream import RawUpstream

BODY = (b'{"id":"c","object":"chat.completion","created":1,"model":"m","choices":[{"index":0,'
        b'"message":{"role":"assistant","content":"ok"},"finish_reason":"stop"}]}')
ANSWER = (b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: %d\r\n\r\n" % len(BODY)) + BODY


class ClosingUpstream(RawUpstream):
    """Answers the first `answers` requests of each connection, then reads the next one
    and closes the connection without a word (FIN, or RST with `reset`), as a server
    whose idle timeout fires just as the request arrives. `seen` lists, per connection,
    the messages of the requests it read."""

    def __init__(self, answers: int, reset: bool = False):
        self.answers, self.reset = answers, reset
        self.seen: list[list[str]] = []
        super().__init__()

    async def _connection(self, reader, writer) -> None:
        requests: list[str] = []
        self.seen.append(requests)
        try:
            while True:
                head = await reader.readuntil(b"\r\n\r\n")
                length = next(int(line.split(b":")[1]) for line in head.split(b"\r\n")
                              if line.lower().startswith(b"content-length:"))
                body = await reader.readexactly(length)
                requests.append(body.decode())
                if len(requests) > self.answers:
                    break
                writer.write(ANSWER)
                await writer.drain()
        except (asyncio.IncompleteReadError, ConnectionError):
            pass
        if self.reset:
            writer.get_extra_info("socket").setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        writer.close()


def ask(client: openai.OpenAI, text: str):
    return client.chat.completions.create(model="m", messages=[{"role": "user", "content": text}])


@pytest.mark.parametrize("reset", [False, True], ids=["fin", "rst"])
def test_a_request_on_a_connection_the_upstream_closed_is_sent_again(make_tooltap, reset):
    with ClosingUpstream(answers=1, reset=reset) as up:
        tt = make_tooltap(up.url)
        client = openai.OpenAI(base_url=tt.url, api_key="sk-test", max_retries=0)
        for n in range(3):
            assert ask(client, f"question {n}").choices[0].message.content == "ok"
        # Each pooled connection took one answer, then was closed under the next request,
        # which went again on a new connection.
        asked = [[m.split('"content":"')[1].split('"')[0] for m in conn] for conn in up.seen]
        assert asked == [["question 0", "question 1"], ["question 1", "question 2"], ["question 2"]]
        turns = tt.api("/turns")["turns"]
        assert len(turns) == 3 and {t["status"] for t in turns} == {"ok"}


def test_a_large_request_streamed_on_a_connection_the_upstream_closed_is_sent_again_whole(make_tooltap):
    # A body this large goes upstream part by part as it arrives (forward.py): what went
    # on the dead connection is sent again, all of it, on the new one.
    with ClosingUpstream(answers=1) as up:
        tt = make_tooltap(up.url)
        client = openai.OpenAI(base_url=tt.url, api_key="sk-test", max_retries=0, timeout=20)
        questions = [f"question {n} " + "y" * (2 * STREAM_BODY_BYTES) for n in range(2)]
        for q in questions:
            assert ask(client, q).choices[0].message.content == "ok"
        asked = [[json.loads(m)["messages"][0]["content"] for m in conn] for conn in up.seen]
        assert asked == [questions, questions[1:]]
        turns = tt.api("/turns")["turns"]
        assert len(turns) == 2 and {t["status"] for t in turns} == {"ok"}
        stored = [tt.api(f"/turns/{t['id']}")["request"]["messages"][0]["content"] for t in turns]
        assert sorted(stored) == questions


def test_a_new_connection_that_fails_is_not_sent_twice(make_tooltap):
    with ClosingUpstream(answers=0) as up:
        tt = make_tooltap(up.url)
        client = openai.OpenAI(base_url=tt.url, api_key="sk-test", max_retries=0)
        with pytest.raises(openai.APIStatusError) as failed:
            ask(client, "only once")
        assert failed.value.status_code == 502
        assert "could not reach the upstream" in failed.value.response.text
        assert len(up.seen) == 1 and len(up.seen[0]) == 1
        (turn,) = tt.api("/turns")["turns"]
        assert turn["status"] == "proxy_error" and "UpstreamDisconnected" in turn["error"]
