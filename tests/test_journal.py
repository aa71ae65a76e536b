"""The journal: a SIGKILL of tooltap loses no answered turn and duplicates none; an orphaned
writer exits; a torn segment, a slot left by a dead instance, a turn read twice."""

from __future__ import annotations

import json
import os
import signal
import sqlite3
import subprocess
import sys
import threading
import time
from pathlib import Path

import httpx
import pytest

from proxy.capture import TurnRecord
from proxy.scripted import Reply
from proxy.store.journal import (GATHER_SECONDS, Journal, JournaledTurn, JournalReader, frame_ends,
                                 segment_path, segments)
from proxy.store.writer import Writer
from tests.conftest import free_port


def reply(text="ok"):
    return Reply.json({"id": "r", "object": "chat.completion", "model": "m",
                       "choices": [{"index": 0, "message": {"role": "assistant", "content": text},
                                    "finish_reason": "stop"}]})


class Serve:
    """A real `tooltap serve` process; each turn is numbered in its query string (kept in
    turns.path), so the database says which answered turns it holds."""

    def __init__(self, upstream_url: str, db: Path, env: dict | None = None, args: tuple = ()):
        self.db, self.port = db, free_port()
        self._clients = threading.local()
        self.log_path = db.parent / f"serve-{self.port}.log"
        log = open(self.log_path, "wb")
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "proxy", "serve", "--upstream", upstream_url, "--db", str(db),
             "--port", str(self.port), *args],
            stdout=log, stderr=subprocess.STDOUT, env={**os.environ, **(env or {})})
        deadline = time.monotonic() + 60  # a busy machine: imports take seconds
        while True:
            try:
                self.health()
                break
            except httpx.TransportError:
                assert time.monotonic() < deadline and self.proc.poll() is None, self.log()
                time.sleep(0.05)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")

    def health(self) -> dict:
        r = httpx.get(f"{self.url}/_tooltap/api/health", timeout=5)
        r.raise_for_status()
        return r.json()

    def post(self, n: int, content: str = "hi", timeout: float = 10) -> httpx.Response:
        client = getattr(self._clients, "client", None)
        if client is None:  # one per thread: a new client costs more than the request
            client = self._clients.client = httpx.Client()
        return client.post(f"{self.url}/chat/completions?n={n}", timeout=timeout,
                           json={"model": "m", "messages": [{"role": "user", "content": f"{content} {n}"}]})

    def wait_stored(self, count: int, timeout: float = 15) -> None:
        deadline = time.monotonic() + timeout
        while stored(self.db)[0] < count or self.health()["writer"]["backlog"]:
            assert time.monotonic() < deadline, (stored(self.db), self.health())
            time.sleep(0.1)

    def stop(self, sig=signal.SIGTERM) -> int:
        self.proc.send_signal(sig)
        return self.proc.wait(20)


@pytest.fixture
def serve(upstream):
    """Start `tooltap serve` processes against the scripted upstream; none outlives the test."""
    started: list[Serve] = []

    def start(db: Path, env: dict | None = None, args: tuple = ()) -> Serve:
        started.append(Serve(upstream.url, db, env, args))
        return started[-1]

    yield start
    for s in started:
        if s.proc.poll() is None:
            s.proc.kill()
            s.proc.wait(10)


def stored(db: Path) -> tuple[int, list[int]]:
    """(rows, the turn numbers stored)."""
    with sqlite3.connect(db, timeout=10) as conn:
        paths = [p for (p,) in conn.execute("select path from turns")]
    return len(paths), sorted(int(p.rsplit("n=", 1)[1]) for p in paths if "n=" in p)


def alive(pid: int) -> bool:
    """Running: a zombie nobody reaped has exited."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except FileNotFoundError:
        return False
    return state != "Z"


def test_sigkill_loses_no_answered_turn_and_stores_none_twice(tmp_path, upstream, serve):
    """The writer is stopped (far behind), agents keep sending, the main process is killed.
    Every turn answered more than the fsync interval before the kill is stored after a
    restart, once; the orphaned writer exits; a second restart adds nothing."""
    upstream.routes["/chat/completions"] = reply()
    db = tmp_path / "t.db"
    first = serve(db, env={"TOOLTAP_FSYNC_MS": "200"})
    for n in range(10):
        assert first.post(n).status_code == 200
    first.wait_stored(10)  # these are committed, and still in the journal's open segment
    writer = first.health()["writer"]["pid"]
    os.kill(writer, signal.SIGSTOP)  # what follows reaches the journal only

    answered: dict[int, float] = {}
    sent: set[int] = set()
    numbers = iter(range(10, 100_000))
    lock, stop = threading.Lock(), threading.Event()

    def agent():
        while not stop.is_set():
            with lock:
                n = next(numbers)
                sent.add(n)
            try:
                if first.post(n, timeout=5).status_code == 200:
                    answered[n] = time.monotonic()
            except httpx.TransportError:
                return

    agents = [threading.Thread(target=agent) for _ in range(4)]
    for a in agents:
        a.start()
    time.sleep(1.5)
    killed_at = time.monotonic()
    first.proc.kill()  # SIGKILL, under load
    first.proc.wait(5)
    stop.set()
    for a in agents:
        a.join(10)
    os.kill(writer, signal.SIGCONT)
    deadline = time.monotonic() + 8
    while alive(writer):
        assert time.monotonic() < deadline, "the orphaned writer is still running"
        time.sleep(0.05)

    settled = [n for n, at in answered.items() if at < killed_at - 0.2]
    assert len(settled) > 100  # a real load reached the journal only
    assert stored(db)[0] == 10  # before the restart: the rest is nowhere but in the journal

    second = serve(db)
    second.wait_stored(10 + len(settled))
    rows, numbers_stored = stored(db)
    assert rows == len(set(numbers_stored))  # none twice
    assert set(range(10)) | set(settled) <= set(numbers_stored) <= set(range(10)) | sent
    assert "skipped 10 turn(s) already stored" in second.log()  # the journal held them too
    assert second.stop() in (0, -signal.SIGTERM)

    third = serve(db)
    third.wait_stored(rows)
    assert stored(db) == (rows, numbers_stored)
    third.stop()


def one_turn_stored(upstream, serve, db: Path):
    """tooltap on `db` with one turn stored: (the server, its writer process's pid)."""
    upstream.routes["/chat/completions"] = reply()
    s = serve(db)
    s.post(0)
    s.wait_stored(1)
    return s, s.health()["writer"]["pid"]


def test_orphaned_writer_exits_when_the_main_process_dies(tmp_path, upstream, serve):
    s, writer = one_turn_stored(upstream, serve, tmp_path / "o.db")
    assert alive(writer)
    s.proc.kill()
    s.proc.wait(5)
    deadline = time.monotonic() + 5
    while alive(writer):
        assert time.monotonic() < deadline, "the writer outlived its proxy"
        time.sleep(0.05)


# -- the journal itself ----------------------------------------------------------------


def _record(i: int, raw: bytes | str = b'{"choices": []}') -> TurnRecord:
    body = json.dumps({"model": "m", "messages": [{"role": "user", "content": f"turn {i}"}]}).encode()
    return TurnRecord(started_at=1_700_000_000 + i, method="POST", path=f"/chat/completions?n={i}",
                      upstream="http://up", request_headers=[], request_body=body, api="openai.chat",
                      http_status=200, raw=raw, raw_size=15,
                      response_headers=[["content-type", "application/json"]])


def _write(root: Path, records: list[TurnRecord], segment_bytes: int = 1 << 16) -> Journal:
    """A journal that takes `records`, then stops as a killed tooltap would: without
    handing anything over."""
    journal = Journal(str(root), fsync_seconds=0.01, segment_bytes=segment_bytes)
    journal.start()
    for r in records:
        journal.submit(r)
    journal.mark()
    journal.close()
    journal.release()
    return journal


def _read_all(slot: str) -> list[JournaledTurn]:
    reader = JournalReader(slot, sealed=True)
    out = []
    while batch := reader.read(1 << 20):
        out += batch
    reader.close()
    return out


@pytest.mark.parametrize("damage", ["tail", "lengths"])
def test_a_torn_turn_ends_its_segment_and_the_turns_before_it_are_read(tmp_path, damage):
    journal = _write(tmp_path / "j", [_record(i) for i in range(3)])
    (number,) = [n for n in segments(journal.slot) if os.path.getsize(segment_path(journal.slot, n)) and
                 open(segment_path(journal.slot, n), "rb").read(4) != b"\0\0\0\0"]
    path = segment_path(journal.slot, number)
    data = bytearray(open(path, "rb").read())
    start, end = frame_ends(path)[-2], journal.end()[1]
    if damage == "tail":
        data[end - 6:end] = b"\xff" * 6  # the last turn's tail never reached the disk
    else:  # its part lengths no longer add up to its length: nothing is read past them
        data[start + 12:start + 16] = b"\xff" * 4
    Path(path).write_bytes(bytes(data))
    again = Journal(str(tmp_path / "j"))
    again.start()  # a new segment: the torn one is sealed
    got = _read_all(again.slot)
    assert [r.path for r in got] == ["/chat/completions?n=0", "/chat/completions?n=1"]
    assert [r.request_body for r in got] == [_record(i).request_body for i in (0, 1)]
    assert len({r.uid for r in got}) == 2 and all(len(r.uid) == 32 for r in got)
    again.close()
    again.release()


def test_a_raw_response_in_a_temporary_file_is_copied_into_the_journal(tmp_path):
    raw = tmp_path / "tooltap-raw-x"
    raw.write_bytes(b"data: " + b"x" * 300_000 + b"\n\n")
    journal = _write(tmp_path / "j", [_record(0, raw=str(raw))])
    assert not raw.exists()  # released once it is in the journal
    (got,) = _read_all(journal.slot)
    assert got.raw == b"data: " + b"x" * 300_000 + b"\n\n"


def test_under_load_turns_are_written_in_batches_and_one_after_a_quiet_spell_alone(tmp_path, monkeypatch):
    """Waking the journal's thread for every turn costs the event loop more than handing
    the turn over; under load the thread gathers turns instead. One after a quiet spell
    is written as it comes."""
    batches = []
    journal = Journal(str(tmp_path / "j"), fsync_seconds=0.01)
    write_held = journal._write_held
    monkeypatch.setattr(journal, "_write_held", lambda force=False: (batches.append(len(journal._held)),
                                                                      write_held(force)))
    journal.start()
    began = time.monotonic()
    for i in range(60):  # 60 turns over ~30 ms
        journal.submit(_record(i))
        time.sleep(0.0005)
    windows = (time.monotonic() - began) / GATHER_SECONDS  # however slow the machine
    journal.mark()
    written = [n for n in batches if n]
    assert sum(written) == 60 and len(written) <= windows + 2, (written, windows)
    time.sleep(0.05)
    before = len(batches)
    began = time.monotonic()
    journal.submit(_record(60))
    while not any(batches[before:]) and time.monotonic() - began < 1:
        time.sleep(0.0002)
    assert [n for n in batches[before:] if n] == [1]  # (a wake-up to fsync writes nothing)
    journal.close()
    journal.release()
    assert len(_read_all(journal.slot)) == 61


def test_a_slot_left_by_a_dead_instance_is_taken_over(tmp_path):
    root = tmp_path / "j"
    a = Journal(str(root), segment_bytes=1 << 16)
    a.start()
    b = Journal(str(root), segment_bytes=1 << 16)
    b.start()  # a second instance on the same path: a slot of its own
    assert a.slot != b.slot
    for journal, i in ((a, 0), (b, 1)):
        journal.submit(_record(i))
        journal.mark()
        journal.close()
        journal.release()  # both die without handing over
    c = Journal(str(root))
    c.start()
    assert c.slot == a.slot
    assert sorted(r.path for r in _read_all(c.slot)) == ["/chat/completions?n=0", "/chat/completions?n=1"]
    assert not segments(b.slot)
    c.close()
    c.release()


def test_a_turn_read_again_is_stored_once(tmp_path):
    """The same journaled turn in two batches and twice in one batch: one row."""
    journal = _write(tmp_path / "j", [_record(0), _record(1)])
    first, second = _read_all(journal.slot)
    writer = Writer(f"sqlite:///{tmp_path / 'w.db'}", spool_path=str(tmp_path / "spool"))
    writer.start()
    writer.submit(first)
    writer.flush()
    for r in (first, second, second):
        writer.submit(r)
    writer.flush()
    writer.close()
    assert writer.written == 2 and writer.duplicates == 2
    with sqlite3.connect(tmp_path / "w.db") as conn:
        rows = conn.execute("select uid, path from turns order by id").fetchall()
    assert rows == [(first.uid, first.path), (second.uid, second.path)]
