"""turns.uid: the journal's unique id for a turn, so a turn read again is never stored twice

Revision ID: 0003
Revises: 0002
Create Date: 2026-12-02 12:00:00.000000
"""
from alembic import op
import sqlalchemy as sa
import sqlmodel


revision = '0003'
down_revision = '0002'
branch_labels = None
depends_on = None


def upgrade() -> None:
    # Plain ALTER TABLE ADD COLUMN and CREATE INDEX: no table copy, even for a large SQLite file.
    op.add_column('turns', sa.Column('uid', sqlmodel.sql.sqltypes.AutoString(length=32), nullable=True))
    op.create_index('ix_turns_uid', 'turns', ['uid'], unique=True)


def downgrade() -> None:
    op.drop_index('ix_turns_uid', table_name='turns')
    with op.batch_alter_table('turns', schema=None) as batch_op:
        batch_op.drop_column('uid')
