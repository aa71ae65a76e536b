"""How many turns a second the writer stores, and whether that holds as sessions grow
longer and the database bigger.

    python bench/writer.py [--db URL] [--stored 100000] [--sessions 20] [--long-turns 200]

The turns are the bench/storage.py session (Cline-sized: a ~30 KB system prompt and 8 KB
of tools on every request, the history growing from 41 KB to 335 KB over 50 turns), as
`--sessions` agents working at once, each on its own task (session k's bodies are the
template's with its task text changed, so every session has its own messages and
chain). Each turn is captured with proxy.capture.Capture as the hot path does and
handed to the real writer, proxy.store.process.WriterProcess: the journal on disk, the
writer process, its batches. No proxy runs: this measures the writer alone.

1. Sustained: turns are submitted as fast as the writer takes them (at most `--ahead`
   waiting), until `--stored` turns are in the database; the rate is reported per band
   of turns stored, with the writer process's CPU time per turn (/proc): at 100,000
   stored turns the rate must still be the rate at the start.
2. Session length: then `--long-sessions` sessions of `--long-turns` turns (bodies grow
   to ~1.3 MB at 200 turns), one turn of each session at a time; ms per turn by turn
   number shows whether a turn costs more when its session is longer.

`--one-shot` makes every turn a conversation of its own (bench/client.py's small chat
request, as bench/overhead.py and one-shot callers send): the writer then remembers
thousands of short conversations, and must not look through them all for each turn.

The writer runs at the proxy's priority here (TOOLTAP_WRITER_NICE=0; tooltap's default
is 10, so that under a saturating load the agents' traffic goes first): on a shared
machine a reniced writer measures the other processes, not tooltap.

Give an empty database with --db (SQLite by default, in a temporary folder; for
Postgres: postgresql+psycopg://USER:PASSWORD@HOST/DB, empty). Target (issue 10): at
least 500 turns/s sustained, flat in session length and database size.
"""

from __future__ import annotations

import argparse
import os
import signal
import subprocess
import sys
import tempfile
import threading
import time
from functools import lru_cache
from pathlib import Path

from common import REPO, captured, machine, median, py_spy, table, thread_cpu_seconds, write_results

sys.path.insert(0, str(REPO))
TARGET = 500.0


def template(turns: int) -> list[bytes]:
    from storage import session_bodies

    return session_bodies(turns, 30, 8)


def bodies_of(template_bodies: list[bytes], k: int) -> list[bytes]:
    """Session k: the template with its own task text (so its own messages and chain)."""
    mark = f"<task>\\nsession {k:06d} ".encode()
    return [b.replace(b"<task>\\n", mark, 1) for b in template_bodies]


@lru_cache(maxsize=1024)
def answer(events: tuple[bytes, ...], t: int) -> tuple[bytes, ...]:
    """The response to turn t, its tool call named as the next request's history names it
    (storage.py's `call_{t:04d}`), so results pair as a real agent's do."""
    return tuple(e.replace(b'"call_bench"', f'"call_{t:04d}"'.encode()) for e in events)


def capture(body: bytes, events) -> object:
    from storage import PATH

    return captured(body, events, PATH)


class Run:
    """A WriterProcess and the counts to pace it by."""

    def __init__(self, db_url: str, folder: Path, writers: int):
        from proxy.store.process import WriterProcess
        from proxy.store.shards import Writers

        spool = str(folder / "spool.jsonl")
        self.writer = Writers(db_url, spool, writers) if writers > 1 else WriterProcess(db_url, spool_path=spool)
        self.writer.start()
        self.processes = getattr(self.writer, "shards", [self.writer])
        self.submitted = 0

    @property
    def pid(self) -> int:
        """The first writer process (for py-spy)."""
        return self.processes[0]._process.pid

    def cpu(self) -> float:
        """CPU seconds of every writer process."""
        return sum(thread_cpu_seconds(p._process.pid) for p in self.processes)

    def submit(self, record, ahead: int) -> None:
        while self.submitted - self.writer.written >= ahead:
            time.sleep(0.005)
        self.writer.submit(record)
        self.submitted += 1

    def drain(self) -> None:
        self.writer.flush(600)

    def close(self) -> None:
        self.writer.close(60)


def one_shot_sessions(count: int, turns: int) -> list[list[bytes]]:
    """`count` x `turns` requests, each a conversation of its own (bench/client.py's small
    chat request, as bench/overhead.py sends): the writer remembers thousands of them."""
    from client import request_bytes

    return [[request_bytes("bench", 0, "/v1/chat/completions").partition(b"\r\n\r\n")[2] for _ in range(turns)]
            for _ in range(count)]


def sustained(run: Run, a, events) -> list[dict]:
    """Sessions of the storage.py template (or one-shot requests), `a.sessions` at a time,
    until `a.stored` turns."""
    tpl = None if a.one_shot else template(a.turns)
    per_group = a.sessions * a.turns
    groups = -(-a.stored // per_group)
    marks: list[tuple[float, int, float]] = []  # (time, written, writer cpu seconds)
    stop = threading.Event()

    def sample() -> None:
        while not stop.is_set():
            marks.append((time.perf_counter(), run.writer.written, run.cpu()))
            stop.wait(0.5)

    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    t0 = time.perf_counter()
    for g in range(groups):
        sessions = (one_shot_sessions(a.sessions, a.turns) if a.one_shot else
                    [bodies_of(tpl, g * a.sessions + k) for k in range(a.sessions)])
        for t in range(a.turns):  # agents interleave: one turn of each, then the next
            for s in sessions:
                run.submit(capture(s[t], answer(events, t)), a.ahead)
        done = min(a.stored, (g + 1) * per_group)
        print(f"\r  {run.writer.written:,} stored, {run.submitted:,} submitted, "
              f"{run.writer.written / (time.perf_counter() - t0):.0f} turns/s overall", end="", flush=True)
        if done >= a.stored:
            break
    run.drain()
    stop.set()
    sampler.join()
    marks.append((time.perf_counter(), run.writer.written, run.cpu()))
    print()
    bands = []
    edges = list(range(0, a.stored + 1, a.band))
    for lo, hi in zip(edges, edges[1:]):
        inside = [m for m in marks if lo <= m[1] <= hi]
        if len(inside) < 2:
            continue
        (ta, na, ca), (tb, nb, cb) = inside[0], inside[-1]
        if nb - na < a.band // 2:
            continue
        bands.append({"from": lo, "to": hi, "turns_per_s": (nb - na) / (tb - ta),
                      "writer_cpu_ms_per_turn": (cb - ca) / (nb - na) * 1e3})
    return bands


def long_sessions(run: Run, a, events) -> tuple[list[float], list[float]]:
    """ms per turn (wall, and the writer process's CPU), by turn number, for
    `a.long_sessions` sessions of `a.long_turns` turns. The wall time includes the
    journal's fsync of every request body (1.3 MB at turn 200): disk, not the writer."""
    tpl = template(a.long_turns)
    sessions = [bodies_of(tpl, 900_000 + k) for k in range(a.long_sessions)]
    wall, cpu = [], []
    for t in range(a.long_turns if sessions else 0):
        records = [capture(s[t], answer(events, t)) for s in sessions]
        t0, c0 = time.perf_counter(), run.cpu()
        for r in records:
            run.submit(r, 10**9)
        run.drain()
        wall.append((time.perf_counter() - t0) / len(records) * 1e3)
        cpu.append((run.cpu() - c0) / len(records) * 1e3)
    return wall, cpu


def count_turns(db_url: str) -> int:
    from sqlalchemy import text

    from proxy.store.db import open_database

    engine = open_database(db_url)
    try:
        with engine.connect() as c:
            return c.execute(text("select count(*) from turns")).scalar()
    finally:
        engine.dispose()


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--db", help="an empty database (default: SQLite in a temporary folder)")
    ap.add_argument("--stored", type=int, default=100_000, help="turns to store in the sustained phase")
    ap.add_argument("--sessions", type=int, default=20, help="agents at once")
    ap.add_argument("--turns", type=int, default=50, help="turns per session (the storage.py session)")
    ap.add_argument("--band", type=int, default=10_000, help="turns per reported band")
    ap.add_argument("--ahead", type=int, default=2000, help="turns submitted but not yet stored, at most")
    ap.add_argument("--writers", type=int, default=1, help="writer processes (serve --writers)")
    ap.add_argument("--one-shot", action="store_true",
                    help="every turn a conversation of its own (a small chat request), not a storage.py session")
    ap.add_argument("--long-sessions", type=int, default=10)
    ap.add_argument("--long-turns", type=int, default=200)
    ap.add_argument("--profile", metavar="FILE",
                    help="record the writer process with py-spy during the sustained phase (collapsed stacks; "
                         "summarize with bench/pyspy_top.py)")
    a = ap.parse_args()
    os.environ.setdefault("TOOLTAP_WRITER_NICE", "0")

    from upstream import chat_stream
    from storage import RESPONSE_EVENTS

    events = chat_stream(RESPONSE_EVENTS, 200)
    with tempfile.TemporaryDirectory(prefix="tooltap-bench-writer-") as tmp:
        db_url = a.db or f"sqlite:///{Path(tmp) / 'writer.db'}"
        if count_turns(db_url):
            print(f"{db_url.split('@')[-1]} holds turns already: give an empty database", file=sys.stderr)
            return 2
        shape = "one-shot requests" if a.one_shot else f"{a.sessions} sessions at once x {a.turns} turns"
        print(f"writer: {db_url.split('://')[0]}, {a.writers} writer process(es), {shape}, "
              f"until {a.stored:,} turns are stored", flush=True)
        run = Run(db_url, Path(tmp), a.writers)
        spy = None
        if a.profile:
            spy = subprocess.Popen([py_spy(), "record", "--pid", str(run.pid),
                                    "--format", "raw", "--rate", "200", "--output", a.profile],
                                   stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        try:
            bands = sustained(run, a, events)
            if spy is not None:
                spy.send_signal(signal.SIGINT)
                spy.wait(30)
            print(f"session length: {a.long_sessions} sessions x {a.long_turns} turns ...", flush=True)
            per_turn, per_turn_cpu = long_sessions(run, a, events)
        finally:
            run.close()
        stored = count_turns(db_url)

    results = {"machine": machine(), "params": vars(a), "db": db_url.split("://")[0], "stored": stored,
               "bands": bands, "long_ms_per_turn": [round(x, 3) for x in per_turn],
               "long_writer_cpu_ms_per_turn": [round(x, 3) for x in per_turn_cpu]}
    print(f"\n== Sustained: turns/s by turns already stored ({results['db']}) ==")
    print(table([[f"{b['from']:,}-{b['to']:,}", f"{b['turns_per_s']:.0f}", f"{b['writer_cpu_ms_per_turn']:.2f}"]
                 for b in bands], ["stored", "turns/s", "writer CPU ms/turn"]))
    k = max(1, len(per_turn) // 10)
    starts = (0, len(per_turn) // 2 - k // 2, len(per_turn) - k) if per_turn else ()
    print(f"\n== Session length: ms per turn by turn number ({a.long_sessions} sessions, flushed each round) ==")
    print(table([[f"{i + 1}-{i + k}", f"{median(per_turn[i:i + k]):.2f}", f"{median(per_turn_cpu[i:i + k]):.2f}"]
                 for i in starts], ["turns", "ms/turn (wall, with the journal's fsync)", "writer CPU ms/turn"]))
    if not bands:  # --stored 0: the session-length part alone
        out = write_results("writer", results)
        print(f"\nno sustained part, no target checked\nresults: {out}")
        return 0
    first, last = bands[0]["turns_per_s"], bands[-1]["turns_per_s"]
    results["turns_per_s_first"], results["turns_per_s_last"] = first, last
    results["target_met"] = min(first, last) >= TARGET
    print(f"\n== Target ==\nsustained turns/s, first band {first:.0f}, last band {last:.0f} (>= {TARGET:.0f})  "
          f"{'MET' if results['target_met'] else 'NOT MET'}")
    out = write_results("writer", results)
    print(f"\nresults: {out}")
    return 0 if results["target_met"] else 1


if __name__ == "__main__":
    sys.exit(main())
