"""`kill -USR1 PID` prints where every thread of a tooltap process is, on its stderr:
what to attach to a report of a hang (`tooltap serve`, `demo`, and the writer process)."""

from __future__ import annotations

import faulthandler
import signal


def dump_on_sigusr1() -> None:
    if hasattr(signal, "SIGUSR1"):
        faulthandler.register(signal.SIGUSR1, all_threads=True)
