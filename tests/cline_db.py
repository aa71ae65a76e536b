"""The cline-weather session recorded through a real tooltap (uvicorn, its writer
process, a SQLite file), once per test run, for the tests that only read it."""

from __future__ import annotations

from pathlib import Path

from proxy.app import TooltapApp
from proxy.config import Settings, Upstream
from proxy.scripted import ScriptedUpstream
from tests.conftest import Server, Tooltap
from tests.test_proxy_e2e import play_cline

_recorded: dict[str, tuple[Path, str]] = {}


def recorded_cline_db(tmp_path_factory) -> tuple[Path, str]:
    """(the database file, the session id). Read it; do not write to it."""
    if "db" not in _recorded:
        db = tmp_path_factory.mktemp("cline") / "cline.db"
        scripted = ScriptedUpstream()
        with Server(scripted) as up:
            scripted.url = up.url
            app = TooltapApp(Settings(upstreams=(Upstream.parse(up.url),), db_url=f"sqlite:///{db}"))
            with Server(app) as server:
                tooltap = Tooltap(app, server, db)
                play_cline(tooltap, scripted)
                session_id = tooltap.api("/sessions")["sessions"][0]["id"]
        _recorded["db"] = (db, session_id)
    return _recorded["db"]
