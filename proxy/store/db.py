"""Engines and migrations, for SQLite (the default) and Postgres."""

from __future__ import annotations

import functools
import json
import sqlite3
from pathlib import Path
from typing import Any
from urllib.parse import quote

import orjson

from alembic import command
from alembic.config import Config
from alembic.script import ScriptDirectory
from sqlalchemy import create_engine, event, inspect, text
from sqlalchemy.engine import Engine
from sqlalchemy.pool import NullPool

from ..config import normalize_db_url
from .files import create_private

MIGRATIONS = Path(__file__).resolve().parent.parent / "migrations"
if not MIGRATIONS.is_dir():  # running from a source checkout: migrations/ sits at the top
    MIGRATIONS = Path(__file__).resolve().parents[2] / "migrations"


def json_text(value: Any) -> str:
    """A JSON column's text, by orjson: compact, and several times faster than json.dumps
    (which was 3% of the writer's time). Keys that are not strings become strings, as
    json.dumps makes them; what orjson refuses (an integer beyond 64 bits, in a model's
    tool arguments say) goes to json.dumps. (Read back by json.loads: orjson would make
    such an integer a float.)"""
    try:
        return orjson.dumps(value, option=orjson.OPT_NON_STR_KEYS).decode()
    except TypeError:
        return json.dumps(value)


def make_engine(url: str, *, busy_timeout: float = 2.0) -> Engine:
    """hide_parameters: a database error must not print captured content into the logs."""
    url = normalize_db_url(url)
    if url.startswith("sqlite"):
        engine = create_engine(url, connect_args={"timeout": busy_timeout, "check_same_thread": False},
                               hide_parameters=True, json_serializer=json_text)
        event.listen(engine, "connect", _sqlite_pragmas)
        return engine
    engine = create_engine(
        url, pool_pre_ping=True, hide_parameters=True, json_serializer=json_text,
        # Never wait forever on a lock or a dead server: the writer spools and retries.
        connect_args={"connect_timeout": 5,
                      "options": "-c lock_timeout=5000 -c statement_timeout=30000"},
    )
    event.listen(engine, "connect", _postgres_text_without_nul)
    return engine


class DatabaseUnavailable(RuntimeError):
    """A database tooltap cannot use; the message says which and what to do."""


def sqlite_path(url: str) -> Path | None:
    """The file behind a SQLite URL, or None (not SQLite, or in memory)."""
    url = normalize_db_url(url)
    if url.startswith("sqlite:///") and url != "sqlite:///:memory:":
        return Path(url[len("sqlite:///"):])
    return None


def open_database(url: str, *, create: bool = True, busy_timeout: float = 2.0) -> Engine:
    """An engine on a database that works, migrated to the newest schema.

    Every way this can fail becomes a DatabaseUnavailable with one clear line: an unknown
    URL, a missing folder, a folder that cannot be written, a file that is not a
    database, Postgres without its driver or unreachable. With create=False (the read
    commands) a missing SQLite file is an error instead of a new empty database, and so is
    a database that holds no tooltap store (another program's, or an empty one)."""
    url = normalize_db_url(url)
    scheme = url.split("://", 1)[0]
    if not scheme.startswith(("sqlite", "postgresql")):
        raise DatabaseUnavailable(f"unsupported database URL {url!r}: use sqlite:///FILE (or a file path) "
                                  "or postgresql+psycopg://USER:PASSWORD@HOST/DB")
    path = sqlite_path(url)
    if path is not None:
        if path.is_dir():
            raise DatabaseUnavailable(f"cannot use {path} as the database: it is a folder")
        if not create and not path.is_file():
            raise DatabaseUnavailable(f"no tooltap database at {path} (run `tooltap serve` first, "
                                      "or give --db / TOOLTAP_DB)")
        if not path.parent.is_dir():
            raise DatabaseUnavailable(f"cannot create the database {path}: the folder {path.parent} does not exist")
        if create:
            try:
                create_private(str(path))
            except OSError as exc:
                raise DatabaseUnavailable(f"cannot create the database {path}: {exc.strerror or exc}") from None
    try:
        if not create or path is not None:  # (a Postgres schema may be shared on purpose)
            require_store(url, create=create)
        engine = make_engine(url, busy_timeout=busy_timeout)
        migrate(engine)
    except DatabaseUnavailable:
        raise
    except ImportError as exc:
        if "psycopg" in str(exc):
            raise DatabaseUnavailable("Postgres needs its driver: pip install 'psycopg[binary]' "
                                      "(or '.[postgres]' in tooltap's folder)") from exc
        raise DatabaseUnavailable(f"cannot open {url}: {exc}") from exc
    except Exception as exc:  # sqlalchemy/alembic/driver errors: name the cause, not the stack
        raise DatabaseUnavailable(f"cannot open the database {shown_url(url)}: {_cause(exc)}") from exc
    return engine


def require_store(url: str, *, create: bool = False) -> None:
    """Refuse a database without a tooltap store, before anything could change it: migrating
    would add tooltap's tables to another program's file, and make_engine's pragmas would
    turn a SQLite file to WAL. A store of an older schema passes, to be migrated forward;
    with `create`, so does an empty database, where the store is to be made."""
    path = sqlite_path(url)
    where = str(path) if path is not None else shown_url(url)
    tables, revision = _store_marks(_probe_engine(url))
    if "turns" in tables and revision in _revisions():
        return
    if "turns" in tables and revision is not None:
        raise DatabaseUnavailable(f"{where} was written by a newer tooltap (schema {revision}): upgrade tooltap")
    if create and (not tables or "turns" in tables):  # new, or a first migration cut short
        return
    if create:
        raise DatabaseUnavailable(f"{where} holds another program's tables ({_some(tables)}): "
                                  "give tooltap a database of its own")
    found = f"its tables: {_some(tables)}" if tables else "it has no tables"
    raise DatabaseUnavailable(f"{where} holds no tooltap data ({found}): "
                              "give the --db that `tooltap serve` writes to")


def _probe_engine(url: str) -> Engine:
    """An engine to look with and nothing more. For SQLite: no pragmas, never a new file, and
    opened read-write so that closing it removes the -wal and -shm that reading a WAL file
    makes (a read-only connection would leave them beside it)."""
    path = sqlite_path(url)
    if path is None:
        return make_engine(url)  # Postgres: connecting changes nothing
    uri = f"file:{quote(str(path.resolve()))}?mode=rw"
    return create_engine("sqlite://", poolclass=NullPool,
                         creator=lambda: sqlite3.connect(uri, uri=True, timeout=2.0, check_same_thread=False))


def _store_marks(engine: Engine) -> tuple[set[str], str | None]:
    """The tables (in the schema connections work in) and the alembic revision they are at."""
    try:
        with engine.connect() as conn:
            tables = set(inspect(conn).get_table_names())
            if "alembic_version" not in tables:
                return tables, None
            return tables, conn.execute(text("SELECT version_num FROM alembic_version")).scalar()
    finally:
        engine.dispose()


@functools.cache  # (each open would read the migration scripts again: 6 ms)
def _revisions() -> frozenset[str]:
    """tooltap's migrations: another program's alembic_version may name revisions too."""
    script = ScriptDirectory.from_config(alembic_config("sqlite://"))
    return frozenset(rev.revision for rev in script.walk_revisions())


def _some(names: set[str], most: int = 3) -> str:
    shown = sorted(names)[:most]
    rest = len(names) - len(shown)
    return ", ".join(shown) + (f" and {rest} more" if rest else "")


def shown_url(url: str) -> str:
    """The URL without its password: as messages, pages and logs may show it."""
    head, at, tail = url.rpartition("@")
    if not at:
        return url
    scheme, _, userinfo = head.partition("://")
    if ":" not in userinfo:
        return url  # a user without a password (peer or .pgpass login)
    return f"{scheme}://{userinfo.split(':', 1)[0]}:***@{tail}"


def _cause(exc: BaseException) -> str:
    while exc.__cause__ is not None or getattr(exc, "orig", None) is not None:
        exc = getattr(exc, "orig", None) or exc.__cause__
    text = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
    if "file is not a database" in text or "not a database" in text:
        return "the file is not a SQLite database (give another --db)"
    if "readonly" in text or "read-only" in text or "unable to open database file" in text:
        return f"{text} (is the folder writable?)"
    return text


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
    # Only a new, empty file takes it: space a prune frees can then be given back in small
    # steps (retention.py) instead of one VACUUM that locks the writer out. Asked of a file
    # in use it waits for the write lock, so a page could not be read while another
    # program (a sqlite3 shell, a backup) holds it.
    if cur.execute("PRAGMA page_count").fetchone()[0] == 0:
        cur.execute("PRAGMA auto_vacuum=INCREMENTAL")
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


MIGRATION_LOCK = 0x7001_7a9  # a Postgres advisory lock key: tooltap's migrations
# Writers hold it shared for each batch; a prune's batch holds it alone (retention.py).
PRUNE_LOCK = 0x7001_7aa


def migrate(engine: Engine) -> None:
    """Bring the schema to the newest migration (run on every start)."""
    cfg = alembic_config(str(engine.url.render_as_string(hide_password=False)))
    with engine.begin() as conn:
        if conn.dialect.name == "postgresql":
            # Instances started together (docker compose up) must not migrate together:
            # the next one waits here, then finds nothing left to do.
            conn.execute(text("SELECT pg_advisory_xact_lock(:key)"), {"key": MIGRATION_LOCK})
        cfg.attributes["connection"] = conn
        command.upgrade(cfg, "head")
