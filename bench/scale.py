"""The inspector at scale (issue 10): its pages and its search over a big database.

    python bench/scale.py [--turns 1000000] [--sessions 20000] [--db URL] [--requests 30]

1. Build: a database of `--turns` turns in `--sessions` sessions, written straight into
   the tables with bulk inserts (the writer would take hours): each session an agent
   reading and editing files, one tool call a turn (read_file, write_file, run_command,
   search_code with paths and identifiers for arguments), each next request carrying
   the call's result, so a session of n turns holds 2n-1 messages in its chain; a
   shared ~6 KB system prompt and tools array; `--long` sessions of 500 turns. Message
   text is pseudo-English from a fixed vocabulary with code identifiers and paths mixed
   in, fixed seed. The messages are indexed by proxy.store.search.index_messages (what
   the writer calls), the tool calls by the database (triggers / generated columns),
   so the index is the one tooltap itself builds.
2. Time: a real `tooltap serve` (python -m proxy serve, its own process, on the database)
   and a real HTTP client, `--requests` requests each, after one warm-up request:
   the sessions page, a 500-turn session's page, a turn page, the search page and the
   JSON search API, for a rare identifier, a path and a common word. Prints medians
   and 90th percentiles (ms); the target is a median under 100 ms.

--db: an empty database (default: SQLite in a temporary folder, deleted after unless
--keep); for Postgres postgresql+psycopg://USER:PASSWORD@HOST/DB. --reuse times an
already built database (--db) again without building.
"""

from __future__ import annotations

import argparse
import hashlib
import itertools
import json
import os
import random
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
import zlib
from pathlib import Path

import httpx

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from sqlalchemy import JSON, text  # noqa: E402

from proxy.store import content, search  # noqa: E402
from proxy.store.db import make_engine, migrate  # noqa: E402
from proxy.store.models import Blob, ChainNode, Session, ToolCallRow, Turn  # noqa: E402
from proxy.store.sessions import chain_root  # noqa: E402

UPSTREAM = "http://127.0.0.1:9"
TOOLS = ("read_file", "write_file", "run_command", "search_code")
RARE = "quokka_fixture_loader"  # an identifier in a handful of sessions
LONG_TURNS = 500


class Words:
    """Deterministic pseudo-text: a Zipf-ish vocabulary, identifiers and paths. Text is
    cut from pools made once (drawing each word as it is needed took most of the build)."""

    def __init__(self, seed: int = 7):
        self.rng = random.Random(seed)
        letters = "etaoinshrdlucmfwypvbgkjqxz"
        self.vocab = ["".join(self.rng.choices(letters, k=self.rng.randint(2, 9))) for _ in range(4000)]
        cum = list(itertools.accumulate(1 / (i + 1) for i in range(len(self.vocab))))
        self.idents = [f"{self.rng.choice(self.vocab)}_{self.rng.choice(self.vocab)}" for _ in range(3000)]
        self.paths = [f"src/{self.rng.choice(self.vocab)}/{self.rng.choice(self.vocab)}.py" for _ in range(2000)]
        self.pool = self.rng.choices(self.vocab, cum_weights=cum, k=1 << 20)
        self.lines = []
        for _ in range(1 << 14):
            fn, arg = self.rng.choice(self.idents), self.rng.choice(self.vocab)
            self.lines.append(f"def {fn}({arg}):  # {' '.join(self.rng.choices(self.vocab, cum_weights=cum, k=6))}")
            self.lines.append(f"    return {self.rng.choice(self.idents)}({arg}) + 1")

    def prose(self, n: int) -> str:
        at = self.rng.randrange(len(self.pool) - n)
        return " ".join(self.pool[at:at + n])

    def code(self, lines: int) -> str:
        at = self.rng.randrange(0, len(self.lines) - 2 * lines, 2)
        return "\n".join(self.lines[at:at + 2 * lines])


def h32(data: bytes) -> str:
    return hashlib.blake2b(data, digest_size=16).hexdigest()


class Builder:
    def __init__(self, engine, turns: int, sessions: int, long: int):
        self.engine, self.dialect = engine, engine.dialect.name
        self.turns, self.sessions, self.long = turns, sessions, long
        self.w = Words()
        self.turn_id = 0
        self.call_id = 0
        self.long_ids: list[str] = []
        self.a_turn: int | None = None
        system = [{"role": "system", "content": self.w.prose(900)}]
        tools = [{"type": "function", "function": {"name": n, "description": self.w.prose(40), "parameters": {
            "type": "object", "properties": {"path": {"type": "string"}, "text": {"type": "string"}}}}} for n in TOOLS]
        self.system_hash, self.tools_hash = content.content_hash(system), content.content_hash(tools)
        self.shared = [{"hash": self.system_hash, "data": content.pack(system)},
                       {"hash": self.tools_hash, "data": content.pack(tools)}]
        self.root = chain_root("openai.chat", UPSTREAM)

    def lengths(self) -> list[int]:
        """Turns per session: `long` of LONG_TURNS, the rest spread around the mean."""
        rest = self.turns - self.long * LONG_TURNS
        n = self.sessions - self.long
        mean = rest / n
        out = [max(2, int(self.w.rng.uniform(0.3, 1.7) * mean)) for _ in range(n)]
        i, diff = 0, rest - sum(out)
        while diff:  # the difference spread a turn at a time, not all on one session
            step = 1 if diff > 0 else -1
            if step > 0 or out[i % n] > 2:
                out[i % n] += step
                diff -= step
            i += 1
        return [LONG_TURNS] * self.long + out

    def build(self) -> None:
        started = time.monotonic()
        with self.engine.begin() as conn:
            conn.execute(Blob.__table__.insert(), self.shared)
        lengths = self.lengths()
        t0 = 1_760_000_000.0
        order = list(range(len(lengths)))
        self.w.rng.shuffle(order)  # long sessions are not all the newest
        pending: list[tuple[str, int, float]] = []
        done = 0
        for k, i in enumerate(order):
            pending.append((f"s{i:06d}", lengths[i], t0 + k * 60))
            if sum(n for _, n, _ in pending) >= 5000 or k == len(order) - 1:
                self._sessions(pending)
                done += sum(n for _, n, _ in pending)
                pending = []
                rate = done / (time.monotonic() - started)
                print(f"\r  built {done:,} / {self.turns:,} turns ({rate:,.0f}/s)", end="", file=sys.stderr, flush=True)
        print(file=sys.stderr)
        if self.dialect == "sqlite":
            with self.engine.begin() as conn:
                conn.execute(text("ANALYZE"))
        else:
            with self.engine.connect().execution_options(isolation_level="AUTOCOMMIT") as conn:
                conn.execute(text("VACUUM ANALYZE"))

    def _sessions(self, specs: list[tuple[str, int, float]]) -> None:
        blobs, nodes, turns, calls, sessions, messages = [], [], [], [], [], {}
        for sid, n, at in specs:
            self._session(sid, n, at, blobs, nodes, turns, calls, sessions, messages)
        with self.engine.begin() as conn:
            for model, rows in ((Blob, blobs), (ChainNode, nodes), (Turn, turns), (ToolCallRow, calls),
                                (Session, sessions)):
                insert(conn, model.__table__, rows)
            search.index_messages(conn, self.dialect, messages)

    def _session(self, sid, n, at, blobs, nodes, turns, calls, sessions, messages) -> None:
        w, rng = self.w, self.w.rng
        rare = rng.random() < 0.002
        if n == LONG_TURNS and len(self.long_ids) < self.long:
            self.long_ids.append(sid)
        task = f"{w.prose(rng.randint(15, 60))} in {rng.choice(w.paths)}" + (f" using {RARE}" if rare else "")
        history: list[str] = []  # the chain's message hashes
        chain: list[str] = []

        def add(message: dict) -> None:
            h = content.content_hash(message)
            blobs.append({"hash": h, "data": content.pack(message)})
            messages[h] = message
            prev = chain[-1] if chain else self.root
            node = content.digest((prev + h).encode())
            nodes.append({"hash": node, "parent": chain[-1] if chain else None, "message_hash": h,
                          "depth": len(chain) + 1, "session_id": sid})
            history.append(h)
            chain.append(node)

        add({"role": "user", "content": task})
        parent = None
        errors = calls_n = tin = tout = 0
        for i in range(n):
            self.turn_id += 1
            tid = self.turn_id
            started = at + i * 7
            last = i == n - 1
            tool = rng.choice(TOOLS)
            path = rng.choice(w.paths)
            args = json.dumps({"path": path, "text": w.prose(rng.randint(3, 12))} if tool == "write_file"
                              else {"path": path})
            answer = w.prose(rng.randint(10, 40))
            if last:
                response = {"id": "c", "object": "chat.completion", "model": "m-large", "choices": [
                    {"index": 0, "message": {"role": "assistant", "content": answer}, "finish_reason": "stop"}]}
            else:
                response = {"id": "c", "object": "chat.completion", "model": "m-large", "choices": [
                    {"index": 0, "message": {"role": "assistant", "content": answer, "tool_calls": [
                        {"id": f"call_{tid}", "type": "function", "function": {"name": tool, "arguments": args}}]},
                     "finish_reason": "tool_calls"}]}
            usage = {"prompt_tokens": 3000 + 400 * i, "completion_tokens": rng.randint(20, 300), "total_tokens": 0}
            raw = ("data: " + json.dumps(response) + "\n\ndata: [DONE]\n\n").encode()
            status = "upstream_error" if rng.random() < 0.01 else "ok"
            errors += status != "ok"
            tin += usage["prompt_tokens"]
            tout += usage["completion_tokens"]
            turns.append({
                "id": tid, "session_id": sid, "parent_id": parent, "api": "openai.chat", "method": "POST",
                "path": "/v1/chat/completions", "upstream": UPSTREAM, "http_status": 200, "status": status,
                "stream": True, "started_at": started, "ttft_ms": rng.uniform(200, 900),
                "duration_ms": rng.uniform(900, 9000), "model": "m-large",
                "request_skeleton": {"model": "m-large", "stream": True, "messages": None, "tools": None},
                "request_raw": None, "request_size": 8000 + 1500 * i, "chain_hash": chain[-1],
                "message_count": len(chain), "system_hash": self.system_hash, "tools_hash": self.tools_hash,
                "request_headers": [["content-type", "application/json"], ["authorization", "Bearer …abcd#"]],
                "response": content.pack(response), "response_headers": [["content-type", "text/event-stream"]],
                "usage": usage, "raw": zlib.compress(raw, 6), "raw_size": len(raw),
                "raw_sha256": hashlib.sha256(raw).hexdigest(), "content_type": "text/event-stream",
                "content_encoding": None, "timeline": content.pack([[0, 300.0], [len(raw), 900.0]]), "error": None,
                "stream_error": None, "tool_call_count": 0 if last else 1,
                "decoding": {"agent": "generic"}, "response_text": answer, "uid": uuid.uuid4().hex})
            parent = tid
            if self.a_turn is None and n > 40 and i == 30:
                self.a_turn = tid
            if last:
                break
            result = w.code(rng.randint(3, 25)) if tool in ("read_file", "search_code") else w.prose(rng.randint(5, 30))
            self.call_id += 1
            calls_n += 1
            calls.append({"id": self.call_id, "turn_id": tid, "index": 0, "call_id": f"call_{tid}", "name": tool,
                          "arguments_raw": args, "arguments": json.loads(args), "arguments_error": None,
                          "choice": 0, "source": "wire", "decoded": None, "task_progress": None,
                          "result": {"content": result, "is_error": False}, "violations": None})
            add(response["choices"][0]["message"])
            add({"role": "tool", "tool_call_id": f"call_{tid}", "content": result})
        sessions.append({"id": sid, "title": " ".join(task.split())[:200], "agent": "generic", "started_at": at,
                         "last_at": at + (n - 1) * 7, "turns": n, "tool_calls": calls_n, "input_tokens": tin,
                         "output_tokens": tout, "errors": errors, "models": ["m-large"], "uids": None})


def insert(conn, table, rows: list[dict]) -> None:
    """Rows straight to the driver (SQLAlchemy's per-value processing doubled the build):
    JSON columns as JSON text."""
    if not rows:
        return
    cols = list(rows[0])
    as_json = {c for c in cols if isinstance(table.c[c].type, JSON)}
    mark = "?" if conn.dialect.name == "sqlite" else "%s"
    sql = (f"INSERT INTO {table.name} ({', '.join(f'{chr(34)}{c}{chr(34)}' for c in cols)}) "
           f"VALUES ({', '.join([mark] * len(cols))})")
    values = [tuple((None if r[c] is None else json.dumps(r[c])) if c in as_json else r[c] for c in cols)
              for r in rows]
    cur = conn.connection.dbapi_connection.cursor()
    cur.executemany(sql, values)
    cur.close()


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def serve(db_url: str, workdir: str) -> tuple[subprocess.Popen, str]:
    port = free_port()
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    proc = subprocess.Popen([sys.executable, "-m", "proxy", "serve", "--db", db_url, "--upstream", UPSTREAM,
                             "--port", str(port), "--log-level", "warning",
                             "--spool", os.path.join(workdir, "spool.jsonl")],
                            cwd=workdir, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        try:
            if httpx.get(url + "/_tooltap/api/health", timeout=2).status_code == 200:
                return proc, url
        except httpx.HTTPError:
            time.sleep(0.2)
        if proc.poll() is not None:
            raise RuntimeError("tooltap serve exited: " + proc.stderr.read().decode()[-2000:])
    raise RuntimeError("tooltap serve did not start")


def timed(client: httpx.Client, path: str, n: int, params: dict | None = None) -> tuple[float, float, int]:
    r = client.get(path, params=params)
    r.raise_for_status()
    times = []
    for _ in range(n):
        t = time.perf_counter()
        r = client.get(path, params=params)
        times.append((time.perf_counter() - t) * 1000)
        r.raise_for_status()
    times.sort()
    return statistics.median(times), times[int(0.9 * (len(times) - 1))], len(r.content)


def measure(url: str, engine, n: int, long_id: str, a_turn: int) -> list[tuple[str, float, float, int, str]]:
    with engine.connect() as c:
        common = c.execute(text("SELECT title FROM sessions ORDER BY last_at DESC LIMIT 1")).scalar().split()[0]
        path = c.execute(text("SELECT arguments_raw FROM tool_calls ORDER BY id DESC LIMIT 1")).scalar()
    path = json.loads(path)["path"]
    rows = []
    with httpx.Client(base_url=url, timeout=120) as client:
        def row(name, p, params=None, note=""):
            med, p90, size = timed(client, p, n, params)
            rows.append((name, med, p90, size, note))
            print(f"  {name:<40} median {med:8.1f} ms  p90 {p90:8.1f} ms  {size:>9,} B  {note}", file=sys.stderr)

        row("sessions page", "/_tooltap/")
        row("session page, 500 turns", f"/_tooltap/sessions/{long_id}")
        row("turn page (turn 31 of a session)", f"/_tooltap/turns/{a_turn}")
        for label, q in (("rare identifier", RARE), ("path", path), ("common word", common)):
            found = client.get("/_tooltap/api/search", params={"q": q}).json()
            note = f"q={q!r}: {len(found['sessions'])}{'+' if found['next'] else ''} sessions"
            row(f"search page, {label}", "/_tooltap/", {"q": q}, note)
            row(f"search API, {label}", "/_tooltap/api/search", {"q": q}, note)
    return rows


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--turns", type=int, default=1_000_000)
    ap.add_argument("--sessions", type=int, default=20_000)
    ap.add_argument("--long", type=int, default=3, help="sessions of 500 turns")
    ap.add_argument("--db", help="an empty database URL (default: SQLite in a temporary folder)")
    ap.add_argument("--requests", type=int, default=30, help="timed requests per page (0: build only)")
    ap.add_argument("--keep", action="store_true", help="keep the SQLite file")
    ap.add_argument("--reuse", action="store_true", help="time the database given with --db, already built")
    args = ap.parse_args()
    workdir = tempfile.mkdtemp(prefix="tooltap-scale-", dir=os.environ.get("TOOLTAP_SCALE_DIR"))
    db_url = args.db or f"sqlite:///{workdir}/scale.db"
    engine = make_engine(db_url)
    try:
        if not args.reuse:
            migrate(engine)
            print(f"scale: building {args.turns:,} turns in {args.sessions:,} sessions ({engine.dialect.name})",
                  file=sys.stderr)
            started = time.monotonic()
            b = Builder(engine, args.turns, args.sessions, args.long)
            b.build()
            build_s = time.monotonic() - started
            long_id, a_turn = b.long_ids[0], b.a_turn
        else:
            build_s = 0.0
            with engine.connect() as c:
                args.turns = c.execute(text("SELECT count(*) FROM turns")).scalar()  # as built, for the results
                args.sessions = c.execute(text("SELECT count(*) FROM sessions")).scalar()
                long_id = c.execute(text(f"SELECT id FROM sessions WHERE turns = {LONG_TURNS} LIMIT 1")).scalar()
                a_turn = c.execute(text("SELECT min(id) + 30 FROM turns WHERE session_id = "
                                        "(SELECT id FROM sessions WHERE turns > 40 LIMIT 1)")).scalar()
        size = ""
        if engine.dialect.name == "sqlite":
            db_file = Path(db_url[len("sqlite:///"):])
            with engine.begin() as c:
                c.execute(text("PRAGMA wal_checkpoint(TRUNCATE)"))
            size = f", {db_file.stat().st_size / 1e9:.2f} GB"
        print(f"scale: built in {build_s:.0f} s{size}; timing {args.requests} requests per page", file=sys.stderr)
        if not args.requests:
            return
        proc, url = serve(db_url, workdir)
        try:
            rows = measure(url, engine, args.requests, long_id, a_turn)
        finally:
            proc.terminate()
            proc.wait(30)
        out = {"turns": args.turns, "sessions": args.sessions, "dialect": engine.dialect.name,
               "build_seconds": round(build_s), "load": os.getloadavg(),
               "pages": [{"page": r[0], "median_ms": round(r[1], 1), "p90_ms": round(r[2], 1), "bytes": r[3],
                          "note": r[4]} for r in rows]}
        results = ROOT / "bench" / "results"
        results.mkdir(exist_ok=True)
        name = results / f"scale-{engine.dialect.name}-{args.turns}-{time.strftime('%Y%m%d-%H%M%S')}.json"
        name.write_text(json.dumps(out, indent=2))
        print(f"\n{'page':<40} {'median ms':>10} {'p90 ms':>8}  (target: median < 100 ms)")
        for r in rows:
            print(f"{r[0]:<40} {r[1]:>10.1f} {r[2]:>8.1f}  {'ok' if r[1] < 100 else 'MISSED'}  {r[4]}")
        print(f"results: {name}")
    finally:
        engine.dispose()
        if not args.keep:
            shutil.rmtree(workdir, ignore_errors=True)
        else:
            print(f"kept: {workdir}", file=sys.stderr)


if __name__ == "__main__":
    main()
