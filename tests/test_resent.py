"""A resent history is read once (proxy/store/resent.py): a journaled body that starts
with most of an earlier one of its conversation says so, the writer reads it past the
shared bytes only, and parses only that."""

from __future__ import annotations

import base64
import json
import os
import pickle
import signal
import sqlite3
import struct
import time
import zlib
from pathlib import Path

import httpx
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from proxy.capture import TurnRecord
from proxy.store import content, resent, spool
from proxy.store import journal as journal_module
from proxy.store.db import open_database
from proxy.store.journal import JournalReader, frame_ends, segment_path, segments
from proxy.store.read import Reader
from proxy.store.requests import Requests
from proxy.store.resent import Spliced, shared_prefix
from proxy.store.writer import Writer
from tests.conftest import locked_sqlite
from tests.test_journal import _read_all, _write, alive, reply, serve, stored  # noqa: F401 (serve: a fixture)

SYSTEM = "You are a careful agent. " * 1200  # 30 KB, as Cline's system prompt


def conversation(turns: int, task: str = "fix the build") -> list[bytes]:
    """The bodies an agent sends: each resends the last one's messages and adds two."""
    messages = [{"role": "system", "content": SYSTEM}, {"role": "user", "content": task}]
    bodies = []
    for i in range(turns):
        bodies.append(json.dumps({"model": "m", "messages": messages, "stream": True,
                                  "tools": [{"type": "function", "function": {"name": "read_file"}}]}).encode())
        messages = messages + [{"role": "assistant", "content": f"step {i}: " + "reading files " * 40},
                               {"role": "user", "content": f"result {i}: " + "file contents " * 60}]
    return bodies


def record(i: int, body: bytes) -> TurnRecord:
    return TurnRecord(started_at=1_700_000_000 + i, method="POST", path=f"/chat/completions?n={i}",
                      upstream="http://up", request_headers=[["content-type", "application/json"]],
                      request_body=body, api="openai.chat", http_status=200,
                      raw=b'{"choices": [{"message": {"role": "assistant", "content": "ok"}}]}', raw_size=66,
                      response_headers=[["content-type", "application/json"]])


# -- the parts ----------------------------------------------------------------------------


@settings(max_examples=200, deadline=None)
@given(st.binary(max_size=300), st.binary(max_size=50), st.binary(max_size=50), st.booleans())
def test_shared_prefix_is_where_two_bodies_first_differ(common, a_rest, b_rest, by_hand):
    a, b = common + a_rest, common + b_rest
    want = len(os.path.commonprefix([a, b]))
    saved = resent._memcmp
    resent._memcmp = None if by_hand else saved  # libc's memcmp, and the fallback without it
    try:
        assert shared_prefix(a, b) == want == shared_prefix(b, a)
    finally:
        resent._memcmp = saved


@settings(max_examples=200, deadline=None)
@given(st.binary(min_size=1, max_size=200),
       st.lists(st.tuples(st.integers(0, 400), st.binary(max_size=60)), max_size=6), st.data())
def test_a_spliced_body_reads_as_the_bytes_it_stands_for(first, steps, data):
    body, plain = first, first
    for keep, rest in steps:  # each body: some of the last one, then bytes of its own
        keep = min(keep, len(plain))
        body, plain = Spliced(body, keep, rest), plain[:keep] + rest
    if not isinstance(body, Spliced):
        body = Spliced(body, len(plain), b"")
    assert len(body) == len(plain) and bytes(body) == plain
    start = data.draw(st.integers(0, len(plain)))
    assert body.slice(start) == plain[start:]
    stop = data.draw(st.integers(0, len(plain)))
    head = body.head(stop)
    assert bytes(head) == plain[:stop]
    assert head.begins(plain + b"more") and head.begins(plain[:stop])
    if stop:
        changed = bytearray(plain)
        changed[stop - 1] ^= 1
        assert not head.begins(bytes(changed))
    assert body.startswith(plain[:3])
    if plain:
        assert not body.begins(plain[:-1])


def test_a_base_shorter_than_what_it_is_said_to_share_is_refused():
    with pytest.raises(ValueError):
        Spliced(b"abc", 4, b"d")


# -- the journal --------------------------------------------------------------------------


@pytest.fixture
def bytes_read(monkeypatch):
    """Counts the bytes the journal's reader reads."""
    count = [0]
    real = os.pread

    def pread(fd, n, offset):
        data = real(fd, n, offset)
        count[0] += len(data)
        return data

    monkeypatch.setattr(journal_module.os, "pread", pread)
    return count


def test_a_resent_history_is_read_past_what_it_shares(tmp_path, bytes_read):
    bodies = conversation(40)
    journal = _write(tmp_path / "j", [record(i, b) for i, b in enumerate(bodies)], segment_bytes=8 << 20)
    bytes_read[0] = 0
    got = _read_all(journal.slot)
    assert [isinstance(r.body(), Spliced) for r in got] == [False] + [True] * 39
    assert [r.request_body for r in got] == bodies  # (joined into bytes when asked for as bytes)
    new_bytes = len(bodies[0]) + sum(len(b) - len(a) for a, b in zip(bodies, bodies[1:]))
    assert bytes_read[0] < new_bytes + 40 * 1000  # each turn's own bytes and its header, not 40 histories
    assert got[0].extends is None
    for before, r in zip(got, got[1:]):
        uid, shared = r.extends
        assert uid == before.uid and len(before.request_body) > shared >= len(before.request_body) - 300


def test_every_frame_stands_alone(tmp_path):
    """A reader that did not read the earlier bodies (a new writer, a shutdown's hand-over,
    a segment left after the ones before it were stored) reads a body whole."""
    bodies = conversation(12)
    journal = _write(tmp_path / "j", [record(i, b) for i, b in enumerate(bodies)], segment_bytes=100 << 10)
    numbers = [n for n in segments(journal.slot) if frame_ends(segment_path(journal.slot, n))]
    assert len(numbers) >= 3
    ends = frame_ends(segment_path(journal.slot, numbers[0]))
    reader = JournalReader(journal.slot, start=(numbers[0], ends[1]), sealed=True)
    got = reader.read(64 << 20)
    reader.close()
    assert [r.request_body for r in got] == bodies[2:]
    assert got[0].extends is None and all(r.extends for r in got[1:])
    for n in numbers[:2]:  # stored and trimmed
        os.remove(segment_path(journal.slot, n))
    got = _read_all(journal.slot)
    assert [r.request_body for r in got] == bodies[-len(got):] and 0 < len(got) < 10


@pytest.mark.parametrize("damage", ["raw", "lengths"])
def test_a_frame_damaged_past_the_shared_bytes_is_not_taken(tmp_path, damage):
    bodies = conversation(4)
    journal = _write(tmp_path / "j", [record(i, b) for i, b in enumerate(bodies)], segment_bytes=8 << 20)
    (number,) = [n for n in segments(journal.slot) if frame_ends(segment_path(journal.slot, n))]
    path = segment_path(journal.slot, number)
    ends = frame_ends(path)
    data = bytearray(Path(path).read_bytes())
    if damage == "raw":
        data[ends[2] - 40] ^= 0xFF  # in the third turn's raw response: never read whole
    else:  # a byte of its raw response counted as its body's: the lengths still add up
        body_len, raw_len = struct.unpack_from("<IQ", data, ends[1] + 12)
        struct.pack_into("<IQ", data, ends[1] + 12, body_len + 1, raw_len - 1)
    Path(path).write_bytes(bytes(data))
    reader = JournalReader(journal.slot)  # the proxy may still be writing it: wait
    assert [r.request_body for r in reader.read(64 << 20)] == bodies[:2]
    assert reader.read(64 << 20) == []
    reader.close()


def test_frames_of_the_earlier_format_are_read(tmp_path):
    """Turns a tooltap of before 2026-12-01 left in its journal (a crash, then an upgrade)."""
    slot = tmp_path / "j" / "0"
    slot.mkdir(parents=True)
    frames = b""
    for i, body in enumerate(conversation(3)):
        header = pickle.dumps({"started_at": 1.0 + i, "method": "POST", "path": f"/v1/chat/completions?n={i}",
                               "upstream": "http://up", "request_headers": [], "api": "openai.chat",
                               "uid": f"{i:032x}"}, protocol=5)
        raw = b'{"choices": []}'
        payload = struct.pack("<IIQ", len(header), len(body), len(raw)) + header + body + raw
        frames += struct.pack("<Q", len(payload)) + payload + struct.pack("<I", zlib.crc32(payload))
    (slot / f"{1:020d}.seg").write_bytes(frames + bytes(64))
    got = _read_all(str(slot))
    assert [r.request_body for r in got] == conversation(3) and [r.uid for r in got] == [f"{i:032x}" for i in range(3)]


def test_what_a_reader_remembers_is_bounded_by_what_it_keeps_alive():
    bodies = journal_module._Bodies(budget=1 << 20)
    tail = b"x" * 50_000  # sent after the messages on every turn (tools, a system prompt)
    for conversation_number in range(40):
        body, last = bytes(60_000) + tail, None
        for turn in range(10):
            uid = f"{conversation_number}-{turn}"
            bodies.keep(uid, body, last)
            body, last = Spliced(body, 60_000 + 4000 * turn, b"y" * 4000 + tail), uid
    kept = list(bodies._kept.values())
    assert bodies._bytes == sum(journal_module._held(b) for b in kept) <= 1 << 20
    assert all(journal_module._held(b) <= 2 * len(b) for b in kept)  # joined before a chain outweighs it
    assert len(kept) == len({k.split("-")[0] for k in bodies._kept})  # one per conversation: the last


def test_a_spooled_turn_does_not_carry_the_journals_hint(tmp_path):
    bodies = conversation(2)
    journal = _write(tmp_path / "j", [record(i, b) for i, b in enumerate(bodies)], segment_bytes=8 << 20)
    second = _read_all(journal.slot)[1]
    assert second.extends
    line = json.loads(spool.encode(second))
    assert "extends" not in line and base64.b64decode(line["request_body"]) == bodies[1]
    assert spool.decode(json.dumps(line)).request_body == bodies[1]


# -- the writer ---------------------------------------------------------------------------


def test_a_spliced_body_is_parsed_past_the_shared_part_without_comparing(monkeypatch):
    bodies = conversation(10)
    requests = Requests()
    requests.keep(requests.parse(bodies[0], "messages", "uid0"))
    monkeypatch.setattr(Requests, "_base", lambda self, body: pytest.fail("compared the bytes"))
    body: bytes | Spliced = bodies[0]
    for i, plain in enumerate(bodies[1:], 1):
        shared = shared_prefix(bytes(body), plain)
        body = Spliced(body, shared, plain[shared:])
        parsed = requests.parse(body, "messages", f"uid{i}", (f"uid{i - 1}", shared))
        assert parsed.value == content.parse_strict(plain)[0] and parsed.problem is None
        assert parsed.reused == 2 * i  # the messages of the turn before, the same objects
        requests.keep(parsed)


def test_a_journaled_conversation_is_stored_as_sent(tmp_path):
    bodies = conversation(25)
    journal = _write(tmp_path / "j", [record(i, b) for i, b in enumerate(bodies)], segment_bytes=200 << 10)
    url = f"sqlite:///{tmp_path / 'w.db'}"
    writer = Writer(url, spool_path=str(tmp_path / "spool"))
    writer.start()
    for r in _read_all(journal.slot):
        writer.submit(r)
    writer.flush()
    writer.close()
    assert writer.written == 25
    reader = Reader(open_database(url, create=False))
    turns = sorted(reader.turns(limit=100), key=lambda t: t["id"])
    assert len({t["session_id"] for t in turns}) == 1
    assert [t["parent_id"] for t in turns[1:]] == [t["id"] for t in turns[:-1]]
    for t, body in zip(turns, bodies):
        full = reader.turn(t["id"])
        assert full["request"] == json.loads(body) and not full["error"]
    with sqlite3.connect(tmp_path / "w.db") as conn:
        sizes = [n for (n,) in conn.execute("select request_size from turns order by id")]
    assert sizes == [len(b) for b in bodies]


def play_behind_a_stopped_writer(s, bodies: list[bytes]) -> int:
    """The first five turns stored; the writer process stopped (SIGSTOP) for the rest, which
    reach the journal only, each naming the one it extends. Returns the writer's pid."""
    with httpx.Client() as client:
        for i, body in enumerate(bodies):
            if i == 5:
                s.wait_stored(5)
                writer = s.health()["writer"]["pid"]
                os.kill(writer, signal.SIGSTOP)
            r = client.post(f"{s.url}/chat/completions?n={i}", content=body,
                            headers={"content-type": "application/json"}, timeout=10)
            assert r.status_code == 200
    time.sleep(0.5)  # past the journal's fsync interval
    return writer


def assert_stored_as_sent(db: Path, bodies: list[bytes]) -> None:
    """Every turn, in order, its request as sent, threaded as one session."""
    reader = Reader(open_database(f"sqlite:///{db}", create=False))
    turns = sorted(reader.turns(limit=1000), key=lambda t: t["id"])
    assert [int(t["path"].rsplit("n=", 1)[1]) for t in turns] == list(range(len(bodies)))
    assert len({t["session_id"] for t in turns}) == 1
    assert [t["parent_id"] for t in turns[1:]] == [t["id"] for t in turns[:-1]]
    for t, body in zip(turns, bodies):
        full = reader.turn(t["id"])
        assert full["request"] == json.loads(body) and not full["error"]


def test_a_growing_session_left_in_the_journal_by_a_kill_is_stored_as_sent(tmp_path, upstream, serve):
    upstream.routes["/chat/completions"] = reply()
    db = tmp_path / "g.db"
    first = serve(db)
    bodies = conversation(30, task="make the tests pass")
    writer = play_behind_a_stopped_writer(first, bodies)
    first.proc.kill()
    first.proc.wait(5)
    os.kill(writer, signal.SIGCONT)
    deadline = time.monotonic() + 8
    while alive(writer):  # the orphaned writer goes
        assert time.monotonic() < deadline
        time.sleep(0.05)

    second = serve(db)  # reads the journal from its start: the first bodies whole
    second.wait_stored(30)
    second.stop()
    assert_stored_as_sent(db, bodies)


def test_a_growing_session_handed_to_the_spool_at_a_stop_is_stored_as_sent(tmp_path, upstream, serve):
    """A stop while the database is locked: the turns the writer could not store go to the
    spool whole (the hand-over reads the journal from the oldest unstored turn)."""
    upstream.routes["/chat/completions"] = reply()
    db = tmp_path / "h.db"
    first = serve(db, args=("--shutdown-grace", "3"))
    bodies = conversation(20, task="rename the module")
    writer = play_behind_a_stopped_writer(first, bodies)
    with locked_sqlite(db):
        os.kill(writer, signal.SIGCONT)
        assert first.stop() == 0
        assert stored(db)[0] == 5
    assert "spooled 15 turn(s) the writer did not confirm" in first.log() and "Traceback" not in first.log()
    second = serve(db)
    second.wait_stored(20)
    second.stop()
    assert_stored_as_sent(db, bodies)
