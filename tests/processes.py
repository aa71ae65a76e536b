"""A real `tooltap serve` (or `demo`) in a subprocess, for tests that signal it, and a
count of the turns it left behind (database and spool)."""

from __future__ import annotations

import json
import os
import signal
import sqlite3
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import httpx

from tests.conftest import free_port

REPO = Path(__file__).resolve().parent.parent


@dataclass
class Tooltap:
    proc: subprocess.Popen
    port: int
    db: Path
    log: Path  # stderr and stdout

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def signal(self, sig: int, group: bool = False) -> None:
        """`group`: to the whole process group, as a terminal sends Ctrl-C or SIGHUP."""
        if group:
            os.killpg(self.proc.pid, sig)
        else:
            self.proc.send_signal(sig)

    def wait(self, timeout: float) -> int:
        """The exit code; kills it (and fails the caller's timing) if it takes longer."""
        try:
            return self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            self.dump_stacks()
            time.sleep(1)
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait(5)
            raise AssertionError(f"tooltap still running {timeout} s later:\n{self.output()}")

    def dump_stacks(self) -> None:
        """Every thread's stack, of tooltap and its writer, into the log (proxy/stacks.py)."""
        for pid in group_members(self.proc.pid):
            try:
                if "resource_tracker" not in Path(f"/proc/{pid}/cmdline").read_text():  # it has no handler
                    os.kill(pid, signal.SIGUSR1)
            except OSError:
                pass

    def output(self) -> str:
        return self.log.read_text(errors="replace")

    def turns(self) -> list[dict]:
        """Every turn stored or spooled: {"session", "status", "error", "raw_size", "where"}."""
        rows = []
        if self.db.exists():
            with sqlite3.connect(self.db) as c:
                for session, status, error, size in c.execute(
                        "SELECT session_id, status, error, raw_size FROM turns ORDER BY id"):
                    rows.append({"session": session, "status": status, "error": error, "raw_size": size,
                                 "where": "db"})
        spool = Path(f"{self.db}.spool.jsonl")
        for path in (spool, Path(f"{spool}.replaying")):
            if path.exists():
                for line in path.read_text().splitlines():
                    if line.strip():
                        t = json.loads(line)
                        rows.append({"session": t["session_hint"], "status": t["status"], "error": t["error"],
                                     "raw_size": t["raw_size"], "where": "spool"})
        return rows


def start(tmp_path: Path, *args: str, command: str = "serve", env: dict | None = None,
          limits=None, ready: str = "/_tooltap/api/sessions") -> Tooltap:
    """`python -m proxy COMMAND ARGS --port P` in its own process group (so a signal to
    the group reaches tooltap and its writer, as from a terminal, and nothing else)."""
    port = free_port()
    db = tmp_path / "tooltap.db"
    log = tmp_path / f"tooltap-{port}.log"
    cmd = [sys.executable, "-m", "proxy", command, *args, "--port", str(port)]
    if command == "serve":
        cmd += ["--db", f"sqlite:///{db}"]
    full_env = {**os.environ, **(env or {})}
    for name in ("TOOLTAP_UPSTREAM", "TOOLTAP_DB", "TOOLTAP_SPOOL", "TOOLTAP_SHUTDOWN_GRACE"):
        if name not in (env or {}):
            full_env.pop(name, None)

    def child_setup():
        if limits is not None:
            import resource

            resource.setrlimit(resource.RLIMIT_NOFILE, limits)

    with open(log, "wb") as out:
        proc = subprocess.Popen(cmd, cwd=REPO, env=full_env, stdout=out, stderr=subprocess.STDOUT,
                                start_new_session=True, preexec_fn=child_setup if limits else None)
    tt = Tooltap(proc, port, db, log)
    deadline = time.monotonic() + 20
    while True:
        if proc.poll() is not None:
            raise AssertionError(f"tooltap exited with {proc.returncode}:\n{tt.output()}")
        try:
            if httpx.get(tt.url + ready, timeout=1).status_code == 200:
                return tt
        except httpx.HTTPError:
            pass
        if time.monotonic() > deadline:
            tt.signal(signal.SIGKILL, group=True)
            raise AssertionError(f"tooltap did not answer in 20 s:\n{tt.output()}")
        time.sleep(0.05)


def group_members(pgid: int) -> list[int]:
    """Live processes of a process group (zombies aside)."""
    found = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                stat = Path(f"/proc/{entry}/stat").read_text()
            except OSError:
                continue
            fields = stat.rsplit(")", 1)[1].split()
            if fields[0] != "Z" and int(fields[2]) == pgid:
                found.append(int(entry))
    return found


def leftovers(pgid: int, timeout: float = 3.0) -> list[str]:
    """The command lines of a group's processes still alive `timeout` s from now (the
    resource tracker exits a moment after its last user)."""
    deadline = time.monotonic() + timeout
    while (pids := group_members(pgid)) and time.monotonic() < deadline:
        time.sleep(0.05)
    out = []
    for pid in pids:
        try:
            out.append(Path(f"/proc/{pid}/cmdline").read_text().replace("\0", " ").strip())
        except OSError:
            pass
    return out


def soft_fd_limit(pid: int) -> int:
    for line in Path(f"/proc/{pid}/limits").read_text().splitlines():
        if line.startswith("Max open files"):
            return int(line.split()[3])
    raise AssertionError("no open-file limit in /proc")
