"""What tooltap adds to a request as an agent's session grows.

    python bench/request_size.py [--sessions 3] [--turns 200]

An agent resends its whole history, so its request bodies grow turn by turn: the
bench/storage.py session (Cline-sized: a 30 KB system prompt, 8 KB of tools, each turn
adding 4-8 KB) goes from 41 KB at turn 1 to about 1.3 MB at turn 200. Three processes
as in overhead.py: bench/upstream.py, `tooltap serve` on SQLite, and this client (one
keep-alive connection per path). `--sessions` such sessions (each with its own task
text, as in writer.py) are played turn by turn, one turn of each in turn; every request
goes once straight to the upstream and once through tooltap, back to back, the order
alternating. Reported per band of turn numbers: the body size and the median time to
first byte and total time of each path, and what tooltap adds. Each turn through
tooltap is stored as it would be (the writer runs meanwhile, at its usual lower
priority), and the stored session is checked to have every turn.
"""

from __future__ import annotations

import argparse
import asyncio
import sqlite3
import sys
import tempfile
from pathlib import Path

from client import Conn, check
from common import (free_port, length_bands, machine, median, start_tooltap, start_upstream, stop, table,
                    write_results)
from storage import PATH, RESPONSE_EVENTS, session_bodies
from upstream import chat_stream
from writer import bodies_of


async def play(ports: dict[str, int], sessions: list[list[bytes]], expect: int) -> dict[str, list[list[float]]]:
    """{path: [[ttfb, total] per request]} in the order played: turn by turn, session by session."""
    conns = {name: await Conn("127.0.0.1", port).open() for name, port in ports.items()}
    out: dict[str, list[list[float]]] = {name: [] for name in ports}
    try:
        for t in range(len(sessions[0])):
            for k, bodies in enumerate(sessions):
                order = list(ports) if (t + k) % 2 == 0 else list(reversed(ports))
                for name in order:
                    ttfb, total, n, tail = await conns[name].request(PATH, bodies[t])
                    check(n, tail, expect)
                    out[name].append([ttfb, total])
    finally:
        for c in conns.values():
            c.close()
    return out


def stored_turns(db: Path) -> int:
    with sqlite3.connect(db) as c:
        return c.execute("select count(*) from turns").fetchone()[0]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--sessions", type=int, default=3)
    ap.add_argument("--turns", type=int, default=200)
    a = ap.parse_args()
    bands = length_bands(a.turns)
    template = session_bodies(a.turns, 30, 8)
    sessions = [bodies_of(template, 800_000 + k) for k in range(a.sessions)]
    expect = sum(len(e) for e in chat_stream(RESPONSE_EVENTS, 200))
    up_port, tt_port = free_port(), free_port()
    with tempfile.TemporaryDirectory(prefix="tooltap-bench-size-") as tmp:
        db = Path(tmp) / "bench.db"
        upstream = start_upstream(up_port)
        tooltap = None
        try:
            tooltap = start_tooltap(f"http://127.0.0.1:{up_port}", db, tt_port)
            print(f"{a.sessions} sessions x {a.turns} turns, bodies {len(template[0]) / 1024:.0f} KB to "
                  f"{len(template[-1]) / 2**20:.2f} MB, each request straight and through tooltap ...", flush=True)
            times = asyncio.run(play({"direct": up_port, "tooltap": tt_port}, sessions, expect))
        finally:
            if tooltap is not None:
                stop(tooltap)  # SIGINT: the writer stores what it holds first
            stop(upstream)
        stored = stored_turns(db)

    rows, results = [], []
    for lo, hi in bands:
        picked = slice(lo * a.sessions, hi * a.sessions)
        d_ttfb, d_total = (median([r[i] for r in times["direct"][picked]]) * 1e3 for i in (0, 1))
        t_ttfb, t_total = (median([r[i] for r in times["tooltap"][picked]]) * 1e3 for i in (0, 1))
        kb = median([len(template[t]) for t in range(lo, hi)]) / 1024
        results.append({"turns": [lo + 1, hi], "body_kb": round(kb), "direct_ttfb_ms": d_ttfb,
                        "direct_total_ms": d_total, "tooltap_ttfb_ms": t_ttfb, "tooltap_total_ms": t_total})
        rows.append([f"{lo + 1}-{hi}", f"{kb:,.0f}", f"{d_ttfb:.2f}", f"{t_ttfb:.2f}", f"{t_ttfb - d_ttfb:+.2f}",
                     f"{d_total:.2f}", f"{t_total:.2f}", f"{t_total - d_total:+.2f}"])
    print()
    print(table(rows, ["turns", "body KB", "TTFB direct", "tooltap", "added", "total direct", "tooltap", "added"]))
    print(f"\nms, medians of {a.sessions} sessions x 20 turns per band; stored {stored} of "
          f"{a.sessions * a.turns} turns")
    out = write_results("request_size", {"machine": machine(), "params": vars(a), "bands": results,
                                         "stored": stored})
    print(f"results: {out}")
    return 0 if stored == a.sessions * a.turns else 1


if __name__ == "__main__":
    sys.exit(main())
