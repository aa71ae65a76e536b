"""The fault suite: a real `tooltap serve` under load, then a fault; each scenario prints
the turns its agents got an answer for against the turns tooltap stored (database plus
spool). Exits 1 if any answered turn is missing or stored twice.

    python bench/faults.py              # every scenario, ~2 minutes
    python bench/faults.py sigterm hup  # some of them (names below)

Scenarios (32 agents streaming at once; each request has its own session id):
  sigterm     SIGTERM to tooltap (docker stop), streams open
  hup         SIGHUP to the process group (the terminal closed), streams open
  int         SIGINT to the process group (Ctrl-C), streams open
  int2        two Ctrl-C half a second apart
  writer      SIGKILL of the writer process under load, then a normal stop
  reset       the upstream resets the connection mid-stream
  stall       the upstream stops sending mid-stream (--read-timeout 2)
  utf8        the upstream streams invalid UTF-8
  chunked     the upstream breaks its chunked framing mid-stream
  slow        300 silent connections and 50 that send a byte at a time, while agents work
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import signal
import socket
import sqlite3
import subprocess
import sys
import tempfile
import threading
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

from common import REPO, free_port, table, tooltap_cmd

sys.path.insert(0, str(REPO))

import httpx  # noqa: E402

AGENTS = 32
EVENT = (b'data: {"id":"c","object":"chat.completion.chunk","created":1,"model":"m",'
         b'"choices":[{"index":0,"delta":{"content":"word "}}]}\n\n')
BAD_UTF8 = b'data: {"choices":[{"index":0,"delta":{"content":"\xff\xfe caf\xc3"}}]}\n\n'
HEAD = b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ntransfer-encoding: chunked\r\n\r\n"


def chunk(data: bytes) -> bytes:
    return b"%x\r\n" % len(data) + data + b"\r\n"


# -- the upstream: raw sockets, so it can break HTTP on purpose ----------------------------

def script(path: str) -> tuple[list, str]:
    """What the upstream writes for `path`: bytes and pauses, then how it ends."""
    stream = [HEAD] + [x for _ in range(20) for x in (chunk(EVENT), 0.05)]
    done = [chunk(b"data: [DONE]\n\n"), b"0\r\n\r\n"]
    if path.startswith("/long"):  # 30 s: still open when a stop's grace runs out
        return [HEAD] + [x for _ in range(300) for x in (chunk(EVENT), 0.1)] + done, "close"
    if path.startswith("/reset"):
        return stream[:11], "reset"
    if path.startswith("/stall"):
        return stream[:11] + [30.0], "close"
    if path.startswith("/utf8"):
        return stream[:5] + [chunk(BAD_UTF8)] + stream[5:] + done, "keep"
    if path.startswith("/chunked"):
        return stream[:11] + [b"zz\r\nnot a chunk\r\n", 30.0], "close"
    return stream + done, "keep"


class Upstream:
    def __init__(self):
        self.ready = threading.Event()
        threading.Thread(target=lambda: asyncio.run(self._serve()), daemon=True).start()
        self.ready.wait(10)

    async def _serve(self):
        server = await asyncio.start_server(self._connection, "127.0.0.1", 0, backlog=1024)
        self.url = f"http://127.0.0.1:{server.sockets[0].getsockname()[1]}"
        self.ready.set()
        await server.serve_forever()

    async def _connection(self, reader, writer):
        try:
            while True:
                head = await reader.readuntil(b"\r\n\r\n")
                path = head.split(b" ", 2)[1].decode()
                length = next((int(line.split(b":")[1]) for line in head.split(b"\r\n")
                               if line.lower().startswith(b"content-length:")), 0)
                await reader.readexactly(length)
                parts, end = script(path)
                for part in parts:
                    if isinstance(part, float):
                        await asyncio.sleep(part)
                    else:
                        writer.write(part)
                        await writer.drain()
                if end == "reset":
                    writer.get_extra_info("socket").setsockopt(
                        socket.SOL_SOCKET, socket.SO_LINGER, b"\x01\x00\x00\x00\x00\x00\x00\x00")
                if end != "keep":
                    break
        except (asyncio.IncompleteReadError, ConnectionError, asyncio.CancelledError):
            pass
        writer.close()


# -- tooltap and its agents ----------------------------------------------------------------

@dataclass
class Tooltap:
    proc: subprocess.Popen
    url: str
    db: Path
    log: Path

    @classmethod
    def start(cls, folder: Path, upstream: str, *args: str) -> "Tooltap":
        port = free_port()
        db, log = folder / "faults.db", folder / "tooltap.log"
        env = {k: v for k, v in os.environ.items() if not k.startswith("TOOLTAP_")}
        with open(log, "wb") as out:
            proc = subprocess.Popen([*tooltap_cmd(), "serve", "--upstream", upstream, "--db", f"sqlite:///{db}",
                                     "--port", str(port), *args], cwd=folder, env=env, stdout=out,
                                    stderr=subprocess.STDOUT, start_new_session=True)
        tt = cls(proc, f"http://127.0.0.1:{port}", db, log)
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline and proc.poll() is None:
            try:
                httpx.get(tt.url + "/_tooltap/api/health", timeout=1)
                return tt
            except httpx.HTTPError:
                time.sleep(0.1)
        raise SystemExit(f"tooltap did not start:\n{log.read_text()}")

    def stop(self, sig=signal.SIGTERM, group=False, timeout=15.0) -> float:
        started = time.monotonic()
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, sig) if group else self.proc.send_signal(sig)
        try:
            self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait()
        return time.monotonic() - started

    def writer_pid(self) -> int | None:
        for entry in os.listdir("/proc"):
            if not entry.isdigit():
                continue
            try:
                stat = Path(f"/proc/{entry}/stat").read_text().rsplit(")", 1)[1].split()
                cmd = Path(f"/proc/{entry}/cmdline").read_bytes()
            except OSError:
                continue
            if int(stat[1]) == self.proc.pid and b"spawn_main" in cmd:
                return int(entry)
        return None

    def stored(self) -> dict[str, dict]:
        """session id -> turn, from the database and the spool; a second copy is counted."""
        rows: list[tuple[str, str, str | None]] = []
        if self.db.exists():
            with sqlite3.connect(self.db) as c:
                rows += c.execute("SELECT session_id, status, error FROM turns").fetchall()
        for path in (Path(f"{self.db}.spool.jsonl"), Path(f"{self.db}.spool.jsonl.replaying")):
            if path.exists():
                for line in path.read_text().splitlines():
                    if line.strip():
                        t = json.loads(line)
                        rows.append((t["session_hint"], t["status"], t["error"]))
        out: dict[str, dict] = {}
        for session, status, error in rows:
            if session in out:
                out[session]["copies"] += 1
            else:
                out[session] = {"status": status, "error": error, "copies": 1}
        return out


@dataclass
class Agents:
    """AGENTS workers, each streaming one request after another until told to stop."""

    url: str
    paths: list[str]
    answered: dict[str, str] = field(default_factory=dict)  # session -> how it ended
    started: int = 0
    _n: int = 0

    async def run(self, stop: asyncio.Event) -> None:
        limits = httpx.Limits(max_connections=AGENTS * 2)
        async with httpx.AsyncClient(timeout=60, limits=limits) as client:
            await asyncio.gather(*(self._worker(client, i, stop) for i in range(AGENTS)))

    async def _worker(self, client, i: int, stop: asyncio.Event) -> None:
        path = self.paths[i % len(self.paths)]
        while not stop.is_set():
            self._n += 1
            session = f"agent{i}-{self._n}"
            body = {"model": "m", "stream": True, "messages": [{"role": "user", "content": session}]}
            try:
                async with client.stream("POST", self.url + path, json=body,
                                         headers={"x-tooltap-session": session}) as r:
                    self.answered[session] = "open"  # tooltap took it on: it must be recorded
                    self.started += 1
                    async for _ in r.aiter_raw():
                        pass
                    self.answered[session] = str(r.status_code)
            except httpx.HTTPError as exc:
                if session in self.answered:
                    self.answered[session] = type(exc).__name__
                else:
                    await asyncio.sleep(0.05)  # refused: tooltap is stopping


@dataclass
class Result:
    name: str
    answered: int
    stored: int
    lost: int
    twice: int
    statuses: str
    note: str
    ok: bool


def count(name: str, agents: Agents, tt: Tooltap, note: str, expect: set[str] | None = None) -> Result:
    stored = tt.stored()
    lost = [s for s in agents.answered if s not in stored]
    twice = sum(t["copies"] > 1 for t in stored.values())
    statuses = Counter(stored[s]["status"] for s in agents.answered if s in stored)
    unexpected = expect is not None and not set(statuses) <= expect
    text = " ".join(f"{k}:{v}" for k, v in sorted(statuses.items()))
    return Result(name, len(agents.answered), len(stored), len(lost), twice, text,
                  note + (" UNEXPECTED STATUS" if unexpected else ""), not lost and not twice and not unexpected)


async def load(tt: Tooltap, paths: list[str], seconds: float, then=None) -> Agents:
    """Agents on `paths` for `seconds`; `then()` (in a thread) runs at that point while
    they go on, and they stop when it returns."""
    agents, stop = Agents(tt.url, paths), asyncio.Event()
    running = asyncio.create_task(agents.run(stop))
    await asyncio.sleep(seconds)
    if then is not None:
        await asyncio.to_thread(then)
    stop.set()
    await running
    return agents


# -- scenarios -------------------------------------------------------------------------------

async def signal_scenario(name, folder, up, sig, group=False, twice=False) -> Result:
    tt = Tooltap.start(folder, up.url)
    took = []

    def stop():
        if twice:
            os.killpg(tt.proc.pid, sig) if group else tt.proc.send_signal(sig)
            time.sleep(0.5)
        took.append(tt.stop(sig, group=group))

    agents = await load(tt, ["/stream", "/long"], 2.0, stop)
    return count(name, agents, tt, f"exit {tt.proc.returncode} in {took[0]:.1f} s",
                 {"ok", "proxy_error"})


async def writer_kill(folder, up) -> Result:
    tt = Tooltap.start(folder, up.url)
    killed = []

    def kill_then_stop():
        pid = tt.writer_pid()
        if pid:
            os.kill(pid, signal.SIGKILL)
            killed.append(pid)
        time.sleep(3)
        tt.stop()

    agents = await load(tt, ["/stream"], 2.0, kill_then_stop)
    return count("writer", agents, tt, f"writer {'killed' if killed else 'NOT FOUND'}", {"ok", "proxy_error"})


async def upstream_fault(name, folder, up, path, expect, *args) -> Result:
    tt = Tooltap.start(folder, up.url, *args)
    agents = await load(tt, [path], 5.0)
    took = tt.stop()
    return count(name, agents, tt, f"stopped in {took:.1f} s", expect)


async def slow_clients(folder, up) -> Result:
    tt = Tooltap.start(folder, up.url)
    port = int(tt.url.rsplit(":", 1)[1])
    socks = [socket.create_connection(("127.0.0.1", port)) for _ in range(350)]
    stop = threading.Event()

    def dribble():
        head = b"POST /stream HTTP/1.1\r\nhost: x\r\ncontent-length: 10\r\n\r\n0123456789"
        for i in range(len(head)):
            for s in socks[300:]:
                try:
                    s.send(head[i:i + 1])
                except OSError:
                    pass
            if stop.wait(0.5):
                return

    threading.Thread(target=dribble, daemon=True).start()
    agents = await load(tt, ["/stream"], 12.0)  # longer than the 10 s a request head may take
    closed = sum(closed_by_peer(s) for s in socks)
    stop.set()
    tt.stop()
    for s in socks:
        s.close()
    return count("slow", agents, tt, f"{closed} of 350 slow connections closed by tooltap", {"ok"})


def closed_by_peer(sock: socket.socket) -> bool:
    sock.setblocking(False)
    try:
        while sock.recv(65536):  # a 408 first, for those that had started a head
            pass
        return True
    except BlockingIOError:
        return False
    except OSError:
        return True


async def main(names: list[str]) -> int:
    up = Upstream()
    scenarios = {
        "sigterm": lambda f: signal_scenario("sigterm", f, up, signal.SIGTERM),
        "hup": lambda f: signal_scenario("hup", f, up, signal.SIGHUP, group=True),
        "int": lambda f: signal_scenario("int", f, up, signal.SIGINT, group=True),
        "int2": lambda f: signal_scenario("int2", f, up, signal.SIGINT, group=True, twice=True),
        "writer": lambda f: writer_kill(f, up),
        "reset": lambda f: upstream_fault("reset", f, up, "/reset", {"upstream_aborted"}),
        "stall": lambda f: upstream_fault("stall", f, up, "/stall", {"upstream_aborted"}, "--read-timeout", "2"),
        "utf8": lambda f: upstream_fault("utf8", f, up, "/utf8", {"ok"}),
        "chunked": lambda f: upstream_fault("chunked", f, up, "/chunked", {"upstream_aborted"}),
        "slow": lambda f: slow_clients(f, up),
    }
    unknown = set(names) - set(scenarios)
    if unknown:
        raise SystemExit(f"unknown scenario(s): {', '.join(sorted(unknown))}; see --help")
    results = []
    for name in names or scenarios:
        with tempfile.TemporaryDirectory(prefix=f"tooltap-faults-{name}-") as folder:
            print(f"{name} ...", flush=True)
            result = await scenarios[name](Path(folder))
            results.append(result)
            log = (Path(folder) / "tooltap.log").read_text(errors="replace")
            if "Traceback" in log:
                result.note += " TRACEBACK IN LOG"
                result.ok = False
    print()
    print(table([[r.name, r.answered, r.stored, r.lost, r.twice, r.statuses, r.note] for r in results],
                ["scenario", "answered", "stored", "lost", "twice", "statuses", "note"]))
    failed = [r.name for r in results if not r.ok]
    print(f"\n{'FAILED: ' + ', '.join(failed) if failed else 'zero turns lost, none stored twice'}")
    return 1 if failed else 0


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("scenarios", nargs="*", help="names from the list above (default: all)")
    sys.exit(asyncio.run(main(parser.parse_args().scenarios)))
