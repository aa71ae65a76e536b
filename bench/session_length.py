"""The writer's own CPU per turn by turn number, in one process.

    python bench/session_length.py [--runs 5] [--sessions 10] [--turns 200]

bench/writer.py measures the whole writer (journal, process, batches) from outside, the
bench itself sharing the machine with it. This one times, with time.thread_time, what
the writer process does with a turn: read it from the journal (`JournalReader.read`)
and store it (`Writer._commit`: parse, assemble, place, store, decode; then
`_settle_memory`, as the writer process does), on a SQLite file. The turns are captured
as the hot path captures them and written by a real `Journal` first (the proxy's part,
not timed):
`--sessions` sessions of the bench/writer.py template, one turn of each per round,
bodies growing to ~1.3 MB at turn 200. Medians over `--runs` runs, per band of rounds:
the journal's read, the batch, and the two together. `--restart 20` is the control:
the same number of turns stored, the sessions started over every 20 turns, so what
still grows from the first band to the last grows with the database, not the session.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

from common import REPO, length_bands, table

sys.path.insert(0, str(REPO))
PARTS = (lambda t: t[0], lambda t: t[1], lambda t: t[0] + t[1])  # of a turn's (read, store) ms


def one_run(sessions: int, turns: int, restart: int = 0) -> list[tuple[float, float]]:
    """(ms of CPU reading, ms storing) per turn, for each round of turns. With `restart`,
    every session starts over as a new one every `restart` turns."""
    from proxy import malloc
    from proxy.store.db import migrate
    from proxy.store.journal import Journal, JournalReader
    from proxy.store.writer import Writer
    from storage import RESPONSE_EVENTS
    from upstream import chat_stream
    from writer import answer, bodies_of, capture, template

    malloc.keep_large_buffers()  # as in the writer process
    with tempfile.TemporaryDirectory() as folder:
        writer = Writer(f"sqlite:///{Path(folder) / 'length.db'}", str(Path(folder) / "spool.jsonl"))
        migrate(writer.engine)
        journal = Journal(str(Path(folder) / "journal"))
        journal.start()
        reader = JournalReader(journal.slot)
        events = chat_stream(RESPONSE_EVENTS, 200)
        length = restart or turns
        tpl = template(length)
        out = []
        for t in range(turns):
            if t % length == 0:  # new sessions, each with its own task text
                bodies = [bodies_of(tpl, 900_000 + 1000 * (t // length) + k) for k in range(sessions)]
            for b in bodies:
                journal.submit(capture(b[t % length], answer(events, t % length)))
            journal.mark()
            start = time.thread_time()
            records = reader.read(1 << 40)
            read = time.thread_time()
            writer._commit(records)  # one batch, as the writer's thread commits it
            writer._settle_memory()  # and then, in the writer process, hides what it keeps from the collector
            stored = time.thread_time()
            reader.confirm(records)
            out.append(((read - start) / len(records) * 1e3, (stored - read) / len(records) * 1e3))
        reader.close()
        journal.close()
        journal.release()
        writer.engine.dispose()
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--sessions", type=int, default=10)
    ap.add_argument("--turns", type=int, default=200)
    ap.add_argument("--restart", type=int, default=0,
                    help="a control: start the sessions over every N turns (the database grows "
                         "as it does in a full run, no session passes N turns)")
    a = ap.parse_args()
    bands = length_bands(a.turns)
    runs = []
    for n in range(a.runs):
        per_turn = one_run(a.sessions, a.turns, a.restart)
        # Per band: the median turn's read, store, and the two together.
        runs.append([[statistics.median(part(x) for x in per_turn[lo:hi]) for part in PARTS] for lo, hi in bands])
        print(f"run {n + 1}: read + store " + " / ".join(f"{band[2]:.2f}" for band in runs[-1]) + " ms", flush=True)
    medians = [[statistics.median(r[i][k] for r in runs) for k in range(len(PARTS))] for i in range(len(bands))]
    first = medians[0][2]
    rows = [[f"{lo + 1}-{hi}", *(f"{v:.2f}" for v in band), f"{band[2] / first:.2f}x"]
            for (lo, hi), band in zip(bands, medians)]
    print()
    print(table(rows, ["rounds" if a.restart else "turns", "journal read", "batch", "writer CPU ms/turn",
                       "vs the first band"]))
    print("(medians of runs of each band's median turn)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
