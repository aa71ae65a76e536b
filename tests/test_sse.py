"""SSEDecoder against the WHATWG event-stream rules, under any network chunking."""

from __future__ import annotations

import json

from hypothesis import given, settings
from hypothesis import strategies as st

from proxy.sse import Event, SSEDecoder, data_only, named_events


def decode(*chunks: bytes) -> list[Event]:
    dec = SSEDecoder()
    events: list[Event] = []
    for chunk in chunks:
        events += dec.feed(chunk)
    return events + dec.close()


def bytewise(data: bytes) -> list[Event]:
    return decode(*(data[i : i + 1] for i in range(len(data))))


def datas(events: list[Event]) -> list[str]:
    return [e.data for e in events]


def test_line_endings_lf_cr_crlf_are_equivalent():
    for eol in (b"\n", b"\r", b"\r\n"):
        stream = b"data: a" + eol + b"data: b" + eol + eol + b"data: c" + eol + eol
        assert datas(decode(stream)) == ["a\nb", "c"], eol
        assert datas(bytewise(stream)) == ["a\nb", "c"], eol


def test_mixed_line_endings_in_one_stream():
    assert datas(decode(b"data: a\r\n\rdata: b\n\r\ndata: c\r\r")) == ["a", "b", "c"]


def test_lf_then_cr_is_two_line_ends():
    # "\n\r" is not a line ending pair: it ends one line and then a blank one.
    assert datas(decode(b"data: a\n\rdata: b\n\n")) == ["a", "b"]


def test_chunk_ending_between_cr_and_lf():
    # The LF that follows in the next chunk is part of the CRLF, not a blank line.
    assert datas(decode(b"data: a\r", b"\ndata: b\r\n\r\n")) == ["a\nb"]


def test_empty_chunk_between_cr_and_lf_keeps_the_pair():
    # An empty read used to forget the pending CR (bug in the first sse.py), so the LF
    # became a blank line and split one event in two.
    assert datas(decode(b"data: a\r", b"", b"\ndata: b\r\n\r\n")) == ["a\nb"]


def test_line_split_anywhere():
    stream = b"event: delta\ndata: {\"x\": 1}\nid: 7\n\n"
    for cut in range(len(stream) + 1):
        events = decode(stream[:cut], stream[cut:])
        assert events == [Event(data='{"x": 1}', event="delta", id="7")], cut


def test_utf8_character_split_across_chunks():
    stream = "data: 华盛顿 🌦 ok\n\n".encode()
    for cut in range(len(stream) + 1):
        assert datas(decode(stream[:cut], stream[cut:])) == ["华盛顿 🌦 ok"], cut
    assert datas(bytewise(stream)) == ["华盛顿 🌦 ok"]


def test_comments_are_ignored_and_counted():
    dec = SSEDecoder()
    events = dec.feed(b": keep-alive\n\n: OPENROUTER PROCESSING\n\ndata: x\n:mid-event comment\n\n")
    assert datas(events + dec.close()) == ["x"]
    assert dec.comments == 3


def test_multiline_data_joined_with_lf():
    assert datas(decode(b"data: one\ndata: two\ndata:\ndata: three\n\n")) == ["one\ntwo\n\nthree"]


def test_exactly_one_leading_space_dropped():
    events = decode(b"data:no space\n\ndata:  two spaces\n\ndata: \n\ndata:\ttab\n\n")
    assert datas(events) == ["no space", " two spaces", "", "\ttab"]


def test_field_without_colon_is_the_field_with_empty_value():
    assert datas(decode(b"data\ndata\n\n")) == ["\n"]


def test_event_and_id_fields():
    events = decode(b"event: response.created\nid: 1\ndata: {}\n\ndata: x\n\n")
    assert events[0] == Event(data="{}", event="response.created", id="1")
    # The event type resets after a dispatch; the last event id persists (WHATWG).
    assert events[1] == Event(data="x", event="message", id="1")


def test_id_with_nul_is_ignored():
    assert decode(b"id: 1\ndata: a\n\nid: x\x00y\ndata: b\n\n")[1].id == "1"


def test_retry_only_ascii_digits():
    events = decode(b"retry: 3000\ndata: a\n\nretry: 1x\ndata: b\n\n")
    assert [e.retry for e in events] == [3000, None]
    # "²".isdigit() is True in Python: int("²") used to raise and kill the stream.
    assert decode("retry: ²\ndata: c\n\n".encode())[0] == Event(data="c")


def test_unknown_fields_ignored():
    assert decode(b"foo: bar\ndata: a\nbaz\n\n") == [Event(data="a")]


def test_block_without_data_dispatches_nothing():
    assert decode(b"event: ping\n\nid: 3\n\n\n\n") == []
    # and the event type of the empty block does not leak into the next one
    assert decode(b"event: ping\n\ndata: a\n\n") == [Event(data="a")]


def test_last_event_without_blank_line_is_dispatched_by_close():
    dec = SSEDecoder()
    assert datas(dec.feed(b"data: {}\n\ndata: [DONE]")) == ["{}"]
    assert datas(dec.close()) == ["[DONE]"]
    assert datas(decode(b"data: [DONE]\n")) == ["[DONE]"]
    assert dec.close() == []  # nothing is dispatched twice


def test_u2028_inside_json_does_not_split():
    payload = json.dumps({"text": "a\u2028b\u2029c\x85d"}, ensure_ascii=False)
    events = decode(b"data: " + payload.encode() + b"\n\n")
    assert datas(events) == [payload]
    assert json.loads(events[0].data)["text"] == "a\u2028b\u2029c\x85d"


def test_leading_bom_dropped_once():
    assert decode(b"\xef\xbb\xbfdata: a\n\n") == [Event(data="a")]
    assert decode(b"\xef", b"\xbb", b"\xbfdata: a\n\n") == [Event(data="a")]
    # Only at the start of the stream: later it is part of a (unknown) field name.
    assert decode(b"data: a\n\n\xef\xbb\xbfdata: b\n\n") == [Event(data="a")]


def test_long_line_in_many_small_chunks():
    body = "x" * 50_000
    stream = f"data: {body}\n\n".encode()
    chunks = [stream[i : i + 7] for i in range(0, len(stream), 7)]
    assert datas(decode(*chunks)) == [body]


# -- any chunking gives the same events -----------------------------------------------

_lines = st.sampled_from([
    b"data: {\"a\": \"\xe5\x8d\x8e\xe7\x9b\x9b\"}", b"data: [DONE]", b"data:x", b"data",
    b": keep-alive", b"event: delta", b"id: 42", b"retry: 10", b"", b"data: \xe2\x80\xa8 \xf0\x9f\x8c\xa6",
])
_eols = st.sampled_from([b"\n", b"\r", b"\r\n"])
_streams = st.lists(st.tuples(_lines, _eols), max_size=30).map(lambda ls: b"".join(l + e for l, e in ls))


def _chunked(stream: bytes, cuts: list[int]) -> list[bytes]:
    points = sorted(c % (len(stream) + 1) for c in cuts)
    edges = [0, *points, len(stream)]
    return [stream[a:b] for a, b in zip(edges, edges[1:])]  # may hold empty chunks


@settings(max_examples=300, deadline=None)
@given(stream=_streams, cuts=st.lists(st.integers(min_value=0), max_size=20), tail=st.booleans())
def test_any_chunking_gives_the_same_events(stream, cuts, tail):
    if tail:  # also without a final line ending, for close()
        stream += b"data: tail"
    whole = decode(stream)
    assert decode(*_chunked(stream, cuts)) == whole
    assert bytewise(stream) == whole


@settings(max_examples=100, deadline=None)
@given(stream=_streams)
def test_line_endings_do_not_change_events(stream):
    # Normalizing every line ending to LF must not change the events.
    normalized = stream.replace(b"\r\n", b"\n").replace(b"\r", b"\n")
    assert decode(stream) == decode(normalized)


# -- data_only: the same events, for the streams it takes -----------------------------

@settings(max_examples=300, deadline=None)
@given(stream=_streams | st.tuples(
    st.lists(st.sampled_from([b": keep-alive\n\n", b":\n\n", b": x\ndata: a\n\n", b": x\n"]), max_size=3),
    st.lists(_lines.filter(lambda l: l.startswith(b"data: ")), max_size=30),
    st.integers(0, 12),  # cut short by that many bytes
).map(lambda parts: (b"".join(parts[0]) + b"".join(l + b"\n\n" for l in parts[1]))[:-parts[2] or None]))
def test_data_only_gives_what_the_decoder_gives_or_nothing(stream):
    payloads = data_only(stream)
    if payloads is not None:
        assert [Event(p.decode("utf-8", errors="replace")) for p in payloads] == decode(stream)


_names = st.sampled_from([b"content_block_delta", b"", b"ping", b"\xff\xfe", b"caf\xc3\xa9", b" spaced "])
_named_blocks = st.builds(lambda name, line: b"event: " + name + b"\n" + line + b"\n\n", _names,
                          _lines.filter(lambda l: l.startswith(b"data: ")))


_named_streams = st.tuples(st.lists(st.just(b": keep-alive\n\n"), max_size=2), st.lists(_named_blocks, max_size=20)).map(
    lambda parts: b"".join(parts[0]) + b"".join(parts[1]))
_not_named = st.sampled_from([b"data: a\n\n", b"event: a\n\n", b"event: a\ndata: b\n", b": x\nevent: a\ndata: b\n\n"])


@settings(max_examples=300, deadline=None)
@given(stream=_streams | _named_streams | st.tuples(_named_streams, _not_named, _named_streams).map(b"".join)
       | st.tuples(_named_streams, st.integers(1, 12)).map(lambda cut: cut[0][:-cut[1]]))
def test_named_events_give_what_the_decoder_gives_or_nothing(stream):
    events = named_events(stream)
    if events is not None:
        assert [Event(d.decode("utf-8", errors="replace"), n.decode("utf-8", errors="replace") or "message")
                for n, d in events] == decode(stream)


def test_named_events_take_only_streams_whose_every_event_is_named():
    assert named_events(b": ping\n\nevent: a\ndata: {}\n\nevent: \ndata: x\n\n") == [(b"a", b"{}"), (b"", b"x")]
    assert named_events(b"") == []
    # Cut short within the last data line: that event as far as it came.
    assert named_events(b"event: a\ndata: b\n") == named_events(b"event: a\ndata: b") == [(b"a", b"b")]
    for other in [b"event: a\ndata: b\n\ndata: c\n\n", b"event: a\ndata: b\n\nevent: c", b"event: a\ndat",
                  b"event: a\r\ndata: b\r\n\r\n", b"event: a\n\n", b"event: a\ndata: b\ndata: c\n\n",
                  b"event:a\ndata: b\n\n"]:
        assert named_events(other) is None, other


def test_data_only_takes_only_one_line_data_events_with_lf_ends():
    assert data_only(b'data: {"a":1}\n\ndata: [DONE]\n\n') == [b'{"a":1}', b"[DONE]"]
    assert data_only(b"data: \n\n") == [b""] and data_only(b"") == []
    assert data_only(b": keep-alive\n\n:\n\ndata: a\n\n") == [b"a"] and data_only(b": ping\n\n") == []
    # Cut short: the last event as far as it came, as the decoder's close() dispatches it.
    assert data_only(b"data: a\n\ndata: b") == data_only(b"data: a\n\ndata: b\n") == [b"a", b"b"]
    assert data_only(b"data: a\n\ndata: ") == [b"a", b""]
    for other in [b"data: a\n\ndat", b"data: a\n\ndata:", b"data: a\r\n\r\n", b": ping\ndata: a\n\n",
                  b"data:a\n\n", b"data: a\n\n: ping\n\n", b"event: x\ndata: a\n\n", b"data: a\ndata: b\n\n",
                  b"data: a\n\n\ndata: b\n\n", b"\xef\xbb\xbfdata: a\n\n", b"id: 1\ndata: a\n\n"]:
        assert data_only(other) is None, other
