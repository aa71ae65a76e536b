"""continue ids: a turn found by the id a later request names to continue it

An OpenAI Responses request may continue an earlier answer by reference
(`previous_response_id`) or a conversation the server keeps (`conversation`), and send
only what is new. Threading such a request needs the turn it continues: the id a later
request would name (the answer's id, or its conversation's) becomes a column with an
index. Turns stored before get theirs from their stored answer (Responses turns only,
read once, in batches).

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
    op.add_column("turns", sa.Column("continue_id", sa.String(), nullable=True))
    op.create_index("ix_turns_continue_id", "turns", ["continue_id"])
    conn = op.get_bind()
    last = 0
    while True:  # in batches by id: a large store is not read into memory at once
        rows = conn.execute(sa.text(
            "SELECT id, response FROM turns WHERE api = 'openai.responses' AND response IS NOT NULL "
            "AND id > :last ORDER BY id LIMIT :n"), {"last": last, "n": BATCH}).all()
        if not rows:
            break
        last = rows[-1][0]
        found = [{"i": turn_id, "c": cid} for turn_id, packed in rows if (cid := _continue_id(packed))]
        if found:
            conn.execute(sa.text("UPDATE turns SET continue_id = :c WHERE id = :i"), found)


def downgrade() -> None:
    op.drop_index("ix_turns_continue_id", "turns")
    op.drop_column("turns", "continue_id")


def _continue_id(packed: bytes) -> str | None:
    # The store's packing (zlib-compressed JSON, store/content.py), read here by hand so
    # that this migration reads the same bytes whatever the code becomes. The rule is
    # OpenAIResponses.continue_id's, from the answer alone.
    try:
        response = json.loads(zlib.decompress(packed))
    except (ValueError, zlib.error):
        return None
    if not isinstance(response, dict):
        return None
    conversation = response.get("conversation")
    cid = conversation.get("id") if isinstance(conversation, dict) else response.get("id")
    return cid if isinstance(cid, str) and cid else None
