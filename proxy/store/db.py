"""Engines and migrations, for SQLite (the default) and Postgres."""

from __future__ import annotations

from pathlib import Path

from alembic import command
from alembic.config import Config
from sqlalchemy import create_engine, event
from sqlalchemy.engine import Engine

from ..config import normalize_db_url

MIGRATIONS = Path(__file__).resolve().parent.parent / "migrations"
if not MIGRATIONS.is_dir():  # running from a source checkout: migrations/ sits at the top
    MIGRATIONS = Path(__file__).resolve().parents[2] / "migrations"


def make_engine(url: str, *, busy_timeout: float = 2.0) -> Engine:
    """hide_parameters: a database error must not print captured content into the logs."""
    url = normalize_db_url(url)
    if url.startswith("sqlite"):
        engine = create_engine(url, connect_args={"timeout": busy_timeout, "check_same_thread": False},
                               hide_parameters=True)
        event.listen(engine, "connect", _sqlite_pragmas)
        return engine
    engine = create_engine(
        url, pool_pre_ping=True, hide_parameters=True,
        # Never wait forever on a lock or a dead server: the writer spools and retries.
        connect_args={"connect_timeout": 5,
                      "options": "-c lock_timeout=5000 -c statement_timeout=30000"},
    )
    event.listen(engine, "connect", _postgres_text_without_nul)
    return engine


def _postgres_text_without_nul(dbapi_conn, _record) -> None:
    """Postgres text cannot hold U+0000, which model output can contain: store U+FFFD in
    its place rather than refuse the turn (the exact bytes stay in the raw response)."""
    from psycopg.adapt import Dumper, PyFormat

    inner = dbapi_conn.adapters.get_dumper(str, PyFormat.AUTO)

    class NulFreeStr(Dumper):
        oid = getattr(inner, "oid", 0)

        def __init__(self, cls, context=None):
            super().__init__(cls, context)
            self._inner = inner(cls, context)

        def dump(self, obj: str):
            return self._inner.dump(obj.replace("\x00", "\ufffd"))

    dbapi_conn.adapters.register_dumper(str, NulFreeStr)


def _sqlite_pragmas(dbapi_conn, _record) -> None:
    cur = dbapi_conn.cursor()
    # WAL: the inspector reads while the writer writes. NORMAL: durable at checkpoints,
    # safe against corruption, far fewer fsyncs than FULL.
    cur.execute("PRAGMA journal_mode=WAL")
    cur.execute("PRAGMA synchronous=NORMAL")
    cur.close()


def alembic_config(url: str) -> Config:
    cfg = Config()
    cfg.set_main_option("script_location", str(MIGRATIONS))
    cfg.set_main_option("sqlalchemy.url", normalize_db_url(url).replace("%", "%%"))
    return cfg


def migrate(engine: Engine) -> None:
    """Bring the schema to the newest migration (run on every start)."""
    cfg = alembic_config(str(engine.url.render_as_string(hide_password=False)))
    with engine.begin() as conn:
        cfg.attributes["connection"] = conn
        command.upgrade(cfg, "head")
