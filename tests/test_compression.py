"""Compressed traffic: the agent gets the bytes as sent, and the capture records what they
say. A closing event counts once decoded, every valid Content-Encoding is undone (any
case, `identity`, stacked codings), and a compressed request body is parsed."""

from __future__ import annotations

import gzip
import json
import random
import sqlite3
import zlib

import brotli
import httpx
import openai
import pytest
import zstandard

from proxy import capture
from proxy.scripted import Reply
from proxy.store.db import open_database
from proxy.store.read import Reader, request_bytes
from proxy.store.resent import Spliced
from proxy.store.writer import Writer
from tests.test_journal import _read_all, _write
from tests.test_resent import record

COMPLETION = {"id": "c", "object": "chat.completion", "model": "m",
              "choices": [{"index": 0, "message": {"role": "assistant", "content": "hé"}, "finish_reason": "stop"}]}


def chunk(content: str) -> bytes:
    return b"data: " + json.dumps({"id": "s", "object": "chat.completion.chunk", "created": 1, "model": "m",
                                   "choices": [{"index": 0, "delta": {"content": content}}]}).encode() + b"\n\n"


def flushed(coding: str, events: list[bytes]) -> list[bytes]:
    """Each event compressed and flushed on its own, as a compressing server streams; the
    coding's end (gzip's trailer, brotli's last block) comes in a chunk of its own."""
    if coding == "gzip":
        c = zlib.compressobj(wbits=31)
        return [c.compress(e) + c.flush(zlib.Z_SYNC_FLUSH) for e in events] + [c.flush()]
    c = brotli.Compressor()
    return [c.process(e) + c.flush() for e in events] + [c.finish()]


def only_turn(tooltap) -> dict:
    (summary,) = tooltap.api("/turns")["turns"]
    return tooltap.api(f"/turns/{summary['id']}")


# -- A: the closing event of a compressed stream ------------------------------------------


@pytest.mark.parametrize("coding, spilled", [("gzip", False), ("br", False), ("gzip", True)],
                         ids=["gzip", "br", "gzip-in-a-file"])
def test_the_sdk_closing_at_done_of_a_compressed_stream_has_the_whole_answer(tooltap, upstream, monkeypatch,
                                                                            coding, spilled):
    """The official SDK stops at `[DONE]` and hangs up while the upstream still holds the
    stream open (its coding's end to come): ok, as the same stream uncompressed is."""
    if spilled:  # the raw bytes past the memory bound: read back from the temporary file
        monkeypatch.setattr(capture, "RAW_IN_MEMORY", 64)
    events = [chunk("a"), chunk("b"), b"data: [DONE]\n\n"]
    upstream.routes["/chat/completions"] = Reply(
        200, [("content-type", "text/event-stream"), ("content-encoding", coding)], flushed(coding, events),
        delay=0.3)
    client = openai.OpenAI(base_url=tooltap.url, api_key="sk-test-0123456789abcdef", max_retries=0)
    stream = client.chat.completions.create(model="m", messages=[{"role": "user", "content": "x"}], stream=True)
    assert "".join(c.choices[0].delta.content or "" for c in stream) == "ab"
    turn = only_turn(tooltap)
    assert (turn["status"], turn["error"]) == ("ok", None)
    assert turn["response"]["choices"][0]["message"]["content"] == "ab"
    assert upstream.finished == [False]  # the hang-up did come before the end of body


def test_a_compressed_stream_cut_before_its_closing_event_is_still_client_aborted(tooltap, upstream):
    events = [chunk(f"{i} ") for i in range(50)] + [b"data: [DONE]\n\n"]
    upstream.routes["/chat/completions"] = Reply(
        200, [("content-type", "text/event-stream"), ("content-encoding", "gzip")], flushed("gzip", events),
        delay=0.02)
    with httpx.stream("POST", f"{tooltap.url}/chat/completions", json={"model": "m", "stream": True},
                      headers={"accept-encoding": "gzip"}) as r:
        next(r.iter_raw())
    turn = only_turn(tooltap)
    assert turn["status"] == "client_aborted"


# -- B: every valid Content-Encoding ------------------------------------------------------


def deflated(data: bytes) -> bytes:
    return zlib.compress(data)  # HTTP's "deflate" is the zlib format


@pytest.mark.parametrize("headers, encode", [
    ([("content-encoding", "GZIP")], gzip.compress),
    ([("content-encoding", "gzip, identity")], gzip.compress),
    ([("content-encoding", "Identity")], lambda b: b),
    ([("content-encoding", "deflate, gzip")], lambda b: gzip.compress(deflated(b))),  # applied in that order
    ([("content-encoding", "deflate"), ("content-encoding", "Br")], lambda b: brotli.compress(deflated(b))),
], ids=["GZIP", "gzip-identity", "Identity", "deflate-gzip", "two-lines"])
@pytest.mark.parametrize("stream", [False, True], ids=["json", "stream"])
def test_every_valid_content_encoding_is_undone(tooltap, upstream, headers, encode, stream):
    if stream:
        plain, ctype = chunk("h") + chunk("é") + b"data: [DONE]\n\n", "text/event-stream"
    else:
        plain, ctype = json.dumps(COMPLETION).encode(), "application/json"
    packed = encode(plain)
    upstream.routes["/chat/completions"] = Reply(200, [("content-type", ctype)] + headers, [packed])
    with httpx.stream("POST", f"{tooltap.url}/chat/completions", json={"model": "m", "stream": stream},
                      headers={"accept-encoding": "gzip, deflate, br"}) as r:
        assert b"".join(r.iter_raw()) == packed
    turn = only_turn(tooltap)
    assert turn["error"] is None and turn["status"] == "ok"
    assert turn["response"]["choices"][0]["message"]["content"] == "hé"


# -- C: a compressed request body -----------------------------------------------------------


CODINGS = {"gzip": gzip.compress, "deflate": deflated, "br": brotli.compress,
           "zstd": zstandard.ZstdCompressor().compress}


@pytest.mark.parametrize("coding", list(CODINGS))
def test_a_compressed_request_is_parsed_and_threaded(tooltap, upstream, coding):
    upstream.routes["/chat/completions"] = Reply.json(COMPLETION)
    first = [{"role": "user", "content": "compress me"}]
    second = first + [{"role": "assistant", "content": "hé"}, {"role": "user", "content": "again"}]
    sent = []
    for messages in (first, second):
        body = CODINGS[coding](json.dumps({"model": "m", "messages": messages}).encode())
        r = httpx.post(f"{tooltap.url}/chat/completions", content=body,
                       headers={"content-type": "application/json", "content-encoding": coding})
        assert r.status_code == 200 and upstream.received[-1].body == body  # passed as sent
        sent.append(body)
    older, newer = sorted(tooltap.api("/turns")["turns"], key=lambda t: t["id"])
    assert newer["session_id"] == older["session_id"] and newer["parent_id"] == older["id"]
    turn = tooltap.api(f"/turns/{newer['id']}")
    assert turn["request"] == {"model": "m", "messages": second} and turn["request_encoding"] == "json"
    assert turn["model"] == "m" and turn["error"] is None
    with sqlite3.connect(tooltap.db_path) as conn:
        assert [n for (n,) in conn.execute("SELECT request_size FROM turns ORDER BY id")] == [len(b) for b in sent]


@pytest.mark.parametrize("body, headers, why", [
    (b"\x1f\x8b not gzip at all", {"content-encoding": "gzip"}, "cannot decompress (content-encoding 'gzip'"),
    (b"\x1f\x8b not gzip at all", {"content-encoding": "gzip", "content-type": "application/octet-stream"},
     "cannot decompress (content-encoding 'gzip'"),
    (gzip.compress(b"plain text"), {"content-encoding": "gzip"}, "once decompressed (content-encoding 'gzip')"),
    (b"anything", {"content-encoding": "compress"}, "unsupported content-encoding 'compress'"),
    (zstandard.ZstdCompressor().compress(bytes(40 << 20)), {"content-encoding": "zstd"},
     "more than 33554432 bytes once decompressed"),  # a kilobyte sent: not 40 MB in the writer
], ids=["damaged", "damaged-upload", "not-json", "unsupported", "bomb"])
def test_a_compressed_request_that_does_not_parse_is_kept_as_sent_and_says_why(tooltap, upstream, body, headers,
                                                                                why):
    upstream.routes["/chat/completions"] = Reply.json(COMPLETION)
    r = httpx.post(f"{tooltap.url}/chat/completions", content=body,
                   headers={"content-type": "application/json", **headers})
    assert r.status_code == 200
    turn = only_turn(tooltap)
    assert turn["request_encoding"] in ("base64", "text") and request_bytes(turn) == body
    assert why in turn["error"] and "kept as sent, unparsed" in turn["error"], turn["error"]


def test_compressed_bodies_the_journal_splices_are_parsed_decoded(tmp_path):
    """Two compressed bodies of a growing conversation share their first compressed bytes
    too: the journal hands the writer the second as a splice over the first. It is
    decoded whole, never taken for JSON text past a shared prefix."""
    rng = random.Random(0)
    words = ["".join(rng.choice("abcdefghijklmnopqrstuvwxyz") for _ in range(rng.randint(2, 9)))
             for _ in range(5000)]

    def text(n: int) -> str:
        return " ".join(rng.choice(words) for _ in range(n))

    messages = [{"role": "system", "content": text(8000)}, {"role": "user", "content": "fix it"}]
    plain = []
    for _ in range(4):
        plain.append(json.dumps({"model": "m", "messages": messages}).encode())
        messages = messages + [{"role": "assistant", "content": text(300)}, {"role": "user", "content": text(300)}]
    records = []
    for i, body in enumerate(plain):
        records.append(record(i, gzip.compress(body, mtime=0)))
        records[-1].request_headers = [["content-type", "application/json"], ["content-encoding", "gzip"]]
    journal = _write(tmp_path / "j", records, segment_bytes=8 << 20)
    read = _read_all(journal.slot)
    assert [isinstance(r.body(), Spliced) for r in read] == [False, True, True, True]
    url = f"sqlite:///{tmp_path / 'w.db'}"
    writer = Writer(url, spool_path=str(tmp_path / "spool"))
    writer.start()
    for r in read:
        writer.submit(r)
    writer.flush()
    writer.close()
    reader = Reader(open_database(url, create=False))
    turns = sorted(reader.turns(limit=10), key=lambda t: t["id"])
    assert [t["parent_id"] for t in turns[1:]] == [t["id"] for t in turns[:-1]]
    for t, body in zip(turns, plain):
        full = reader.turn(t["id"])
        assert full["request"] == json.loads(body) and not full["error"]
