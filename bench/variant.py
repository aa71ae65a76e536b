"""tooltap with parts switched off, to see where its overhead goes (diagnostics only; the
real benchmark runs `tooltap serve`). Serves as `tooltap serve` does, but on uvicorn's
own HTTP protocol rather than tooltap's guarded one (proxy/connections.py: deadlines
on heads and bodies, a connection cap), and without its signal handling.

    python bench/variant.py --upstream URL --db PATH --port N [--sink drop|journal] [--no-capture]
                            [--switch-interval SECONDS]

  --sink drop         turns are dropped instead of handed to the writer: no storage
                      work at all (forwarding + capture only)
  --sink journal      turns are journaled (the proxy's share of storage) and never
                      read: no writer process
  --no-capture        Capture.feed does nothing: no copy, hash, timeline, SSE decoding
  --switch-interval   sys.setswitchinterval (the GIL hand-off period, default 0.005)
  --stages FILE       append each request's stage times (perf_counter, one JSON list a
                      line: arrival at the app, upstream request sent, upstream headers,
                      first body chunk handed to the server, handed over) to FILE
  --bare              serve bare_proxy.py instead of tooltap: the same server and client
                      layers with nothing of tooltap's (the floor of those layers)
  --raw               serve raw_proxy.py instead: asyncio protocols relaying the
                      upstream's bytes, no uvicorn, no ASGI (the floor of a proxy in Python)

overhead.py runs it with --variant "ARGS".
"""

from __future__ import annotations

import argparse
import sys


class DropWriter:
    """Stands in for proxy.store.writer.Writer: takes turns and forgets them."""

    written = spooled = 0

    def start(self) -> None: ...

    def close(self, timeout: float = 0) -> None: ...

    def flush(self, timeout: float = 0) -> None: ...

    def submit(self, record) -> None:
        record.release()
        self.written += 1


class JournalOnly(DropWriter):
    """Journals turns as the proxy does, with no writer process to read them."""

    def __init__(self, folder: str) -> None:
        from proxy.store.journal import Journal

        self.journal = Journal(folder)

    def start(self) -> None:
        self.journal.start()

    def close(self, timeout: float = 0) -> None:
        self.journal.close()

    def submit(self, record) -> None:
        self.journal.submit(record)
        self.written += 1


def main() -> None:
    import uvicorn

    from proxy import capture
    from proxy.app import TooltapApp
    from proxy.config import Settings, Upstream

    ap = argparse.ArgumentParser()
    ap.add_argument("--upstream", required=True)
    ap.add_argument("--db", required=True)
    ap.add_argument("--port", type=int, required=True)
    ap.add_argument("--host", default="127.0.0.1")
    ap.add_argument("--log-level", default="warning")
    ap.add_argument("--sink", choices=["writer", "drop", "journal"], default="writer")
    ap.add_argument("--no-capture", action="store_true")
    ap.add_argument("--switch-interval", type=float)
    ap.add_argument("--stages", metavar="FILE")
    ap.add_argument("--bare", action="store_true")
    ap.add_argument("--raw", action="store_true")
    a = ap.parse_args()
    if a.raw:
        import raw_proxy

        sys.argv = [sys.argv[0], "--upstream", a.upstream, "--port", str(a.port)]
        return raw_proxy.main()
    if a.switch_interval:
        sys.setswitchinterval(a.switch_interval)
    if a.no_capture:
        capture.Capture.feed = lambda self, chunk: None
    if a.bare:
        from bare_proxy import BareProxy

        app = BareProxy(a.upstream)
    else:
        settings = Settings(upstreams=(Upstream.parse(a.upstream),), db_url=a.db)
        sinks = {"drop": DropWriter, "journal": lambda: JournalOnly(a.db.removeprefix("sqlite:///") + ".journal")}
        app = TooltapApp(settings, writer=sinks[a.sink]() if a.sink in sinks else None)
    if a.stages:
        from stages import Stages

        app = Stages(app, a.stages)
    uvicorn.run(app, host=a.host, port=a.port, log_level=a.log_level, access_log=False,
                server_header=False, date_header=False, timeout_graceful_shutdown=3)


if __name__ == "__main__":
    main()
