"""a full-text index for the inspector's search: messages, tool arguments, tool results

Replaces the search that inflated message blobs one by one and stopped after 20,000 of
them. proxy/store/search.py says what is indexed and how it is queried; in short:

- SQLite (FTS5, unicode61 tokenizer): `search_messages` (id, blob_hash) names each
  indexed message blob, and the contentless FTS5 table `search_messages_fts` holds its
  words under that id (contentless: the text is not stored a second time, uncompressed).
  `search_tool_args` and `search_tool_results` are contentless FTS5 tables keyed by
  tool_calls.id, kept in step by triggers on tool_calls (insert, update of the
  arguments or the result, delete: a contentless table forgets a row when told the
  very text it was given, which the trigger has in `old`).
- Postgres: `search_messages` (blob_hash, body tsvector) under a GIN index, and stored
  generated tsvector columns tool_calls.search_args / search_result, GIN-indexed.
- A matching message finds its sessions through chain_nodes.message_hash (indexed by 0007).

Upgrading an existing database indexes what it holds: tool calls in one statement (the
triggers' expression, or the generated columns' own rewrite on Postgres), message blobs
in batches of BATCH, with a progress line every PROGRESS blobs. Downgrade drops it all.

A later migration that rebuilds tool_calls in SQLite's batch mode drops the table and
with it these triggers: it must create them again (`_sqlite_triggers`).

Needs SQLite built with FTS5 (the sqlite3 of python.org, Debian/Ubuntu, Homebrew and
conda builds all are); without it the upgrade stops with a message saying so.

Revision ID: 0008
Revises: 0007
Create Date: 2026-12-08 10:00:00.000000
"""
import sys
import time

from alembic import op
import sqlalchemy as sa

from proxy.store import content, search

revision = '0008'
down_revision = '0007'
branch_labels = None
depends_on = None

BATCH = 2000
PROGRESS = 50_000


def upgrade() -> None:
    conn = op.get_bind()
    if conn.dialect.name == "postgresql":
        _postgres_upgrade(conn)
    else:
        _sqlite_upgrade(conn)


def downgrade() -> None:
    conn = op.get_bind()
    if conn.dialect.name == "postgresql":
        op.execute("DROP TABLE IF EXISTS search_messages")
        op.execute("ALTER TABLE tool_calls DROP COLUMN IF EXISTS search_args, DROP COLUMN IF EXISTS search_result")
        op.execute(search.POSTGRES_DROP_FUNCTIONS)
    else:
        for trigger in ("search_tool_calls_insert", "search_tool_calls_args", "search_tool_calls_result",
                        "search_tool_calls_delete"):
            op.execute(f"DROP TRIGGER IF EXISTS {trigger}")
        for table in ("search_tool_results", "search_tool_args", "search_messages_fts", "search_messages"):
            op.execute(f"DROP TABLE IF EXISTS {table}")


def _sqlite_upgrade(conn) -> None:
    try:
        op.execute("CREATE VIRTUAL TABLE search_messages_fts USING fts5(body, content='')")
    except sa.exc.OperationalError as exc:
        if "fts5" in str(exc):
            raise RuntimeError("this Python's SQLite has no FTS5, which tooltap's search index needs: "
                               "use a Python whose sqlite3 has it (python.org, Debian/Ubuntu, Homebrew, conda)") from exc
        raise
    op.execute("CREATE TABLE search_messages (id INTEGER PRIMARY KEY, "
               "blob_hash VARCHAR(32) NOT NULL UNIQUE)")
    op.execute("CREATE VIRTUAL TABLE search_tool_args USING fts5(body, content='')")
    op.execute("CREATE VIRTUAL TABLE search_tool_results USING fts5(body, content='')")
    for statement in _sqlite_triggers():
        op.execute(statement)
    args, old_args = search.sqlite_json_words("arguments_raw"), search.sqlite_json_words("result")
    op.execute(f"INSERT INTO search_tool_args (rowid, body) SELECT id, {args} FROM tool_calls")
    op.execute(f"INSERT INTO search_tool_results (rowid, body) SELECT id, {old_args} FROM tool_calls "
               "WHERE result IS NOT NULL")
    _backfill_messages(conn, "sqlite")


def _sqlite_triggers() -> list[str]:
    def words(column: str) -> str:
        return search.sqlite_json_words(column)

    def add(table: str, row: str, column: str) -> str:
        return (f"INSERT INTO {table} (rowid, body) SELECT {row}.id, {words(f'{row}.{column}')} "
                f"WHERE {row}.{column} IS NOT NULL;")

    def forget(table: str, column: str) -> str:
        return (f"INSERT INTO {table} ({table}, rowid, body) SELECT 'delete', old.id, {words(f'old.{column}')} "
                f"WHERE old.{column} IS NOT NULL;")

    return [
        "CREATE TRIGGER search_tool_calls_insert AFTER INSERT ON tool_calls BEGIN "
        f"{add('search_tool_args', 'new', 'arguments_raw')} {add('search_tool_results', 'new', 'result')} END",
        "CREATE TRIGGER search_tool_calls_args AFTER UPDATE OF arguments_raw ON tool_calls "
        "WHEN old.arguments_raw IS NOT new.arguments_raw BEGIN "
        f"{forget('search_tool_args', 'arguments_raw')} {add('search_tool_args', 'new', 'arguments_raw')} END",
        "CREATE TRIGGER search_tool_calls_result AFTER UPDATE OF result ON tool_calls "
        "WHEN old.result IS NOT new.result BEGIN "
        f"{forget('search_tool_results', 'result')} {add('search_tool_results', 'new', 'result')} END",
        "CREATE TRIGGER search_tool_calls_delete AFTER DELETE ON tool_calls BEGIN "
        f"{forget('search_tool_args', 'arguments_raw')} {forget('search_tool_results', 'result')} END",
    ]


def _postgres_upgrade(conn) -> None:
    op.execute(search.POSTGRES_FUNCTIONS)
    # Stored generated columns: the ALTER computes them for every row already there, and
    # Postgres keeps them current on every insert and update.
    op.execute("ALTER TABLE tool_calls "
               "ADD COLUMN search_args tsvector GENERATED ALWAYS AS "
               "(tooltap_search_words(tooltap_json_text(arguments_raw))) STORED, "
               "ADD COLUMN search_result tsvector GENERATED ALWAYS AS "
               "(tooltap_search_words(tooltap_json_text(result::text))) STORED")
    op.execute("CREATE INDEX ix_tool_calls_search_args ON tool_calls USING gin (search_args)")
    op.execute("CREATE INDEX ix_tool_calls_search_result ON tool_calls USING gin (search_result)")
    op.execute("CREATE TABLE search_messages (blob_hash VARCHAR(32) PRIMARY KEY, body tsvector NOT NULL)")
    _backfill_messages(conn, "postgresql")
    op.execute("CREATE INDEX ix_search_messages_body ON search_messages USING gin (body)")  # after: faster


def _backfill_messages(conn, dialect: str) -> None:
    """Index every message blob a chain node names, BATCH at a time in hash order."""
    total = conn.execute(sa.text("SELECT count(DISTINCT message_hash) FROM chain_nodes")).scalar() or 0
    if not total:
        return
    page = sa.text("SELECT b.hash, b.data FROM blobs b WHERE b.hash > :after "
                   "AND EXISTS (SELECT 1 FROM chain_nodes cn WHERE cn.message_hash = b.hash) "
                   "ORDER BY b.hash LIMIT :n")
    after, done, said, started = "", 0, 0, time.monotonic()
    while True:
        rows = conn.execute(page, {"after": after, "n": BATCH}).all()
        if not rows:
            break
        search.index_messages(conn, dialect, {h: content.unpack(data) for h, data in rows})
        after, done = rows[-1][0], done + len(rows)
        if done - said >= PROGRESS:
            said = done
            print(f"tooltap: indexing messages for search: {done}/{total} "
                  f"({time.monotonic() - started:.0f} s)", file=sys.stderr, flush=True)
    if said:
        print(f"tooltap: indexed {done} messages in {time.monotonic() - started:.0f} s", file=sys.stderr, flush=True)
