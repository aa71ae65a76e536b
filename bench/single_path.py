"""tooltap alone under load: how its cost per request moves from run to run, and why.

    python bench/single_path.py [--runs 3] [--concurrency 32] [--seconds 4]
                                [--stop-writer] [--variant ARGS]

overhead.py alternates direct and tooltap rounds, so the writer stores the tooltap
rounds' turns during the direct ones, and both paths pay for it. Here only tooltap
carries load (the bench upstream behind it, bench/client.py in front), measured in the
middle of each run:

- requests per second;
- tooltap's CPU per request (its own process; the writer process apart);
- its system calls per request: socket reads and writes, epoll waits (`perf stat`,
  where perf can count tracepoints);
- with --stop-writer, the writer process is stopped (SIGSTOP) for the whole run.
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from common import (BENCH, cpu_seconds, free_port, median, start_tooltap, start_upstream, stop, table,
                    writer_processes)

SYSCALLS = ("read", "write", "epoll_pwait")


def count_syscalls(pid: int, seconds: float) -> dict[str, int] | None:
    """System calls of `pid` (all its threads) over `seconds`, or None without perf."""
    if not shutil.which("perf"):
        time.sleep(seconds)
        return None
    with tempfile.NamedTemporaryFile("r", suffix=".txt") as out:
        events = ",".join(f"syscalls:sys_enter_{name}" for name in SYSCALLS)
        done = subprocess.run(["perf", "stat", "-x", ",", "-e", events, "-p", str(pid), "-o", out.name,
                               "--", "sleep", str(seconds)], capture_output=True)
        counts = {}
        for line in out.read().splitlines():
            fields = line.split(",")
            if len(fields) > 2 and fields[0].isdigit():
                counts[fields[2].removeprefix("syscalls:sys_enter_")] = int(fields[0])
    return counts if done.returncode == 0 and counts else None


def one_run(a, upstream_url: str, folder: Path) -> dict:
    port = free_port()
    tooltap = start_tooltap(upstream_url, folder / "bench.db", port, shlex.split(a.variant) if a.variant else None)
    writers = writer_processes(tooltap.pid)
    try:
        if a.stop_writer:
            for pid in writers:
                os.kill(pid, signal.SIGSTOP)
        spec = {"mode": "load", "targets": {"tooltap": port}, "path": f"/v1/chat/completions?n={a.chunks}&size=200",
                "concurrency": a.concurrency, "round_seconds": a.seconds, "rounds": 1, "warmup_rounds": 0}
        client = subprocess.Popen([sys.executable, str(BENCH / "client.py"), json.dumps(spec)],
                                  stdout=subprocess.PIPE, text=True)
        window = a.seconds / 2  # the middle half of the load
        time.sleep(a.seconds / 4)
        cpu0, wcpu0, t0 = cpu_seconds(tooltap.pid), sum(map(cpu_seconds, writers)), time.perf_counter()
        calls = count_syscalls(tooltap.pid, window)
        cpu1, wcpu1, t1 = cpu_seconds(tooltap.pid), sum(map(cpu_seconds, writers)), time.perf_counter()
        result = json.loads(client.communicate(timeout=a.seconds + 60)[0])["tooltap"]
    finally:
        for pid in writers if a.stop_writer else ():
            os.kill(pid, signal.SIGCONT)
        stop(tooltap)
    rate = result["requests"] / result["elapsed"]
    n = rate * (t1 - t0)  # requests in the measured window, at the run's mean rate
    run = {"req_s": rate, "cpu_us": (cpu1 - cpu0) * 1e6 / n, "writer_cpu_us": (wcpu1 - wcpu0) * 1e6 / n,
           "errors": result["errors"]}
    if calls:
        run.update({f"{name}_per_req": count / n for name, count in calls.items()})
    return run


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--runs", type=int, default=3, help="measurements, each with its own tooltap")
    ap.add_argument("--concurrency", type=int, default=32, help="streams at once")
    ap.add_argument("--seconds", type=float, default=4.0, help="load time per run")
    ap.add_argument("--chunks", type=int, default=200, help="SSE events per response")
    ap.add_argument("--stop-writer", action="store_true", help="SIGSTOP the writer process for each run")
    ap.add_argument("--variant", metavar="ARGS", help="run bench/variant.py with ARGS instead of tooltap serve")
    a = ap.parse_args()
    up_port = free_port()
    upstream = start_upstream(up_port)
    runs = []
    try:
        for i in range(a.runs):
            with tempfile.TemporaryDirectory() as folder:
                runs.append(one_run(a, f"http://127.0.0.1:{up_port}", Path(folder)))
    finally:
        stop(upstream)
    keys = ["req_s", "cpu_us", "writer_cpu_us", *(f"{name}_per_req" for name in SYSCALLS)]
    rows = [[k, *(f"{r[k]:.1f}" if k in r else "-" for r in runs), f"{median([r[k] for r in runs]):.1f}"
             if all(k in r for r in runs) else "-"] for k in keys]
    print(table(rows, ["figure", *(f"run {i + 1}" for i in range(a.runs)), "median"]))
    if any(r["errors"] for r in runs):
        print("errors:", [r["errors"] for r in runs])


if __name__ == "__main__":
    main()
