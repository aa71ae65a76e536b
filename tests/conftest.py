"""Real servers for real tests: uvicorn on free ports, a scripted upstream, a SQLite file."""

from __future__ import annotations

import contextlib
import functools
import json
import os
import socket
import sqlite3
import threading
import time
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest
import uvicorn

from proxy.app import TooltapApp
from proxy.config import Settings, Upstream
from proxy.connections import GuardedHttpProtocol, Limits
from proxy.scripted import ScriptedUpstream

FIXTURES = Path(__file__).parent / "fixtures"
CLINE = FIXTURES / "cline-weather"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Server:
    """An ASGI app served by a real uvicorn on a free loopback port, in a thread."""

    def __init__(self, app, **config):
        self.port = free_port()
        self.config = uvicorn.Config(app, host="127.0.0.1", port=self.port, log_level="warning",
                                     access_log=False, server_header=False, date_header=False,
                                     timeout_graceful_shutdown=2, **config)
        self.server = uvicorn.Server(self.config)
        self.thread = threading.Thread(target=self.server.run, daemon=True)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def __enter__(self) -> "Server":
        self.thread.start()
        deadline = time.monotonic() + 10
        while not self.server.started:
            if time.monotonic() > deadline or not self.thread.is_alive():
                raise RuntimeError("server did not start")
            time.sleep(0.01)
        return self

    def __exit__(self, *exc) -> None:
        self.server.should_exit = True
        self.thread.join(10)


@dataclass
class Tooltap:
    app: TooltapApp
    server: Server
    db_path: Path

    @property
    def url(self) -> str:
        return self.server.url

    def flush(self) -> None:
        """Wait for requests still passing through, then for the writer."""
        deadline = time.monotonic() + 10
        while self.app.forwarder.in_flight and time.monotonic() < deadline:
            time.sleep(0.01)
        self.app.writer.flush()

    def api(self, path: str):
        self.flush()
        r = httpx.get(f"{self.url}/_tooltap/api{path}", timeout=10)
        r.raise_for_status()
        return r.json()


@pytest.fixture
def upstream():
    scripted = ScriptedUpstream()
    with Server(scripted) as server:
        scripted.url = server.url
        yield scripted


@pytest.fixture
def make_tooltap(tmp_path):
    started = []

    def make(*upstreams: str, db_url: str | None = None, limits: Limits | None = None, **settings) -> Tooltap:
        """limits: uvicorn with `tooltap serve`'s protocol (connections.py) under these bounds,
        not uvicorn's own protocol."""
        db_path = tmp_path / f"tooltap{len(started)}.db"
        s = Settings(upstreams=tuple(Upstream.parse(u) for u in upstreams),
                     db_url=db_url or f"sqlite:///{db_path}", **settings)
        app = TooltapApp(s)
        http = {"http": functools.partial(GuardedHttpProtocol, limits=limits)} if limits is not None else {}
        server = Server(app, **http).__enter__()
        started.append(server)
        return Tooltap(app, server, db_path)

    yield make
    for server in started:
        server.__exit__()


@pytest.fixture
def tooltap(make_tooltap, upstream) -> Tooltap:
    return make_tooltap(upstream.url)


def cline_turn(n: int) -> dict:
    turn = CLINE / f"turn{n}"
    out = {"request": (turn / "request.json").read_bytes()}
    if (turn / "response.sse").exists():
        out["sse"] = (turn / "response.sse").read_bytes()
        out["expected"] = json.loads((turn / "expected_completion.json").read_text())
        out["published"] = json.loads((turn / "published_completion.json").read_text())
    return out


@contextlib.contextmanager
def locked_sqlite(path):
    """The SQLite file locked by another program: nothing can be committed until the block
    ends. Waits up to 5 s for the lock, as a real tool would (tooltap's writer holds it
    while it commits a batch)."""
    lock = sqlite3.connect(path, timeout=5)
    lock.execute("BEGIN EXCLUSIVE")
    try:
        yield
    finally:
        lock.rollback()
        lock.close()


def postgres_url() -> str | None:
    """A Postgres to test against: .ci/run starts one and sets TOOLTAP_TEST_POSTGRES."""
    url = os.environ.get("TOOLTAP_TEST_POSTGRES")
    if not url and os.environ.get("CI"):
        raise RuntimeError("CI must provide TOOLTAP_TEST_POSTGRES (see .ci/run)")
    return url


def postgres_schema(schema: str) -> str:
    """The test Postgres URL, with `schema` made empty in it (skips the test without one).
    Engines reach it through `in_schema`, so tests running side by side never meet."""
    url = postgres_url()
    if url is None:
        pytest.skip("no Postgres here: set TOOLTAP_TEST_POSTGRES (.ci/run does)")
    from proxy.store.db import make_engine
    from sqlalchemy import text

    engine = make_engine(url)
    with engine.begin() as conn:
        conn.execute(text(f"DROP SCHEMA IF EXISTS {schema} CASCADE; CREATE SCHEMA {schema}"))
    engine.dispose()
    return url


def in_schema(engine, schema: str | None):
    """Every connection of `engine` works in `schema` (None: as it is)."""
    from sqlalchemy import event

    def _search_path(dbapi_conn, _record) -> None:
        with dbapi_conn.cursor() as cur:
            cur.execute(f"SET search_path TO {schema}")
        dbapi_conn.commit()

    if schema:
        event.listen(engine, "connect", _search_path)
    return engine


# -- a real headless browser (Debian's chromium, driven by Playwright) -----------------------

CHROMIUM = "/usr/bin/chromium"
CHROMIUM_ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
                 "--disable-component-update", "--no-first-run"]


@pytest.fixture(scope="module")
def browser():
    from playwright.sync_api import sync_playwright

    with sync_playwright() as p:
        b = p.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        yield b
        b.close()


@pytest.fixture
def page(browser):
    """A fresh page; `page.dialogs` lists what any alert() said (captured text must never
    run one)."""
    context = browser.new_context(viewport={"width": 1280, "height": 900})
    pg = context.new_page()
    pg.dialogs = []
    pg.on("dialog", lambda d: (pg.dialogs.append(d.message), d.dismiss()))
    pg.set_default_timeout(30_000)
    yield pg
    context.close()
