"""title trigrams: a Postgres index that answers "the title holds this text"

The inspector's search matches a session's title by substring (`lower(title) LIKE
'%words%'`), which without an index reads every session: 40 ms at 20,000 sessions,
most of a search's budget. pg_trgm's GIN index answers such a LIKE from the index
(1 ms there). pg_trgm ships with Postgres (contrib) and is a trusted extension, so
the database's owner may add it; where it cannot be added (an older server, a role
without CREATE on the database) the migration says so, with the two statements that
add it by hand, and titles are searched as before.
SQLite reads its 20,000 titles in about 12 ms and keeps doing so.

Revision ID: 0010
Revises: 0009
Create Date: 2026-12-10 10:00:00.000000
"""
import logging

from alembic import op
import sqlalchemy as sa


revision = '0010'
down_revision = '0009'
branch_labels = None
depends_on = None

log = logging.getLogger("tooltap.store")
INDEX = "ix_sessions_title_trgm"


def upgrade() -> None:
    conn = op.get_bind()
    if conn.dialect.name != "postgresql":
        return
    try:
        with conn.begin_nested():  # a refusal must not abort the migration's transaction
            conn.execute(sa.text("CREATE EXTENSION IF NOT EXISTS pg_trgm"))
    except sa.exc.DBAPIError as exc:
        log.warning("pg_trgm could not be added (%s): searches read every session's title. A superuser "
                    "can add it: CREATE EXTENSION pg_trgm; CREATE INDEX %s ON sessions USING gin "
                    "(lower(title) gin_trgm_ops);", " ".join(str(exc.orig).split()), INDEX)
        return
    # The operator class lives where the extension was installed, which need not be on
    # this connection's search path.
    schema = conn.execute(sa.text("SELECT extnamespace::regnamespace::text FROM pg_extension "
                                  "WHERE extname = 'pg_trgm'")).scalar()
    op.execute(f"CREATE INDEX IF NOT EXISTS {INDEX} ON sessions USING gin (lower(title) {schema}.gin_trgm_ops)")


def downgrade() -> None:
    if op.get_bind().dialect.name == "postgresql":
        op.execute(f"DROP INDEX IF EXISTS {INDEX}")
