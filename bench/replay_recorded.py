"""How long a recorded replay of a long session takes (issue 8: a 50-turn session at
--speed 0 in under 2 s).

    python bench/replay_recorded.py [--turns 50] [--runs 5]

1. Record: a synthetic Cline-like session (the storage benchmark's text: ~30 KB system
   prompt, ~8 KB tools, a growing history) whose every answer is a stream with text and a
   tool call in fragments (with a task_progress checklist), sent through a real tooltap
   (uvicorn, its writer process, SQLite in a temporary folder) in front of a scripted
   upstream. The next request carries the previous answer, as an agent's does.
2. Replay, in this process: `proxy.replay.recorded.replay_recorded(recording, speed=0)`
   after one warm-up run (the first one pays for imports); `--runs` times, median.
   Every run must find every turn identical.
3. Replay from the command line: `tooltap replay session ID --recorded` as a fresh
   process (imports included), 3 times, median; exit 0 required.

Prints a table, checks the target on the in-process median, writes
bench/results/replay_recorded-*.json.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from common import machine, median, table, tooltap_cmd, write_results  # noqa: E402
from storage import Words, make_tools  # noqa: E402

TARGET_S = 2.0


def session(turns: int, seed: int = 11) -> list[tuple[bytes, bytes]]:
    """(request body, answer stream) per turn; each answer is in the next request."""
    from proxy.demo import chat_sse, words

    w = Words(seed)
    tools = make_tools(w, 8)
    messages = [{"role": "system", "content": w.text(30 * 1024)},
                {"role": "user", "content": f"<task>\n{w.text(400)}\n</task>"}]
    out = []
    for t in range(turns):
        body = {"model": "bench-model", "stream": True, "stream_options": {"include_usage": True},
                "messages": messages, "tools": tools, "tool_choice": "auto"}
        text = w.text(w.rng.randint(80, 300))
        name = tools[t % len(tools)]["function"]["name"]
        args = json.dumps({"path": f"src/{w.rng.choice(w.vocab)}.py", "content": w.code(w.rng.randint(200, 800)),
                           "task_progress": "".join(f"- [{'x' if i < t % 5 else ' '}] step {i}\n" for i in range(5))})
        call_id = f"call_{t:04d}"
        pieces = [args[i:i + 40] for i in range(0, len(args), 40)]
        deltas = words(text) + [{"tool_calls": [{"index": 0, "id": call_id, "type": "function",
                                                 "function": {"name": name, "arguments": ""}}]}]
        deltas += [{"tool_calls": [{"index": 0, "function": {"arguments": p}}]} for p in pieces]
        sse = chat_sse("bench-model", deltas, {"prompt_tokens": 1000 + t, "completion_tokens": 50,
                                               "total_tokens": 1050 + t}, "tool_calls", f"chatcmpl-{t}")
        out.append((json.dumps(body).encode(), sse))
        messages = messages + [
            {"role": "assistant", "content": text,
             "tool_calls": [{"id": call_id, "type": "function", "function": {"name": name, "arguments": args}}]},
            {"role": "tool", "tool_call_id": call_id, "content": w.code(w.rng.randint(1024, 3072))},
            {"role": "user", "content": f"<environment_details>\n{w.text(600)}\n</environment_details>"},
        ]
    return out


def record(turns: list[tuple[bytes, bytes]], db_url: str) -> str:
    """Send the session through a real tooltap; returns its session id."""
    import httpx

    from proxy.app import TooltapApp
    from proxy.config import Settings, Upstream
    from proxy.demo import Served, free_port
    from proxy.scripted import Reply, ScriptedUpstream

    scripted = ScriptedUpstream({"/chat/completions": [Reply.sse(sse, split=512) for _, sse in turns]})
    upstream = Served(scripted, "127.0.0.1", free_port()).start()
    app = TooltapApp(Settings(upstreams=(Upstream.parse(f"http://127.0.0.1:{upstream.port}"),), db_url=db_url))
    server = Served(app, "127.0.0.1", free_port()).start()
    try:
        with httpx.Client(base_url=f"http://127.0.0.1:{server.port}", timeout=30) as client:
            for body, _ in turns:
                r = client.post("/chat/completions", content=body, headers={
                    "content-type": "application/json", "authorization": "Bearer sk-bench-0000000000000000"})
                assert r.status_code == 200, r.text
        while app.forwarder.in_flight:
            time.sleep(0.01)
        app.writer.flush()
    finally:
        server.stop()
        upstream.stop()
    from proxy.replay.recording import open_reader, session_ids

    ids = list(session_ids(open_reader(db_url)))
    assert len(ids) == 1, f"expected one session, got {ids}"
    return ids[0]


def cpu_seconds(who: int) -> float:
    r = resource.getrusage(who)
    return r.ru_utime + r.ru_stime


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--turns", type=int, default=50)
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--cli-runs", type=int, default=3)
    a = ap.parse_args()

    from proxy.replay.recorded import replay_recorded
    from proxy.replay.recording import load, open_reader

    with tempfile.TemporaryDirectory(prefix="tooltap-bench-replay-") as tmp:
        db_url = f"sqlite:///{Path(tmp) / 'recorded.db'}"
        turns = session(a.turns)
        sent = sum(len(b) for b, _ in turns)
        print(f"[1/3] recording {a.turns} turns ({sent / 2**20:.1f} MB of requests) through tooltap ...", flush=True)
        sid = record(turns, db_url)

        print(f"[2/3] replay_recorded(speed=0): 1 warm-up + {a.runs} runs ...", flush=True)
        reader = open_reader(db_url)
        t0 = time.perf_counter()
        recording = load(reader, sid)
        load_s = time.perf_counter() - t0
        assert len(recording.turns) == a.turns
        seconds, cpu = [], []
        for i in range(a.runs + 1):
            c0, t0 = cpu_seconds(resource.RUSAGE_SELF), time.perf_counter()
            result = replay_recorded(recording, speed=0)
            took = time.perf_counter() - t0
            if not result.ok:
                from proxy.replay.result import render_text
                print(render_text(result))
                print("a replay of an unchanged recording differs: that is a bug")
                return 1
            if i:
                seconds.append(took)
                cpu.append(cpu_seconds(resource.RUSAGE_SELF) - c0)
            else:
                warm_up = took

        print(f"[3/3] `tooltap replay session {sid} --recorded` as a fresh process, {a.cli_runs} runs ...", flush=True)
        cli, cli_cpu = [], []
        env = {k: v for k, v in os.environ.items() if k != "TOOLTAP_DB"}
        for _ in range(a.cli_runs):
            c0, t0 = cpu_seconds(resource.RUSAGE_CHILDREN), time.perf_counter()
            p = subprocess.run([*tooltap_cmd(), "replay", "session", sid, "--recorded", "--db", db_url],
                               capture_output=True, text=True, env=env)
            cli.append(time.perf_counter() - t0)
            cli_cpu.append(cpu_seconds(resource.RUSAGE_CHILDREN) - c0)
            if p.returncode != 0:
                print(p.stdout[-2000:], p.stderr[-2000:])
                print(f"the command exited {p.returncode}")
                return 1

    med = median(seconds)
    load_avg = os.getloadavg()[0]
    results = {"machine": machine(), "params": vars(a), "request_bytes": sent, "load_recording_s": load_s,
               "warm_up_s": warm_up, "replay_s": seconds, "replay_median_s": med,
               "replay_min_s": min(seconds), "replay_cpu_s": cpu, "replay_cpu_median_s": median(cpu),
               "cli_s": cli, "cli_median_s": median(cli), "cli_cpu_s": cli_cpu,
               "load_average_1min": load_avg, "target_s": TARGET_S, "target_met": med < TARGET_S}
    print(f"\n== Recorded replay of a {a.turns}-turn session at --speed 0 ==")
    print(table([
        ["load the recording (once)", f"{load_s:.3f}", ""],
        ["replay_recorded, first run (imports)", f"{warm_up:.3f}", ""],
        [f"replay_recorded, median of {a.runs}", f"{med:.3f}",
         f"min {min(seconds):.3f}, max {max(seconds):.3f}, stdev {statistics.pstdev(seconds):.3f}"],
        ["  CPU seconds it used (all threads), median", f"{median(cpu):.3f}", "what it takes on an idle machine"],
        [f"tooltap replay session --recorded, median of {a.cli_runs}", f"{median(cli):.3f}",
         f"min {min(cli):.3f}, max {max(cli):.3f} (a fresh process: imports, load, replay, print)"],
        ["  CPU seconds it used, median", f"{median(cli_cpu):.3f}", ""],
    ], ["", "seconds", ""]))
    print(f"load average (1 min) at the end: {load_avg:.2f} on {os.cpu_count()} cores")
    print(f"\n== Target ==\nreplay median {med:.3f} s (< {TARGET_S} s)  {'MET' if results['target_met'] else 'NOT MET'}")
    out = write_results("replay_recorded", results)
    print(f"\nresults: {out}")
    return 0 if results["target_met"] else 1


if __name__ == "__main__":
    sys.exit(main())
