"""How many database bytes tooltap spends on an agent session, and how fast it stores it.

    python bench/storage.py [--turns 50] [--system-kb 30] [--tools-kb 8] [--runs 3]

1. Size: a synthetic Cline-like session of `--turns` turns sent through a real
   `tooltap serve` (SQLite in a temporary directory) in front of bench/upstream.py. Every
   request carries a ~30 KB system prompt, a ~8 KB tools array and the whole history so
   far; each turn adds an assistant message with a tool call, a tool result (2-4 KB) and
   a user message (1-2 KB). The text is pseudo-English drawn from a fixed vocabulary with a
   fixed seed: it compresses like prose (zlib ~3x), not like repeated filler. After the
   session tooltap is stopped (SIGINT flushes its writer), the WAL is checkpointed
   (TRUNCATE) and the SQLite file + WAL are measured, against the sum of request bodies.
   The size after VACUUM and the bytes per table (dbstat) are shown too.
2. Speed: the same turns, captured with proxy.capture.Capture exactly as the hot path
   does, submitted straight to proxy.store.writer.Writer: one turn per batch (as an agent
   whose turns are seconds apart produces them) and all turns in one batch.

Prints a table, checks the target (<= 0.15), writes bench/results/storage-*.json.
"""

from __future__ import annotations

import argparse
import json
import random
import sqlite3
import sys
import tempfile
import time
from pathlib import Path

import httpx

from common import (captured, free_port, machine, median, start_tooltap, start_upstream, stop, table,
                    write_results)
from upstream import chat_stream

TARGET_RATIO = 0.15
RESPONSE_EVENTS = 40
PATH = f"/v1/chat/completions?n={RESPONSE_EVENTS}&size=200"


class Words:
    """Deterministic pseudo-prose and pseudo-code."""

    def __init__(self, seed: int = 7):
        self.rng = random.Random(seed)
        syll = ["ta", "re", "mo", "ki", "lu", "sen", "dor", "pa", "vi", "qua", "ex", "ul", "ion", "ber", "st"]
        self.vocab = ["".join(self.rng.choice(syll) for _ in range(self.rng.randint(1, 4))) for _ in range(3000)]
        self.common = ["the", "a", "to", "of", "and", "in", "is", "you", "for", "must", "tool", "file", "use"]

    def text(self, n_bytes: int) -> str:
        out, size = [], 0
        while size < n_bytes:
            w = self.rng.choice(self.common) if self.rng.random() < 0.35 else self.rng.choice(self.vocab)
            if self.rng.random() < 0.06:
                w += ".\n" if self.rng.random() < 0.3 else ","
            out.append(w)
            size += len(w) + 1
        return " ".join(out)[:n_bytes]

    def code(self, n_bytes: int) -> str:
        lines, size = [], 0
        while size < n_bytes:
            ind = "    " * self.rng.randint(0, 3)
            a, b, c = (self.rng.choice(self.vocab) for _ in range(3))
            line = self.rng.choice([f"{ind}def {a}_{b}(self, {c}):", f"{ind}{a} = {b}({c}, {self.rng.randint(0, 999)})",
                                    f"{ind}return {a}.{b}", f"{ind}if {a} is not None and {b} > {c}:",
                                    f"{ind}# {self.text(40)}"])
            lines.append(line)
            size += len(line) + 1
        return "\n".join(lines)[:n_bytes]


def make_tools(w: Words, kb: int) -> list[dict]:
    tools, size = [], 0
    while size < kb * 1024:
        props = {w.rng.choice(w.vocab): {"type": w.rng.choice(["string", "integer", "boolean"]),
                                         "description": w.text(w.rng.randint(60, 200))}
                 for _ in range(w.rng.randint(2, 5))}
        t = {"type": "function", "function": {"name": f"{w.rng.choice(w.vocab)}_{len(tools)}",
                                              "description": w.text(w.rng.randint(200, 500)),
                                              "parameters": {"type": "object", "properties": props,
                                                             "required": list(props)[:1]}}}
        tools.append(t)
        size += len(json.dumps(t))
    return tools


def session_bodies(turns: int, system_kb: int, tools_kb: int, seed: int = 7) -> list[bytes]:
    """The request body of each turn, as an agent would send them (history grows)."""
    w = Words(seed)
    system = w.text(system_kb * 1024)
    tools = make_tools(w, tools_kb)
    messages = [{"role": "system", "content": system},
                {"role": "user", "content": f"<task>\n{w.text(400)}\n</task>\n<environment_details>\n"
                                            f"{w.text(1500)}\n</environment_details>"}]
    bodies = []
    for t in range(turns):
        bodies.append(json.dumps({"model": "bench-model", "stream": True, "stream_options": {"include_usage": True},
                                  "temperature": 0, "messages": messages, "tools": tools,
                                  "tool_choice": "auto"}).encode())
        call_id = f"call_{t:04d}"
        args = json.dumps({"path": f"src/{w.rng.choice(w.vocab)}.py", "content": w.code(w.rng.randint(300, 1200))})
        messages = messages + [
            {"role": "assistant", "content": w.text(w.rng.randint(100, 500)),
             "tool_calls": [{"id": call_id, "type": "function",
                             "function": {"name": tools[t % len(tools)]["function"]["name"], "arguments": args}}]},
            {"role": "tool", "tool_call_id": call_id, "content": w.code(w.rng.randint(2048, 4096))},
            {"role": "user", "content": f"<environment_details>\n{w.text(w.rng.randint(1024, 2048))}\n"
                                        f"</environment_details>"},
        ]
    return bodies


def db_bytes(db: Path) -> int:
    return sum(p.stat().st_size for p in db.parent.glob(db.name + "*") if not p.name.endswith(".jsonl"))


def size_run(bodies: list[bytes], tmp: Path) -> dict:
    up_port, tt_port = free_port(), free_port()
    db = tmp / "session.db"
    upstream = start_upstream(up_port)
    tooltap = None
    try:
        tooltap = start_tooltap(f"http://127.0.0.1:{up_port}", db, tt_port)
        empty = db_bytes(db)  # schema only (migrations ran at startup)
        t0 = time.perf_counter()
        with httpx.Client(base_url=f"http://127.0.0.1:{tt_port}", timeout=30) as c:
            for body in bodies:
                r = c.post(PATH, content=body, headers={"content-type": "application/json",
                                                         "authorization": "Bearer sk-bench-not-a-secret"})
                r.raise_for_status()
                assert r.content.endswith(b"data: [DONE]\n\n")
        send_s = time.perf_counter() - t0
    finally:
        if tooltap is not None:
            stop(tooltap)
        stop(upstream)
    with sqlite3.connect(db) as c:
        turns = c.execute("select count(*) from turns").fetchone()[0]
        sessions = c.execute("select count(*) from sessions").fetchone()[0]
        raw = c.execute("select coalesce(sum(length(raw)),0), coalesce(sum(raw_size),0) from turns").fetchone()
        c.execute("pragma wal_checkpoint(TRUNCATE)")
        try:
            per_table = dict(c.execute("select name, sum(pgsize) from dbstat group by name order by 2 desc"))
        except sqlite3.Error:
            per_table = {}
    checkpointed = db_bytes(db)
    with sqlite3.connect(db) as c:
        c.execute("vacuum")
        c.execute("pragma wal_checkpoint(TRUNCATE)")
    vacuumed = db_bytes(db)
    return {"turns_stored": turns, "sessions": sessions, "empty_db_bytes": empty, "db_bytes": checkpointed,
            "db_bytes_vacuumed": vacuumed, "send_seconds": send_s, "raw_response_bytes": raw[1],
            "raw_response_stored_bytes": raw[0], "bytes_per_table": per_table}


def captured_records(bodies: list[bytes]):
    """TurnRecords made the way the hot path makes them, the response fed event by event."""
    events = chat_stream(RESPONSE_EVENTS, 200)
    return [captured(body, events, PATH) for body in bodies]


def writer_run(bodies: list[bytes], tmp: Path, per_turn_batches: bool) -> dict:
    from proxy.store.writer import Writer

    db = tmp / f"writer-{int(per_turn_batches)}.db"
    writer = Writer(f"sqlite:///{db}", spool_path=str(tmp / "spool.jsonl"))
    writer.start()
    records = captured_records(bodies)
    per_turn = []
    t0 = time.perf_counter()
    if per_turn_batches:
        for rec in records:
            t = time.perf_counter()
            writer.submit(rec)
            writer.flush(60)  # flush() makes the writer commit at once, without waiting for its batch window
            per_turn.append(time.perf_counter() - t)
    else:
        for rec in records:
            writer.submit(rec)
        writer.flush(120)
    elapsed = time.perf_counter() - t0
    written = writer.written
    writer.close()
    out = {"turns": written, "seconds": elapsed, "turns_per_s": written / elapsed}
    if per_turn:
        k = max(1, len(per_turn) // 5)
        out["ms_per_turn_first"] = median(per_turn[:k]) * 1e3
        out["ms_per_turn_last"] = median(per_turn[-k:]) * 1e3
        out["per_turn_ms"] = [round(x * 1e3, 2) for x in per_turn]
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--turns", type=int, default=50)
    ap.add_argument("--system-kb", type=int, default=30)
    ap.add_argument("--tools-kb", type=int, default=8)
    ap.add_argument("--runs", type=int, default=3, help="writer speed runs (medians reported)")
    a = ap.parse_args()

    bodies = session_bodies(a.turns, a.system_kb, a.tools_kb)
    total = sum(map(len, bodies))
    import zlib
    zlib_last = len(zlib.compress(bodies[-1], 6))
    print(f"session: {a.turns} turns, request bodies {len(bodies[0]) / 1024:.1f} KB .. {len(bodies[-1]) / 1024:.1f} KB, "
          f"sum {total / 2**20:.2f} MB (zlib of the last body alone: {len(bodies[-1]) / zlib_last:.1f}x)", flush=True)
    results: dict = {"machine": machine(), "params": vars(a), "request_bytes_total": total,
                     "request_bytes_first": len(bodies[0]), "request_bytes_last": len(bodies[-1])}
    with tempfile.TemporaryDirectory(prefix="tooltap-bench-") as tmp:
        print("[1/2] size: the session through tooltap ...", flush=True)
        s = size_run(bodies, Path(tmp))
        results["size"] = s
        print(f"[2/2] writer speed: {a.runs} run(s) per mode ...", flush=True)
        runs = {"one turn per batch": [], "one batch": []}
        for i in range(a.runs):
            with tempfile.TemporaryDirectory(dir=tmp) as t2:
                runs["one turn per batch"].append(writer_run(bodies, Path(t2), True))
                runs["one batch"].append(writer_run(bodies, Path(t2), False))
        results["writer"] = runs

    ratio = s["db_bytes"] / total
    ratio_vac = s["db_bytes_vacuumed"] / total
    ratio_net = (s["db_bytes"] - s["empty_db_bytes"]) / total
    results["ratio"], results["ratio_vacuumed"], results["ratio_net_of_empty"] = ratio, ratio_vac, ratio_net
    results["target_met"] = ratio <= TARGET_RATIO

    kb = lambda b: f"{b / 1024:,.1f}"
    print(f"\n== Storage: {s['turns_stored']} turns stored in {s['sessions']} session(s) ==")
    print(table([
        ["request bodies sent (sum)", kb(total), "1.000"],
        ["database: file + WAL after checkpoint", kb(s["db_bytes"]), f"{ratio:.3f}"],
        ["database: after VACUUM", kb(s["db_bytes_vacuumed"]), f"{ratio_vac:.3f}"],
        ["empty database (schema only)", kb(s["empty_db_bytes"]), f"{s['empty_db_bytes'] / total:.3f}"],
        ["checkpointed minus empty", kb(s["db_bytes"] - s["empty_db_bytes"]), f"{ratio_net:.3f}"],
        ["responses: raw bytes / stored (zlib)", f"{kb(s['raw_response_bytes'])} / {kb(s['raw_response_stored_bytes'])}", ""],
    ], ["", "KB", "ratio to requests"]))
    if s["bytes_per_table"]:
        top = sorted(s["bytes_per_table"].items(), key=lambda kv: -kv[1])[:8]
        print("pages by table/index (dbstat, before VACUUM): " + ", ".join(f"{n} {kb(v)} KB" for n, v in top))

    print(f"\n== Writer: {a.turns} captured turns into proxy.store.writer.Writer (SQLite), median of {a.runs} ==")
    rows = []
    for mode, rs in runs.items():
        row = [mode, f"{median([r['turns_per_s'] for r in rs]):.1f}", f"{median([r['seconds'] for r in rs]):.2f}"]
        if "ms_per_turn_first" in rs[0]:
            row += [f"{median([r['ms_per_turn_first'] for r in rs]):.1f}", f"{median([r['ms_per_turn_last'] for r in rs]):.1f}"]
        else:
            row += ["", ""]
        rows.append(row)
    print(table(rows, ["mode", "turns/s", "seconds", "ms/turn, first 10", "ms/turn, last 10"]))
    print(f"\n== Target ==\ndatabase bytes / request bytes  {ratio:.3f}  (<= {TARGET_RATIO})  "
          f"{'MET' if results['target_met'] else 'NOT MET'}")
    out = write_results("storage", results)
    print(f"\nresults: {out}")
    return 0 if results["target_met"] else 1


if __name__ == "__main__":
    sys.exit(main())
