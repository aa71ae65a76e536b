"""response ids: a turn found by the id of its answer

An OpenAI Responses request may continue an earlier answer by reference
(`previous_response_id`) and send only what is new. Threading such a request needs the
turn whose answer had that id: the answer's id becomes a column with an index. Turns
stored before get theirs from their stored answer (only Responses turns, read once).

Revision ID: 0011
Revises: 0010
Create Date: 2026-12-11 10:00:00.000000
"""
import json
import zlib

from alembic import op
import sqlalchemy as sa


revision = '0011'
down_revision = '0010'
branch_labels = None
depends_on = None

BATCH = 500


def upgrade() -> None:
    op.add_column("turns", sa.Column("response_id", sa.String(), nullable=True))
    op.create_index("ix_turns_response_id", "turns", ["response_id"])
    conn = op.get_bind()
    last = 0
    while True:  # in batches by id: a large store is not read into memory at once
        rows = conn.execute(sa.text(
            "SELECT id, response FROM turns WHERE api = 'openai.responses' AND response IS NOT NULL "
            "AND id > :last ORDER BY id LIMIT :n"), {"last": last, "n": BATCH}).all()
        if not rows:
            break
        last = rows[-1][0]
        found = [{"i": turn_id, "r": rid} for turn_id, packed in rows if (rid := _id_of(packed))]
        if found:
            conn.execute(sa.text("UPDATE turns SET response_id = :r WHERE id = :i"), found)


def downgrade() -> None:
    op.drop_index("ix_turns_response_id", "turns")
    op.drop_column("turns", "response_id")


def _id_of(packed: bytes) -> str | None:
    # The store's packing (zlib-compressed JSON, store/content.py); written out here so
    # that this migration reads the same bytes whatever the code becomes.
    try:
        response = json.loads(zlib.decompress(packed))
    except (ValueError, zlib.error):
        return None
    rid = response.get("id") if isinstance(response, dict) else None
    return rid if isinstance(rid, str) and rid else None
