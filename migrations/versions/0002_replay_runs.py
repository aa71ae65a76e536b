"""replay runs

Revision ID: 0002
Revises: 0001
Create Date: 2026-12-02 10:00:00.000000
"""
from alembic import op
import sqlalchemy as sa
import sqlmodel


revision = '0002'
down_revision = '0001'
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table('replay_runs',
    sa.Column('id', sa.Integer(), nullable=False),
    sa.Column('session_id', sqlmodel.sql.sqltypes.AutoString(length=64), nullable=False),
    sa.Column('kind', sqlmodel.sql.sqltypes.AutoString(length=16), nullable=False),
    sa.Column('target', sa.Text(), nullable=False),
    sa.Column('ok', sa.Boolean(), nullable=False),
    sa.Column('created_at', sa.Float(), nullable=False),
    sa.Column('turns', sa.Integer(), nullable=True),
    sa.Column('differing', sa.Integer(), nullable=True),
    sa.Column('pass_hat_k', sa.Float(), nullable=True),
    sa.Column('report', sa.LargeBinary(), nullable=False),
    sa.PrimaryKeyConstraint('id')
    )
    with op.batch_alter_table('replay_runs', schema=None) as batch_op:
        batch_op.create_index(batch_op.f('ix_replay_runs_session_id'), ['session_id'], unique=False)


def downgrade() -> None:
    with op.batch_alter_table('replay_runs', schema=None) as batch_op:
        batch_op.drop_index(batch_op.f('ix_replay_runs_session_id'))

    op.drop_table('replay_runs')
