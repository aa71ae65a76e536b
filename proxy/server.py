"""Serving tooltap: uvicorn, with a stop that loses no turn and limits on idle clients.

Every stop short of SIGKILL goes the same way: SIGINT (Ctrl-C), SIGTERM (`kill`,
`docker stop`) and SIGHUP (the terminal closed), within `grace` seconds of the signal
(default 8: docker and most orchestrators send SIGKILL 10 s after SIGTERM).

1. Stop accepting connections; close the idle ones.
2. Let open requests and streams finish, until `grace` less the store's reserve.
3. Cut those still open: a stream ends abruptly for its client (as a dropped upstream
   would) and a request still waiting for the upstream's headers gets a 503; each is
   recorded as `proxy_error` "tooltap shut down". A second signal skips to here at once.
4. The writer stores what it holds in what is left of the grace; what it cannot store
   in time is spooled, and replayed at the next start.

uvicorn's own stop differs in ways that lose turns: SIGHUP is not handled (the process
dies at once), a second Ctrl-C skips the application's shutdown (the writer never
flushes), and requests cancelled at the end of the grace are not waited for.
"""

from __future__ import annotations

import asyncio
import atexit
import contextlib
import functools
import logging
import os
import resource
import signal
import sys
import threading
import time
from typing import Callable, NoReturn

import uvicorn

from .connections import GuardedHttpProtocol, Limits, report

log = logging.getLogger("tooltap")

DEFAULT_GRACE = 8.0
STORE_RESERVE = 3.0  # of the grace, kept for storing turns after the streams are cut
STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)
# File descriptors kept for everything but client connections: the database, the
# writer's pipes, logs, temporary files. Each client connection may need two (its
# socket and the upstream's).
RESERVED_FDS = 64
# How long a kept-alive client connection may sit idle. Longer than the pools of common
# clients keep theirs (httpx and the SDKs built on it 5 s, aiohttp 15 s, Go 90 s): when
# both sides give up at the same moment (uvicorn's default is also 5 s), the client sends
# its next request on a connection the server is closing and gets a reset. Idle
# connections cost a file descriptor each; at the connection cap the oldest go first.
KEEP_ALIVE = 120


def raise_fd_limit() -> int:
    """Raise the soft limit on open files to the hard limit; returns the limit in force."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft == resource.RLIM_INFINITY:
        return 1 << 20
    # An unlimited hard limit cannot be the soft one on Linux: ask for a million.
    target = 1 << 20 if hard == resource.RLIM_INFINITY else hard
    if target > soft:
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
            return target
        except (ValueError, OSError):
            pass
    return soft


def connection_cap(fd_limit: int) -> int:
    return max(8, (fd_limit - RESERVED_FDS) // 2)


class TooltapServer(uvicorn.Server):
    """uvicorn's server with tooltap's stop (see the module's docstring)."""

    def __init__(self, config: uvicorn.Config, grace: float = DEFAULT_GRACE,
                 on_stop: Callable[[float], None] | None = None, announce: bool = True,
                 say_cuts: bool = True) -> None:
        super().__init__(config)
        self.grace = grace
        # Whether the stop is logged: not for the servers a replay or the demo runs inside
        # a process, whose log is `tooltap serve`'s or the demo's own; and whether requests
        # cut by it are: not for a replay's, whose cuts are its own business.
        self.say = log.info if announce else log.debug
        self.say_cut = log.warning if say_cuts else log.debug
        self.on_stop = on_stop  # told the monotonic time by which the stop must be done
        self.stop_signal: int | None = None
        self.stop_began: float | None = None
        self.cut_now = False

    @contextlib.contextmanager
    def capture_signals(self):
        if threading.current_thread() is not threading.main_thread():
            yield  # signals belong to the main thread (tests and the demo serve from others)
            return
        previous = {sig: signal.signal(sig, self.handle_exit) for sig in STOP_SIGNALS}
        try:
            yield
        finally:
            for sig, handler in previous.items():
                signal.signal(sig, handler)
        # uvicorn raises the signal again here, which kills the process before Python's
        # own cleanup; the stop is complete, so tooltap just returns.

    def handle_exit(self, sig: int, frame) -> None:
        # In a signal handler: set flags only, log from the event loop.
        if self.stop_signal is None:
            self.stop_signal, self.stop_began = sig, time.monotonic()
            self.should_exit = True
        else:
            self.cut_now = True

    async def shutdown(self, sockets=None) -> None:
        began = self.stop_began or time.monotonic()
        deadline = began + self.grace
        cut_at = deadline - min(STORE_RESERVE, self.grace / 2)
        if self.on_stop is not None:
            self.on_stop(deadline - 0.5)  # a little left for the process to exit
        why = signal.Signals(self.stop_signal).name if self.stop_signal else "stop requested"
        state = self.server_state
        self.say("stopping (%s): %d open request(s) get %.1f s to finish", why, len(state.tasks),
                 max(0.0, cut_at - time.monotonic()))

        for server in self.servers:
            server.close()
        for sock in sockets or []:
            sock.close()
        report(state)
        for connection in list(state.connections):
            connection.shutdown()  # idle ones close now, busy ones after their response

        while state.tasks and not self.cut_now and time.monotonic() < cut_at:
            await asyncio.sleep(0.05)
        tasks = list(state.tasks)
        if tasks:
            self.say_cut("cutting %d open request(s) (each recorded with \"tooltap shut down\")", len(tasks))
            for task in tasks:
                task.cancel()
            await asyncio.wait(tasks, timeout=max(0.5, (deadline - time.monotonic()) / 3))
        for connection in list(state.connections):
            transport = getattr(connection, "transport", None)
            if transport is not None:
                transport.close()
        with contextlib.suppress(asyncio.TimeoutError):
            await asyncio.wait_for(asyncio.gather(*(s.wait_closed() for s in self.servers)), 1.0)

        await self.lifespan.shutdown()  # the application closes its writer within the grace
        self.say("stopped in %.1f s", time.monotonic() - began)


def exit_now(code: int = 0) -> NoReturn:
    """End the process once a stop is complete, without the interpreter's teardown of
    every module, which can take a second on a busy machine and counts against the
    grace. Exit handlers still run (multiprocessing's among them)."""
    logging.shutdown()
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(Exception):  # the terminal may be gone (SIGHUP)
            stream.flush()
    atexit._run_exitfuncs()
    os._exit(code)


def _start_resource_tracker_deaf_to_sighup() -> None:
    """multiprocessing's resource tracker (a helper process the writer's queues start)
    ignores SIGINT and SIGTERM but dies of a SIGHUP sent to the process group by a closed
    terminal, and its successor then fills the log with tracebacks. Started here with
    SIGHUP ignored, it keeps ignoring it (an ignored signal stays so across exec)."""
    from multiprocessing import resource_tracker

    previous = signal.signal(signal.SIGHUP, signal.SIG_IGN)
    try:
        resource_tracker.ensure_running()
    finally:
        signal.signal(signal.SIGHUP, previous)


def serve(app, *, host: str, port: int, log_level: str = "info", grace: float = DEFAULT_GRACE,
          max_connections: int | None = None, reuse_port: bool = False) -> TooltapServer:
    """Serve `app` (a TooltapApp) until a stop signal; returns once stopped. From the
    main thread (signals)."""
    _start_resource_tracker_deaf_to_sighup()
    fd_limit = raise_fd_limit()
    cap = max_connections or connection_cap(fd_limit)
    log.debug("open-file limit %d: at most %d client connections", fd_limit, cap)
    config = uvicorn.Config(
        app, host=host, port=port, log_level=log_level, timeout_keep_alive=KEEP_ALIVE,
        access_log=False,  # uvicorn would log ?key= in clear
        server_header=False, date_header=False,  # the upstream's headers, not ours
        # X-Forwarded-* from the agent are the upstream's business: not read, not a
        # middleware every forwarded request passes through.
        proxy_headers=False,
        http=functools.partial(GuardedHttpProtocol, limits=Limits(max_connections=cap)),
    )
    server = TooltapServer(config, grace=grace, on_stop=lambda t: setattr(app, "stop_by", t))
    # One of `serve --workers N` (workers.py): the port is shared, the kernel spreads connections.
    server.run(sockets=[_shared_socket(host, port)] if reuse_port else None)
    return server


def _shared_socket(host: str, port: int):
    import socket

    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
    sock.bind((host, port))
    sock.set_inheritable(True)
    return sock
