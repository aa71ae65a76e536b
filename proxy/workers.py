"""`tooltap serve --workers N`: N tooltap processes serving one port, one core each.

Each worker is a whole tooltap (its event loop, its writer process, its journal slot) and
binds the port with SO_REUSEPORT, so the kernel spreads the agents' connections across
them. They share the database as separate instances on separate hosts do: a
conversation's turns may reach different workers and still thread into one session
(store/sessions.py), and every worker's inspector shows all their turns live
(store/peers.py).

The process started by the command only supervises: it checks the port and the
database once, starts the workers (this same command, told which worker each is),
passes stop signals on (the workers stop as one tooltap does, losing no turn), and
replaces a worker that dies. Worker 0 uses the spool; each other worker has its own
beside it (a spool has one reader), and a spool left by a worker that no longer exists
(fewer workers than last time) is handed to worker 0 at start. The journals share one
folder, in which each worker takes a slot and the next start adopts any left behind.
"""

from __future__ import annotations

import ctypes
import glob
import logging
import os
import re
import signal
import subprocess
import sys
import time

log = logging.getLogger("tooltap")

WORKER_ENV = "TOOLTAP_WORKER"
STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)
QUICK_DEATH = 5.0  # a worker that dies this soon after starting, three times, stops them all


def worker_index() -> int | None:
    """Which worker this process is, or None when it is not one of `serve --workers N`."""
    value = os.environ.get(WORKER_ENV)
    return int(value) if value and value.isdigit() else None


def worker_spool(spool_file: str, index: int) -> str:
    return spool_file if index == 0 else f"{spool_file}.worker{index}"


def adopt_left_over_spools(spool_file: str, workers: int, kind: str = "worker") -> int:
    """Append the spools of workers beyond `workers` to worker 0's; returns how many.
    (`kind` "writer": the same for the writers of one tooltap, store/shards.py; a
    former worker's writers' spools go with the worker's.)"""
    adopted = 0
    for path in sorted(glob.glob(glob.escape(spool_file) + f".{kind}*")):
        m = re.fullmatch(re.escape(spool_file) + rf"\.{kind}(\d+)(\.writer\d+)?(\.replaying)?", path)
        if not m or int(m.group(1)) < workers:
            continue
        with open(path, "rb") as src, open(spool_file, "ab") as dst:
            data = src.read()
            if data and not data.endswith(b"\n"):
                data += b"\n"
            dst.write(data)
            dst.flush()
            os.fsync(dst.fileno())
        os.remove(path)
        adopted += 1
    return adopted


def _die_with_parent() -> None:
    """In the worker, before it runs: a supervisor that is killed takes its workers along."""
    try:
        ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        pass


class Supervisor:
    def __init__(self, workers: int, spool_file: str, journal: str):
        self.count = workers
        self.argv = [sys.executable, "-m", "proxy", *sys.argv[1:]]
        self.env = {**os.environ, "TOOLTAP_JOURNAL": journal}
        self.spool_file = spool_file
        self.procs: dict[int, subprocess.Popen] = {}
        self.started: dict[int, float] = {}
        self.quick_deaths = 0
        self.stopping = False

    def _start(self, index: int) -> None:
        env = {**self.env, WORKER_ENV: str(index)}
        # A session of its own: a Ctrl-C or a closed terminal reaches the supervisor only,
        # which passes it on once (a second signal means "cut the open streams now").
        self.procs[index] = subprocess.Popen(self.argv, env=env, start_new_session=True,
                                             preexec_fn=_die_with_parent)
        self.started[index] = time.monotonic()

    def _signal(self, sig: int, _frame) -> None:
        self.stopping = True
        for proc in self.procs.values():
            if proc.poll() is None:
                proc.send_signal(sig)

    def run(self) -> int:
        adopted = adopt_left_over_spools(self.spool_file, self.count)
        if adopted:
            log.info("handed %d spool(s) of former workers to worker 0", adopted)
        previous = {sig: signal.signal(sig, self._signal) for sig in STOP_SIGNALS}
        try:
            for i in range(self.count):
                self._start(i)
            while True:
                time.sleep(0.2)
                alive = [p for p in self.procs.values() if p.poll() is None]
                if self.stopping:
                    if not alive:
                        break
                    continue
                for index, proc in list(self.procs.items()):
                    if proc.poll() is None:
                        continue
                    quick = time.monotonic() - self.started[index] < QUICK_DEATH
                    self.quick_deaths += quick
                    if self.quick_deaths >= 3:
                        log.error("workers keep exiting as they start; stopping")
                        self._signal(signal.SIGTERM, None)
                        break
                    log.error("worker %d exited (code %s); starting another", index, proc.returncode)
                    self._start(index)
        finally:
            for sig, handler in previous.items():
                signal.signal(sig, handler)
        codes = [p.returncode for p in self.procs.values()]
        return 0 if self.quick_deaths < 3 and all(c == 0 for c in codes) else 1
