"""The writer's own CPU per turn by turn number, without the journal or a second process.

    python bench/session_length.py [--runs 5] [--sessions 10] [--turns 200]

bench/writer.py measures the whole writer (journal, process, batches) by /proc's 10 ms
ticks, which at 10 turns a round is a resolution of 1 ms a turn on a noisy machine.
This one times the part whose cost may grow with a session, the writer's batch itself
(`Writer._commit`: parse, assemble, place, store, decode), with time.process_time in
this process, on a SQLite file: `--sessions` sessions of the bench/writer.py template,
one turn of each per batch, bodies growing to ~1.3 MB at turn 200. Medians over
`--runs` runs, per band of turn numbers.
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


def one_run(sessions: int, turns: int) -> list[float]:
    """ms of CPU per turn, for each turn number."""
    from proxy import malloc
    from proxy.store.db import migrate
    from proxy.store.writer import Writer
    from storage import RESPONSE_EVENTS
    from upstream import chat_stream
    from writer import answer, bodies_of, capture, template

    malloc.keep_large_buffers()  # as in the writer process
    with tempfile.TemporaryDirectory() as folder:
        writer = Writer(f"sqlite:///{Path(folder) / 'length.db'}", str(Path(folder) / "spool.jsonl"))
        migrate(writer.engine)
        events = chat_stream(RESPONSE_EVENTS, 200)
        tpl = template(turns)
        bodies = [bodies_of(tpl, 900_000 + k) for k in range(sessions)]
        out = []
        for t in range(turns):
            records = [capture(b[t], answer(events, t)) for b in bodies]
            start = time.process_time()
            writer._commit(records)  # one batch, as the writer's thread commits it
            out.append((time.process_time() - start) / len(records) * 1e3)
        writer.engine.dispose()
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--sessions", type=int, default=10)
    ap.add_argument("--turns", type=int, default=200)
    a = ap.parse_args()
    bands = length_bands(a.turns)
    runs = []
    for n in range(a.runs):
        per_turn = one_run(a.sessions, a.turns)
        runs.append([statistics.median(per_turn[lo:hi]) for lo, hi in bands])
        print(f"run {n + 1}: " + " / ".join(f"{v:.2f}" for v in runs[-1]) + " ms", flush=True)
    medians = [statistics.median(r[i] for r in runs) for i in range(len(bands))]
    print()
    print(table([[f"{lo + 1}-{hi}", f"{m:.2f}", f"{m / medians[0]:.2f}x"] for (lo, hi), m in zip(bands, medians)],
                ["turns", "writer CPU ms/turn, median of runs", "vs the first band"]))
    return 0


if __name__ == "__main__":
    sys.exit(main())
