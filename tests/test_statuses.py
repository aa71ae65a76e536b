"""Every turn status, each stored with what arrived."""

from __future__ import annotations

import asyncio
import http.client
import json
import socket
import time

import httpx
import openai
import pytest

from proxy import apis
from proxy.connections import Limits
from proxy.scripted import Reply, ScriptedUpstream
from tests.conftest import Server, free_port
from tests.raw_upstream import RawUpstream


def chunk(content: str) -> bytes:
    return b"data: " + json.dumps({"id": "s", "object": "chat.completion.chunk", "created": 1, "model": "m",
                                   "choices": [{"index": 0, "delta": {"content": content}}]}).encode() + b"\n\n"


REQ = {"model": "m", "stream": True, "messages": [{"role": "user", "content": "count"}]}


def only_turn(tooltap):
    turns = tooltap.api("/turns")["turns"]
    assert len(turns) == 1
    return tooltap.api(f"/turns/{turns[0]['id']}")


def test_ok(tooltap, upstream):
    upstream.routes["/chat/completions"] = Reply.sse(chunk("a") + chunk("b") + b"data: [DONE]\n\n")
    assert httpx.post(f"{tooltap.url}/chat/completions", json=REQ).status_code == 200
    turn = only_turn(tooltap)
    assert turn["status"] == "ok" and turn["http_status"] == 200
    assert turn["response"]["choices"][0]["message"]["content"] == "ab"


def test_upstream_http_error_passes_unchanged(tooltap, upstream):
    error = {"error": {"message": "Invalid API key", "type": "invalid_request_error"}}
    upstream.routes["/chat/completions"] = Reply.json(error, status=401)
    r = httpx.post(f"{tooltap.url}/chat/completions", json=REQ)
    assert r.status_code == 401 and r.json() == error
    turn = only_turn(tooltap)
    assert turn["status"] == "upstream_error" and turn["http_status"] == 401
    assert turn["response"] == error and turn["error"] == "401 from the upstream: Invalid API key"


def test_mid_stream_error_payload_keeps_partial_content(tooltap, upstream):
    err = b'data: {"error": {"message": "overloaded", "code": 529}}\n\n'
    upstream.routes["/chat/completions"] = Reply.sse(chunk("partial ") + chunk("text") + err)
    r = httpx.post(f"{tooltap.url}/chat/completions", json=REQ)
    assert r.status_code == 200 and r.content.endswith(err)
    turn = only_turn(tooltap)
    assert turn["status"] == "upstream_error"
    assert turn["stream_error"] == {"message": "overloaded", "code": 529}
    assert turn["error"] == "the upstream's stream reported an error: overloaded"
    page = httpx.get(f"{tooltap.url}/_tooltap/sessions/{turn['session_id']}").text
    assert page.count("the upstream's stream reported an error: overloaded") == 1
    assert turn["response"]["choices"][0]["message"]["content"] == "partial text"


def test_upstream_abort_reaches_the_client(tooltap, upstream):
    upstream.routes["/chat/completions"] = Reply.sse(chunk("one ") + chunk("two ") + chunk("three"),
                                                     drop_after=2)
    with pytest.raises(httpx.RemoteProtocolError):
        with httpx.stream("POST", f"{tooltap.url}/chat/completions", json=REQ) as r:
            b"".join(r.iter_raw())
    turn = only_turn(tooltap)
    assert turn["status"] == "upstream_aborted"
    assert turn["response"]["choices"][0]["message"]["content"] == "one two "
    assert turn["error"].startswith("UpstreamDisconnected: the upstream closed the connection while sending"), turn["error"]


@pytest.mark.parametrize("limits", [None, Limits()], ids=["uvicorn's protocol", "tooltap's"])
def test_client_abort_closes_upstream(make_tooltap, upstream, limits):
    tooltap = make_tooltap(upstream.url, limits=limits)
    upstream.routes["/chat/completions"] = Reply.sse(b"".join(chunk(f"{i} ") for i in range(200)), delay=0.02)
    with httpx.stream("POST", f"{tooltap.url}/chat/completions", json=REQ) as r:
        it = r.iter_raw()
        first = next(it)
        assert first.startswith(b"data:")
    # The agent hung up after the first chunk: tooltap must stop reading the upstream.
    deadline = time.monotonic() + 5
    while time.monotonic() < deadline and not tooltap.api("/turns")["turns"]:
        time.sleep(0.05)
    turn = only_turn(tooltap)
    assert turn["status"] == "client_aborted"
    assert upstream.finished == [False]
    assert len(turn["response"]["choices"][0]["message"]["content"].split()) < 150


def lingering(sse: bytes) -> Reply:
    """An event stream whose end of body comes 0.3 s after its last event."""
    reply = Reply.sse(sse, delay=0.1)
    reply.chunks.append(b"")  # nothing to write: only the pause before the end
    reply.delay = 0.3
    return reply


def test_the_sdk_closing_at_done_has_the_whole_answer(tooltap, upstream):
    """The official openai SDK stops at `[DONE]` and closes the connection, before the
    upstream's end of body may have come: the turn is ok, not client_aborted."""
    upstream.routes["/chat/completions"] = lingering(chunk("a") + chunk("b") + b"data: [DONE]\n\n")
    client = openai.OpenAI(base_url=tooltap.url, api_key="sk-test-0123456789abcdef", max_retries=0)
    stream = client.chat.completions.create(model="m", messages=REQ["messages"], stream=True)
    assert "".join(c.choices[0].delta.content or "" for c in stream) == "ab"
    turn = only_turn(tooltap)
    assert (turn["status"], turn["error"]) == ("ok", None)
    assert turn["response"]["choices"][0]["message"]["content"] == "ab"


def test_a_client_gone_after_message_stop_has_the_whole_answer(tooltap, upstream):
    events = [("message_start", {"type": "message_start", "message": {
                  "id": "m1", "type": "message", "role": "assistant", "model": "c", "content": [],
                  "stop_reason": None, "usage": {"input_tokens": 3, "output_tokens": 0}}}),
              ("content_block_start", {"type": "content_block_start", "index": 0,
                                       "content_block": {"type": "text", "text": ""}}),
              ("content_block_delta", {"type": "content_block_delta", "index": 0,
                                       "delta": {"type": "text_delta", "text": "hi"}}),
              ("content_block_stop", {"type": "content_block_stop", "index": 0}),
              ("message_stop", {"type": "message_stop"})]
    upstream.routes["/v1/messages"] = lingering(
        b"".join(b"event: " + n.encode() + b"\ndata: " + json.dumps(d).encode() + b"\n\n" for n, d in events))
    got = b""
    with httpx.stream("POST", f"{tooltap.url}/v1/messages", json={"model": "c", "stream": True,
                                                                 "messages": REQ["messages"]}) as r:
        for piece in r.iter_raw():
            got += piece
            if b"event: message_stop" in got:
                break  # and close, as a client that has what it wanted
    turn = only_turn(tooltap)
    assert (turn["status"], turn["error"]) == ("ok", None)
    assert turn["response"]["content"] == [{"type": "text", "text": "hi"}]


def test_only_a_whole_closing_event_counts():
    chat, claude, gemini = apis.by_name("openai.chat"), apis.by_name("anthropic.messages"), apis.by_name("gemini")
    assert chat.stream_closed(b'data: {"x":1}\n\ndata: [DONE]\n\n')
    assert chat.stream_closed(b'data: {"x":1}\r\n\r\ndata:[DONE]\r\n\r\n')
    assert not chat.stream_closed(b"data: [DONE]")  # cut before its blank line
    assert not chat.stream_closed(b'data: {"content":"data: [DONE]"}\n\n')  # text that looks like it
    assert not chat.stream_closed(b'data: [DONE]\n\ndata: {"x":1}\n\n')  # not the last event
    assert claude.stream_closed(b'event: message_stop\ndata: {"type":"message_stop"}\n\n')
    assert not claude.stream_closed(b'event: message_delta\ndata: {"type":"message_stop"}\n\n')
    assert not gemini.stream_closed(b'data: {"candidates":[]}\n\n')  # no closing event: the end of body is


def test_the_tail_is_read_back_from_memory_and_from_the_spilled_file():
    from proxy.capture import RAW_IN_MEMORY, RawBuffer

    raw = RawBuffer()
    raw.write(b"data: x\n\n")
    assert raw.tail(4096) == b"data: x\n\n"
    raw.write(b"." * RAW_IN_MEMORY + b"data: [DONE]\n\n")  # past the memory bound: a file now
    assert raw.tail(14) == b"data: [DONE]\n\n"
    raw.discard()


def test_unreachable_upstream_is_a_502_naming_the_cause(make_tooltap):
    port = free_port()  # nothing listens here
    tt = make_tooltap(f"http://127.0.0.1:{port}")
    r = httpx.post(f"{tt.url}/chat/completions", json=REQ)
    assert r.status_code == 502
    assert r.json()["error"]["type"] == "tooltap_proxy_error"
    assert f"cannot connect to 127.0.0.1:{port}" in r.json()["error"]["message"]
    turn = only_turn(tt)
    assert turn["status"] == "proxy_error" and "ConnectError" in turn["error"]
    assert turn["request"] == REQ


def test_an_upstream_that_never_finishes_its_tls_handshake_is_named(make_tooltap):
    """A connect or handshake timeout has no text of its own: the 502 says what ran out."""
    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen()  # the kernel accepts; nothing ever answers the TLS hello
        port = listener.getsockname()[1]
        tt = make_tooltap(f"https://127.0.0.1:{port}", connect_timeout=0.5)
        r = httpx.post(f"{tt.url}/chat/completions", json=REQ, timeout=10)
    assert r.status_code == 502
    assert r.json()["error"]["message"].endswith(
        f"cannot connect to 127.0.0.1:{port}: no connection and TLS handshake within 0.5 s")
    assert only_turn(tt)["error"].endswith("within 0.5 s")


def test_silent_upstream_times_out_as_proxy_error(make_tooltap, upstream):
    """An upstream that accepts the request but never answers: the agent gets a 504 once
    the read timeout passes, saying so and naming the option (not "could not reach"), and
    the turn is recorded."""
    upstream.routes["/v1/chat/completions"] = Reply.json({"late": True}, wait=3)
    tt = make_tooltap(upstream.url, read_timeout=0.5)
    r = httpx.post(f"{tt.url}/v1/chat/completions", json=REQ, timeout=10)
    assert r.status_code == 504 and r.json()["error"]["type"] == "tooltap_upstream_timeout"
    assert r.json()["error"]["message"] == ("the upstream sent nothing for 0.5 s without answering "
                                            "(tooltap serve --read-timeout sets how long to wait)")
    turn = only_turn(tt)
    assert turn["status"] == "proxy_error"
    assert turn["error"] == "ReadTimeout: the upstream sent nothing for 0.5 s (tooltap serve --read-timeout)"


def test_stalled_stream_times_out_as_upstream_aborted(make_tooltap, upstream):
    upstream.routes["/v1/chat/completions"] = Reply(
        200, [("content-type", "text/event-stream")], [chunk("fast "), chunk("then silence")], delay=0.8)
    tt = make_tooltap(upstream.url, read_timeout=0.5)
    with pytest.raises(httpx.RemoteProtocolError):
        with httpx.stream("POST", f"{tt.url}/v1/chat/completions", json=REQ, timeout=10) as r:
            b"".join(r.iter_raw())
    turn = only_turn(tt)
    assert turn["status"] == "upstream_aborted"
    assert turn["error"] == "ReadTimeout: the upstream sent nothing for 0.5 s (tooltap serve --read-timeout)"


def test_non_json_response_is_kept_raw_and_flagged(make_tooltap, upstream):
    upstream.routes["/v1/chat/completions"] = Reply(200, [("content-type", "application/json")],
                                                    [b'{"truncated": '])
    tt = make_tooltap(upstream.url)
    r = httpx.post(f"{tt.url}/v1/chat/completions", json={"model": "m", "messages": []})
    assert r.content == b'{"truncated": '
    turn = only_turn(tt)
    assert turn["response"] is None and "not valid JSON" in turn["error"]
    assert httpx.get(f"{tt.url}/_tooltap/api/turns/{turn['id']}/raw").content == b'{"truncated": '


@pytest.mark.parametrize("limits", [None, Limits()], ids=["uvicorn's protocol", "tooltap's"])
def test_client_gone_before_headers_is_client_aborted(make_tooltap, upstream, limits):
    """The agent gives up while the model is still thinking: tooltap stops waiting too
    (told by a task that waits for the disconnect, or by tooltap's server)."""
    tooltap = make_tooltap(upstream.url, limits=limits)
    upstream.routes["/chat/completions"] = Reply.json({"too": "late"}, wait=3)
    with pytest.raises(httpx.ReadTimeout):
        httpx.post(f"{tooltap.url}/chat/completions", json=REQ, timeout=0.5)
    turn = only_turn(tooltap)
    assert turn["status"] == "client_aborted" and turn["http_status"] is None
    # Ended at the hang-up (0.5 s), not after the upstream's answer (3 s); how long the
    # writer then takes to store it is another matter.
    assert turn["duration_ms"] < 2000


def test_half_sent_request_is_not_forwarded(tooltap, upstream):
    host, port = tooltap.url.removeprefix("http://").split(":")
    with socket.create_connection((host, int(port))) as s:
        s.sendall(b"POST /chat/completions HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\n"
                  b"content-length: 1000\r\n\r\n{\"model\": \"m\"")
    deadline = time.monotonic() + 5
    while time.monotonic() < deadline and not tooltap.api("/turns")["turns"]:
        time.sleep(0.05)
    turn = only_turn(tooltap)
    assert turn["status"] == "client_aborted" and "sending its request" in turn["error"]
    assert upstream.received == []


def test_bodyless_get_reaches_upstream_without_a_body_header(tooltap, upstream):
    upstream.routes["/v1/models"] = Reply.json({"data": []})
    httpx.get(f"{tooltap.url}/v1/models")
    got = upstream.received[-1]
    assert got.header("content-length") is None and got.header("transfer-encoding") is None
    assert got.body == b""


def test_stored_path_keeps_the_agents_encoding(tooltap, upstream):
    upstream.routes["/v1/a/b c"] = Reply.json({})
    httpx.get(f"{tooltap.url}/v1/a%2Fb%20c?x=%00")
    assert tooltap.api("/turns")["turns"][0]["path"] == "/v1/a%2Fb%20c?x=%00"


def test_unparseable_stream_events_are_flagged_and_kept_raw(tooltap, upstream):
    body = chunk("good ") + b"data: {not json\n\n" + chunk("end") + b"data: [DONE]\n\n"
    upstream.routes["/chat/completions"] = Reply.sse(body)
    httpx.post(f"{tooltap.url}/chat/completions", json=REQ)
    turn = only_turn(tooltap)
    assert turn["response"]["choices"][0]["message"]["content"] == "good end"
    assert "1 event(s) were not JSON" in turn["error"]
    assert httpx.get(f"{tooltap.url}/_tooltap/api/turns/{turn['id']}/raw").content == body


@pytest.mark.parametrize("watched", [False, True], ids=["unwatched", "watched-live"])
@pytest.mark.parametrize("body", [b"garbage, not an event stream\n", b": ping\n\n: ping\n\n"],
                         ids=["no-sse", "pings-only"])
def test_an_event_stream_without_events_is_flagged(tooltap, upstream, body, watched):
    """A 200 `text/event-stream` that holds no event (a misconfigured provider, a gateway's
    page under the wrong type, keep-alives and nothing else) was stored `ok` with an empty
    answer; it is flagged, and its bytes are kept. Whether the inspector's live view watches
    (the proxy then assembles the stream as it comes) or not (the writer does)."""
    from tests.test_inspector_pages import live_starts

    upstream.routes["/chat/completions"] = Reply.sse(body)
    answers = []

    def send():
        answers.append(httpx.post(f"{tooltap.url}/chat/completions", json=REQ))

    if watched:
        live_starts(tooltap, send, 1)
    else:
        send()
    r = answers[0]
    assert r.content.startswith(body)
    turn = only_turn(tooltap)
    assert turn["status"] == "ok" and f"no events in the {len(r.content)}-byte event stream" in turn["error"]
    assert httpx.get(f"{tooltap.url}/_tooltap/api/turns/{turn['id']}/raw").content == r.content


def test_options_star_is_answered_and_recorded(tooltap, upstream):
    host, port = tooltap.url.removeprefix("http://").split(":")
    with socket.create_connection((host, int(port))) as s:
        s.sendall(b"OPTIONS * HTTP/1.1\r\nhost: x\r\ncontent-length: 0\r\n\r\n")
        s.settimeout(5)
        answer = b""
        while b"}}" not in answer:  # the head and the JSON body may come in two reads
            answer += s.recv(4096) or b"}}"
    assert answer.startswith(b"HTTP/1.1 400") and b"tooltap_bad_target" in answer
    turn = only_turn(tooltap)
    assert turn["status"] == "proxy_error" and turn["path"] == "*" and "'*'" in turn["error"]
    assert upstream.received == []


def test_an_unreachable_upstream_is_one_log_line_without_secrets(make_tooltap, caplog):
    tooltap = make_tooltap("http://127.0.0.1:9")  # nothing listens on the discard port
    with caplog.at_level("WARNING", logger="tooltap"):
        r = httpx.post(f"{tooltap.url}/chat/completions?key=AIzaSecretSecretSecret123", json=REQ,
                       headers={"authorization": "Bearer sk-secret-0123456789abcdef"})
        tooltap.flush()
    assert r.status_code == 502
    lines = [rec.getMessage() for rec in caplog.records if rec.name == "tooltap"]
    assert len(lines) == 1 and "POST /chat/completions" in lines[0] and "127.0.0.1:9" in lines[0]
    assert "Secret" not in lines[0] and "sk-secret" not in lines[0]


class NotModified(RawUpstream):
    """Answers every request on a connection with a 304 that carries the Content-Length of
    the representation it stands for (RFC 9110 8.6 allows it), and no body."""

    async def _connection(self, reader, writer) -> None:
        try:
            while True:
                await reader.readuntil(b"\r\n\r\n")
                writer.write(b'HTTP/1.1 304 Not Modified\r\netag: "abc"\r\ncontent-length: 123\r\n\r\n')
                await writer.drain()
        except (asyncio.IncompleteReadError, ConnectionError):
            writer.close()


def test_a_304_with_a_content_length_passes_on_a_kept_alive_connection(make_tooltap):
    with NotModified() as up:
        tt = make_tooltap(up.url)
        with httpx.Client(timeout=5) as client:
            answers = [client.get(f"{tt.url}/v1/files/f1", headers={"if-none-match": '"abc"'}) for _ in range(2)]
        assert [(r.status_code, r.headers["etag"], r.content) for r in answers] == [(304, '"abc"', b"")] * 2
        turns = tt.api("/turns")["turns"]
        assert [(t["status"], t["http_status"]) for t in turns] == [("ok", 304)] * 2


def test_named_upstreams_route_and_cut_the_path_as_the_agent_encoded_it(make_tooltap, upstream):
    """A prefix is matched where the path is cut: on the path as sent. `/%63laude/...`
    (an encoded "c") is not the `claude` upstream's, nor is `/claude%2Fv1/...`."""
    other = ScriptedUpstream({"/base/v1/messages": Reply.json({"from": "claude"})})
    with Server(other) as other_server:
        tt = make_tooltap(upstream.url, f"claude={other_server.url}/base")
        for path in ("/claude/v1/messages", "/%63laude/v1/messages", "/claude%2Fv1/messages"):
            conn = http.client.HTTPConnection("127.0.0.1", tt.server.port, timeout=5)
            conn.request("POST", path, body=b"{}", headers={"content-type": "application/json"})
            conn.getresponse().read()
            conn.close()
    assert [got.raw_path for got in other.received] == [b"/base/v1/messages"]
    assert [got.raw_path for got in upstream.received] == [b"/%63laude/v1/messages", b"/claude%2Fv1/messages"]


def test_a_redirect_within_the_upstream_stays_within_tooltap(make_tooltap, upstream):
    """Followed as sent, a redirect would leave tooltap (its turn unrecorded) or, from an
    upstream under a prefix, reach the root upstream with this one's key. The client gets
    the same place through tooltap; the turn keeps the Location as the upstream sent it."""
    def moved(location: str) -> Reply:
        return Reply(307, [("location", location), ("content-length", "0")], [])

    other = ScriptedUpstream()
    with Server(other) as other_server:
        base = f"{other_server.url}/base"
        other.routes.update({"/base/a": moved("/base/v2/messages?x=1"), "/base/b": moved(f"{base}/v3"),
                             "/base/c": moved("https://elsewhere.example/x"), "/base/d": moved("/basement/x")})
        upstream.routes["/e"] = moved(f"{upstream.url}/v1/z")
        tt = make_tooltap(upstream.url, f"claude={base}")
        got = {path: httpx.get(tt.url + path).headers["location"]
               for path in ("/claude/a", "/claude/b", "/claude/c", "/claude/d", "/e")}
    assert got == {"/claude/a": "/claude/v2/messages?x=1", "/claude/b": "/claude/v3",
                   "/claude/c": "https://elsewhere.example/x", "/claude/d": "/basement/x", "/e": "/v1/z"}
    stored = {t["path"]: t["id"] for t in tt.api("/turns")["turns"]}
    headers = dict(tt.api(f"/turns/{stored['/claude/a']}")["response_headers"])
    assert headers["location"] == "/base/v2/messages?x=1"
