"""What `tooltap mcp` adds per message, and whether it keeps up with 1,000 messages/s.

A stdio "server" that answers each line at once (it echoes it back), driven through the
wrapper and directly, in the same run, alternating blocks (ABBA) so load on the machine
falls on both alike:

* latency: one message at a time, the time from writing a JSON-RPC request line to
  reading its answer line; the median difference is what the wrapper adds (target:
  under 1 ms) -- the wrapper records both lines, so a round trip is two messages;
* throughput: `--rate` requests per second (each answered: 2x that in messages) for
  `--seconds`, paced, through the wrapper; every answer must come back and, once the
  wrapper has exited, every message must be in the database (target: 1,000 messages/s).

    python bench/mcp_relay.py [--messages 2000] [--rate 500] [--seconds 5]
"""

from __future__ import annotations

import argparse
import os
import sqlite3
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from common import REPO, machine, median, pct, table, write_results

ECHO = [sys.executable, "-c", "import os\nwhile d := os.read(0, 65536): os.write(1, d)"]
REQUEST = (b'{"jsonrpc":"2.0","id":%d,"method":"tools/call","params":{"name":"get_forecast",'
           b'"arguments":{"latitude":38.9072,"longitude":-77.0369,"task_progress":"- [x] one\\n- [ ] two"}}}\n')


class Peer:
    def __init__(self, argv: list[str]):
        env = {**os.environ, "PYTHONPATH": str(REPO)}
        self.proc = subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, bufsize=0, env=env)
        self.buf = b""
        self.out = self.proc.stdout.fileno()
        self.inp = self.proc.stdin.fileno()

    def round_trip(self, n: int) -> float:
        line = REQUEST % n
        t0 = time.perf_counter()
        os.write(self.inp, line)
        self.read_lines(1)
        return (time.perf_counter() - t0) * 1000

    def read_lines(self, k: int) -> None:
        while self.buf.count(b"\n") < k:
            data = os.read(self.out, 1 << 16)
            if not data:
                raise RuntimeError("the peer closed its stdout")
            self.buf += data
        for _ in range(k):
            self.buf = self.buf[self.buf.index(b"\n") + 1:]

    def close(self) -> int:
        self.proc.stdin.close()
        return self.proc.wait(60)


def latency(db: str, messages: int, block: int = 100) -> dict:
    direct, wrapped = Peer(ECHO), Peer(wrapper(db))
    for peer in (direct, wrapped):  # warm up: imports done, pipes hot
        for i in range(50):
            peer.round_trip(i)
    times: dict[str, list[float]] = {"direct": [], "wrapped": []}
    n = 0
    for b in range(messages // block):
        order = [("direct", direct), ("wrapped", wrapped)]
        if b % 2:
            order.reverse()
        for name, peer in order:
            for _ in range(block):
                n += 1
                times[name].append(peer.round_trip(n))
    direct.close()
    assert wrapped.close() == 0
    out = {name: {"median_ms": round(median(v), 4), "p95_ms": round(pct(v, 0.95), 4), "n": len(v)}
           for name, v in times.items()}
    out["added_median_ms"] = round(out["wrapped"]["median_ms"] - out["direct"]["median_ms"], 4)
    return out


def throughput(db: str, rate: int, seconds: float) -> dict:
    peer = Peer(wrapper(db, name="bench-load"))
    for i in range(20):
        peer.round_trip(i)
    total = int(rate * seconds)
    start = time.perf_counter()
    sent = answered = 0
    while sent < total:  # paced: `rate` requests per second, answers read as they come
        due = int((time.perf_counter() - start) * rate) + 1
        while sent < min(due, total):
            os.write(peer.inp, REQUEST % (1000 + sent))
            sent += 1
        ready = peer.buf.count(b"\n")
        if ready < sent - answered:
            data = os.read(peer.out, 1 << 16)
            peer.buf += data
        k = peer.buf.count(b"\n")
        peer.read_lines(k) if k else None
        answered += k
    peer.read_lines(sent - answered)
    elapsed = time.perf_counter() - start
    t0 = time.perf_counter()
    assert peer.close() == 0
    exit_s = time.perf_counter() - t0
    with sqlite3.connect(db[len("sqlite:///"):]) as conn:
        stored = conn.execute("select count(*) from mcp_messages where server = 'bench-load'").fetchone()[0]
    expected = 2 * (total + 20)
    return {"requests": total, "messages": 2 * total, "seconds": round(elapsed, 3),
            "messages_per_s": round(2 * total / elapsed, 1), "stored": stored, "expected": expected,
            "exit_seconds": round(exit_s, 3)}


def wrapper(db: str, name: str = "bench") -> list[str]:
    return [sys.executable, "-m", "proxy", "mcp", "--db", db, "--name", name, "--", *ECHO]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--messages", type=int, default=2000, help="round trips per path for latency")
    ap.add_argument("--rate", type=int, default=500, help="requests/s for the throughput run (messages: 2x)")
    ap.add_argument("--seconds", type=float, default=5.0)
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        db = f"sqlite:///{Path(tmp) / 'bench.db'}"
        subprocess.run(wrapper(db, "warmup"), input=b"", check=False,
                       env={**os.environ, "PYTHONPATH": str(REPO)})  # create and migrate the database
        lat = latency(db, args.messages)
        thr = throughput(db, args.rate, args.seconds)
    print(table([["direct", lat["direct"]["median_ms"], lat["direct"]["p95_ms"]],
                 ["wrapped", lat["wrapped"]["median_ms"], lat["wrapped"]["p95_ms"]]],
                ["round trip (2 messages)", "median ms", "p95 ms"]))
    print(f"added by the wrapper per round trip (median): {lat['added_median_ms']} ms")
    print(f"throughput: {thr['messages_per_s']} messages/s for {thr['seconds']} s, "
          f"{thr['stored']}/{thr['expected']} stored, wrapper exit {thr['exit_seconds']} s")
    ok = lat["added_median_ms"] < 1.0 and thr["messages_per_s"] >= 1000 * 0.98 and thr["stored"] == thr["expected"]
    write_results("mcp-relay", {"machine": machine(), "latency": lat, "throughput": thr, "ok": ok})
    print("targets met" if ok else "TARGET MISSED")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
