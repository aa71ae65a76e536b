"""How late turns reach the store when the machine is busy with other work.

    python bench/busy_machine.py [--nice 10,19,idle] [--spinners 3] [--turns 20] [--every 0.5]

The writer process runs at a lower priority than the proxy (TOOLTAP_WRITER_NICE), which
serves the agents first when they fill the cores. The price is paid when something else
fills them: a build, a test run. Here `--spinners` processes at normal priority keep the
cores busy while one agent sends a Cline-sized turn (a growing conversation, a 200-event
answer) every `--every` seconds; for each writer priority, a fresh tooltap, and for each
turn the time from its answer's end to its being stored (`/_tooltap/api/health`'s
backlog, polled every 20 ms). Prints medians and maxima and how long the last turn took.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from pathlib import Path

from common import free_port, start_tooltap, start_upstream, stop, table, write_results, writer_backlog

SPIN = "while True: pass"


def conversation(turn: int, kb_per_turn: int) -> bytes:
    """A chat request whose history grows by about `kb_per_turn` KB a turn, as an agent's."""
    messages = [{"role": "system", "content": "You are a coding agent. " * 200}]
    for i in range(turn):
        messages.append({"role": "user", "content": f"step {i}: " + "file contents\n" * (kb_per_turn * 70)})
        messages.append({"role": "assistant", "content": f"done {i}"})
    messages.append({"role": "user", "content": f"step {turn}"})
    return json.dumps({"model": "bench-model", "stream": True, "messages": messages}).encode()


def one_priority(nice: str, args) -> dict:
    os.environ["TOOLTAP_WRITER_NICE"] = nice
    with tempfile.TemporaryDirectory(prefix="tooltap-busy-") as tmp:
        up_port, tt_port = free_port(), free_port()
        upstream = start_upstream(up_port)
        tooltap = start_tooltap(f"http://127.0.0.1:{up_port}", Path(tmp) / "busy.db", tt_port)
        health = f"http://127.0.0.1:{tt_port}/_tooltap/api/health"
        spinners = [subprocess.Popen([sys.executable, "-c", SPIN]) for _ in range(args.spinners)]
        ended: list[float] = []  # when each turn's answer ended
        stored: dict[int, float] = {}  # turn index -> when the backlog said it was stored
        done = threading.Event()

        def watch() -> None:
            while not done.is_set():
                sent, backlog = len(ended), writer_backlog(health)
                now = time.monotonic()
                for k in range(sent - backlog):
                    stored.setdefault(k, now)
                time.sleep(0.02)

        watcher = threading.Thread(target=watch, daemon=True)
        try:
            time.sleep(1.0)  # the spinners settle on the cores
            watcher.start()
            for turn in range(args.turns):
                began = time.monotonic()
                req = urllib.request.Request(f"http://127.0.0.1:{tt_port}/chat/completions",
                                             data=conversation(turn, args.kb_per_turn),
                                             headers={"content-type": "application/json"})
                with urllib.request.urlopen(req, timeout=60) as r:
                    r.read()
                ended.append(time.monotonic())
                time.sleep(max(0.0, args.every - (time.monotonic() - began)))
            deadline = time.monotonic() + args.wait
            while len(stored) < args.turns and time.monotonic() < deadline:
                time.sleep(0.05)
        finally:
            done.set()
            for s in spinners:
                s.kill()
            stop(tooltap)
            stop(upstream)
    lags = [stored[k] - ended[k] for k in range(args.turns) if k in stored]
    last = stored.get(args.turns - 1)
    return {"nice": nice, "stored": len(lags), "turns": args.turns,
            "lag_median_s": statistics.median(lags) if lags else None, "lag_max_s": max(lags) if lags else None,
            "last_stored_after_s": (last - ended[-1]) if last is not None else None}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--nice", default="10,19", help="writer priorities to compare (TOOLTAP_WRITER_NICE values)")
    ap.add_argument("--spinners", type=int, default=3, help="busy processes at normal priority")
    ap.add_argument("--turns", type=int, default=20)
    ap.add_argument("--every", type=float, default=0.5, help="seconds between the agent's turns")
    ap.add_argument("--kb-per-turn", type=int, default=8, help="how much the conversation grows a turn")
    ap.add_argument("--wait", type=float, default=120.0, help="how long to wait for the last turn to be stored")
    args = ap.parse_args()
    rows = []
    for nice in args.nice.split(","):
        r = one_priority(nice.strip(), args)
        rows.append(r)
        print(f"writer nice {r['nice']}: {r['stored']} of {r['turns']} stored", flush=True)

    def s(v):
        return "-" if v is None else f"{v:.2f}"

    print(table([[r["nice"], f"{r['stored']}/{r['turns']}", s(r["lag_median_s"]), s(r["lag_max_s"]),
                  s(r["last_stored_after_s"])] for r in rows],
                ["writer priority", "stored", "lag median s", "lag max s", "last turn stored after s"]))
    print(f"results: {write_results('busy_machine', {'args': vars(args), 'rows': rows})}")


if __name__ == "__main__":
    main()
