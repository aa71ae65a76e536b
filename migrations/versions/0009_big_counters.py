"""big counters: a session's token sums and a stream's size as 64-bit integers

A session's input tokens are summed over all of its turns: a session pinned with
X-Tooltap-Session that runs for weeks at 100,000+ tokens a turn passes 2**31, which a
Postgres INTEGER refuses (the batch holding that turn would then fail). A raw stream
over 2 GB would too. SQLite's INTEGER is 64-bit already: nothing to do there.

Postgres will not change the type of a column a view reads: the readable views
(migration 0005) are dropped and made again from their own stored definitions.

Revision ID: 0009
Revises: 0008
Create Date: 2026-12-09 10:00:00.000000
"""
from alembic import op
import sqlalchemy as sa


revision = '0009'
down_revision = '0008'
branch_labels = None
depends_on = None

COLUMNS = (("sessions", "input_tokens"), ("sessions", "output_tokens"), ("turns", "raw_size"))
VIEWS = ("turns_v", "tool_calls_v", "sessions_v")  # in the order they were made


def upgrade() -> None:
    _retype(sa.Integer(), sa.BigInteger())


def downgrade() -> None:
    _retype(sa.BigInteger(), sa.Integer())


def _retype(old, new) -> None:
    conn = op.get_bind()
    if conn.dialect.name != "postgresql":
        return
    found = dict(conn.execute(sa.text(
        "SELECT viewname, definition FROM pg_views WHERE schemaname = current_schema() "
        "AND viewname IN :names").bindparams(sa.bindparam("names", expanding=True)), {"names": list(VIEWS)}).all())
    for view in reversed(VIEWS):
        op.execute(f"DROP VIEW IF EXISTS {view}")
    for table, column in COLUMNS:
        op.alter_column(table, column, type_=new, existing_type=old, existing_nullable=False)
    for view in VIEWS:
        if view in found:
            op.execute(f"CREATE VIEW {view} AS {found[view]}")
