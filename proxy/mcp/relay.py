"""The stdio relay: run an MCP server as a child and stand between it and the agent.

Three threads copy bytes as they come, with no buffering: the agent's stdin to the
server's stdin, the server's stdout to ours, its stderr to ours. Each read is written on
whole, at once; the lines it completes are handed to the recorder first (a queue put;
parsing and storage happen in the recorder's thread). Signals sent to the wrapper go to the server (which runs in a
process group of its own, so a Ctrl-C in a terminal reaches it once, through us); the
wrapper exits as the server did: with its exit code, or killed by the same signal. A
wrapper killed outright (an agent's SIGKILL after a server ignored its SIGTERM) takes
the server with it on Linux, where the kernel can be asked to: it would be left running.
"""

from __future__ import annotations

import ctypes
import os
import signal
import subprocess
import sys
import threading
import time
from collections import deque
from typing import Callable

from .messages import FROM_SERVER, TO_SERVER, Lines

READ_SIZE = 1 << 16
STDERR_TAIL = 4096  # bytes of the server's stderr kept with its connection (a crash's last words)
FORWARDED = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP, signal.SIGQUIT, signal.SIGUSR1, signal.SIGUSR2)
PR_SET_PDEATHSIG = 1  # linux/prctl.h
DRAIN_SECONDS = 2.0  # after the server exits: how long its pipes may stay open (a grandchild holding them)

Record = Callable[[str, bytes, float, "str | None"], None]  # direction, line, time, note


class StartError(Exception):
    """The server could not be started; `exit_code` is what a shell would return."""

    def __init__(self, message: str, exit_code: int):
        super().__init__(message)
        self.exit_code = exit_code


def _dies_with(parent: int):
    """For the child, between fork and exec: SIGKILL when the wrapper dies (Linux's
    PR_SET_PDEATHSIG; Popen is called from the main thread, whose end is the process's)."""
    if not sys.platform.startswith("linux"):
        return None
    try:
        prctl = ctypes.CDLL(None, use_errno=True).prctl  # looked up here: no import in the child
    except (OSError, AttributeError):
        return None

    def arm() -> None:
        prctl(PR_SET_PDEATHSIG, signal.SIGKILL)
        if os.getppid() != parent:  # the wrapper died before the request was made
            os.kill(os.getpid(), signal.SIGKILL)

    return arm


class Relay:
    def __init__(self, argv: list[str], record: Record, *, stdin: int = 0, stdout: int = 1, stderr: int = 2):
        self.argv = argv
        self.record = record
        self.fds = (stdin, stdout, stderr)
        self.proc: subprocess.Popen | None = None
        self.stderr_tail: deque[bytes] = deque()
        self._tail_size = 0
        self._early: list[int] = []  # signals that came before the server was running
        self._previous: dict = {}

    def start(self) -> None:
        # Before the server starts, not once it runs: a signal in between (the agent gives
        # up while the wrapper opens its database) would otherwise kill the wrapper alone.
        self._previous = {s: signal.signal(s, self._forward) for s in FORWARDED}
        try:
            self._start()
        except BaseException:
            self._restore()
            raise
        for signum in self._early:
            self._forward(signum, None)

    def _start(self) -> None:
        try:
            self.proc = subprocess.Popen(self.argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                         stderr=subprocess.PIPE, bufsize=0, process_group=0,
                                         preexec_fn=_dies_with(os.getpid()))
        except FileNotFoundError:
            raise StartError(f"tooltap mcp: cannot run {self.argv[0]!r}: command not found", 127) from None
        except PermissionError:
            raise StartError(f"tooltap mcp: cannot run {self.argv[0]!r}: permission denied", 126) from None
        except OSError as exc:
            raise StartError(f"tooltap mcp: cannot run {self.argv[0]!r}: {exc.strerror or exc}", 126) from None
        stdin, stdout, stderr = self.fds
        self._threads = [
            threading.Thread(target=self._pump, args=(stdin, self.proc.stdin, TO_SERVER), daemon=True,
                             name="mcp-stdin"),
            threading.Thread(target=self._pump, args=(self.proc.stdout.fileno(), stdout, FROM_SERVER),
                             daemon=True, name="mcp-stdout"),
            threading.Thread(target=self._pump_stderr, args=(self.proc.stderr.fileno(), stderr), daemon=True,
                             name="mcp-stderr"),
        ]
        for t in self._threads:
            t.start()

    def wait(self) -> int:
        """Forward signals until the server exits; its return code (negative: killed by
        that signal). Then let its last output through."""
        try:
            code = self.proc.wait()
        finally:
            self._restore()
        deadline = time.monotonic() + DRAIN_SECONDS
        for t in self._threads[1:]:
            t.join(max(0.0, deadline - time.monotonic()))
        return code

    def stderr_text(self) -> str | None:
        data = b"".join(self.stderr_tail)
        return data.decode("utf-8", "replace") if data else None

    # -- the pumps ------------------------------------------------------------------------

    def _restore(self) -> None:
        for s, handler in self._previous.items():
            signal.signal(s, handler)
        self._previous = {}

    def _forward(self, signum, _frame) -> None:
        if self.proc is None:
            self._early.append(signum)
            return
        try:
            self.proc.send_signal(signum)
        except ProcessLookupError:
            pass

    def _pump(self, src: int, dst, direction: str) -> None:
        """Copy src to dst, read by read; hand each completed line to the recorder."""
        lines = Lines()
        out = dst if isinstance(dst, int) else dst.fileno()
        open_out = True
        while True:
            try:
                data = os.read(src, READ_SIZE)
            except OSError:
                data = b""
            if not data:
                break
            # Queued before it is written on (a queue put: microseconds), so that an
            # answer the other side sends on reading it is always recorded after it.
            at = time.time()
            for line in lines.feed(data):
                self._record(direction, line, at, None)
            if open_out:
                open_out = _write_all(out, data)
                if not open_out and direction == FROM_SERVER:
                    break  # the agent stopped reading: the server must meet the closed pipe, as it would
        rest = lines.rest()
        if rest:
            self._record(direction, rest, time.time(), "no newline at the end of the stream")
        if direction == TO_SERVER:
            _close(dst)  # the agent closed our stdin: the server sees its stdin end
        else:
            _close(self.proc.stdout)

    def _pump_stderr(self, src: int, dst: int) -> None:
        open_out = True
        while True:
            try:
                data = os.read(src, READ_SIZE)
            except OSError:
                break
            if not data:
                break
            if open_out:
                open_out = _write_all(dst, data)
            self.stderr_tail.append(data)
            self._tail_size += len(data)
            while self._tail_size - len(self.stderr_tail[0]) >= STDERR_TAIL:
                self._tail_size -= len(self.stderr_tail.popleft())
        _close(self.proc.stderr)

    def _record(self, direction: str, line: bytes, at: float, note: str | None) -> None:
        try:
            self.record(direction, line, at, note)
        except Exception:  # recording never breaks the relay
            pass


def _write_all(fd: int, data: bytes) -> bool:
    """Write everything; False once the reader is gone."""
    view = memoryview(data)
    while view:
        try:
            n = os.write(fd, view)
        except (BrokenPipeError, ConnectionResetError, ValueError):
            return False
        except OSError:
            return False
        view = view[n:]
    return True


def _close(f) -> None:
    try:
        f.close() if not isinstance(f, int) else os.close(f)
    except OSError:
        pass


def exit_like(code: int) -> None:
    """End this process as the server ended: killed by the same signal, or its exit code."""
    if code < 0:
        signum = -code
        try:
            signal.signal(signum, signal.SIG_DFL)
            os.kill(os.getpid(), signum)
        except (OSError, ValueError):
            pass
        os._exit(128 + signum)
    os._exit(code)
