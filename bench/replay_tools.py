"""How long `tooltap replay tools --all` takes over a database of many stored sessions.

    python bench/replay_tools.py [--sessions 1000] [--uids 0] [--runs 3]

1. Fill: a SQLite database with `--sessions` copies of the real cline-weather session
   (tests/fixtures/cline-weather: four turns, 15 tools, three tool calls, one of them the
   MCP call with the leaked task_progress). Each copy gets its own task text (so it is its
   own session) and, by default, its own Cline MCP uid (`c00042` instead of `cIya4J`), in
   the tools offered and in the call the model made: as Cline restarts between tasks, so
   every session offers a tool set never seen before (the worst case for the cache of
   converted tool sets). `--uids K` uses K uids in turn instead. Turns are captured with
   proxy.capture.Capture as the hot path does and stored by proxy.store.writer.Writer,
   decoders and session threading included.
2. Time: `tooltap replay tools --all --db ... --format json` as a subprocess (start-up
   included), `--runs` times; checks the output (every session reported, the task_progress
   rejection in each) and the exit code (1: calls would be rejected).

Prints the median, checks the target (well under a minute), writes bench/results/replay-tools-*.json.
"""

from __future__ import annotations

import argparse
import json
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from common import REPO, captured, machine, median, table, tooltap_cmd, write_results

FIXTURE = REPO / "tests" / "fixtures" / "cline-weather"
TASK = "华盛顿明天天气如何？".encode()
UID = b"cIya4J"
TARGET_SECONDS = 60.0
# Turn 4's answer (the fixture has no stream for it): plain text, no tool call.
FINAL_SSE = (
    b'data: {"id":"c4","object":"chat.completion.chunk","created":1,"model":"deepseek-chat",'
    b'"choices":[{"index":0,"delta":{"role":"assistant","content":"Sunny."},"finish_reason":null}]}\n\n'
    b'data: {"id":"c4","object":"chat.completion.chunk","created":1,"model":"deepseek-chat",'
    b'"choices":[{"index":0,"delta":{},"finish_reason":"stop"}]}\n\n'
    b"data: [DONE]\n\n"
)


def session_turns(i: int, uids: int) -> list[tuple[bytes, bytes]]:
    """(request body, response stream) of each turn of copy `i`."""
    uid = f"c{(i % uids) if uids else i:05d}".encode()
    assert len(uid) == len(UID)  # same length: byte offsets in the streams stay right
    task = TASK + f" (bench {i})".encode()
    out = []
    for n in (1, 2, 3, 4):
        body = (FIXTURE / f"turn{n}" / "request.json").read_bytes().replace(TASK, task).replace(UID, uid)
        sse_file = FIXTURE / f"turn{n}" / "response.sse"
        sse = sse_file.read_bytes().replace(UID, uid) if sse_file.exists() else FINAL_SSE
        out.append((body, sse))
    return out


def fill(db: Path, sessions: int, uids: int) -> dict:
    from proxy.store.writer import Writer

    writer = Writer(f"sqlite:///{db}", spool_path=str(db.parent / "spool.jsonl"))
    writer.start()
    t0 = time.perf_counter()
    for i in range(sessions):
        for body, sse in session_turns(i, uids):
            writer.submit(captured(body, (sse[k:k + 512] for k in range(0, len(sse), 512))))  # network-sized
        if i % 100 == 99:
            writer.flush(120)
    writer.flush(300)
    written = writer.written
    writer.close()
    return {"turns": written, "seconds": time.perf_counter() - t0}


def replay_once(db: Path) -> tuple[float, float, int, dict]:
    """(wall seconds, CPU seconds, exit code, report) of one run."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    t0 = time.perf_counter()
    proc = subprocess.run([*tooltap_cmd(), "replay", "tools", "--all", "--db", f"sqlite:///{db}", "--format", "json"],
                          capture_output=True, timeout=900)
    elapsed = time.perf_counter() - t0
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    report = json.loads(proc.stdout) if proc.stdout else {"error": proc.stderr.decode()}
    return elapsed, cpu, proc.returncode, report


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--sessions", type=int, default=1000)
    ap.add_argument("--uids", type=int, default=0, help="distinct MCP uids (0: one per session)")
    ap.add_argument("--runs", type=int, default=3)
    a = ap.parse_args()

    results: dict = {"machine": machine(), "params": vars(a)}
    with tempfile.TemporaryDirectory(prefix="tooltap-bench-") as tmp:
        db = Path(tmp) / "sessions.db"
        print(f"[1/2] storing {a.sessions} cline-weather sessions (4 turns each) through the writer ...", flush=True)
        results["fill"] = fill(db, a.sessions, a.uids)
        print(f"      {results['fill']['turns']} turns in {results['fill']['seconds']:.1f} s; "
              f"database {db.stat().st_size / 2**20:.1f} MB", flush=True)
        print(f"[2/2] tooltap replay tools --all, {a.runs} run(s) ...", flush=True)
        runs = []
        for _ in range(a.runs):
            seconds, cpu, code, report = replay_once(db)
            sessions = report.get("sessions", [])
            rejected = sum(any(r["path"] == "$.task_progress" for p in s["providers"] for r in p["rejected"])
                           for s in sessions)
            runs.append({"seconds": seconds, "cpu_seconds": cpu, "exit": code, "sessions": len(sessions),
                         "with_task_progress": rejected})
            print(f"      {seconds:.2f} s ({cpu:.2f} s CPU), exit {code}, {len(sessions)} sessions, "
                  f"task_progress rejected in {rejected}", flush=True)
            if "error" in report:
                print(report["error"], file=sys.stderr)
    results["runs"] = runs
    med = median([r["seconds"] for r in runs])
    correct = all(r["exit"] == 1 and r["sessions"] == a.sessions == r["with_task_progress"] for r in runs)
    results["median_seconds"] = med
    results["target_met"] = med < TARGET_SECONDS and correct
    print(f"\n== replay tools --all over {a.sessions} sessions ({results['fill']['turns']} turns), median of {a.runs} ==")
    cpu = median([r["cpu_seconds"] for r in runs])
    results["median_cpu_seconds"] = cpu
    print(table([["wall time, start-up included", f"{med:.2f} s"],
                 ["CPU time (user + system; the machine may be shared)", f"{cpu:.2f} s"],
                 ["per session", f"{med / max(a.sessions, 1) * 1e3:.1f} ms"],
                 ["every session reported with its rejection, exit 1", "yes" if correct else "NO"]], ["", ""]))
    print(f"\n== Target ==\nunder {TARGET_SECONDS:.0f} s  {med:.2f} s  {'MET' if results['target_met'] else 'NOT MET'}")
    print(f"\nresults: {write_results('replay-tools', results)}")
    return 0 if results["target_met"] else 1


if __name__ == "__main__":
    sys.exit(main())
