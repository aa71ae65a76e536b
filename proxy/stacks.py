"""`kill -USR1 PID` prints where every thread of a tooltap process is, on its stderr:
what to attach to a report of a hang (`tooltap serve`, `demo`, and the writer process)."""

from __future__ import annotations

import faulthandler
import io
import signal


def dump_on_sigusr1() -> None:
    try:
        faulthandler.register(signal.SIGUSR1, all_threads=True)
    except (io.UnsupportedOperation, AttributeError, ValueError, RuntimeError):
        pass  # a stderr with no file descriptor (click's test runner, an embedding host)
