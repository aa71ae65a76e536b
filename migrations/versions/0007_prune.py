"""prune: the store's epoch, and the indexes that say whether a blob is still used

`tooltap prune` (proxy/store/retention.py) deletes a blob only once nothing refers to
it: a turn's system prompt or tools, or a chain node's message. Those lookups need
indexes on turns.system_hash and chain_nodes.message_hash.

store_epoch holds one row whose number a prune raises whenever it deletes blobs or chain
nodes: a writer remembers which ones it stored, and forgets them when the number moved.

Revision ID: 0007
Revises: 0006
Create Date: 2026-12-06 10:00:00.000000
"""
from alembic import op
import sqlalchemy as sa


revision = '0007'
down_revision = '0006'
branch_labels = None
depends_on = None


def upgrade() -> None:
    table = op.create_table(
        'store_epoch',
        sa.Column('id', sa.Integer(), nullable=False),
        sa.Column('epoch', sa.BigInteger(), nullable=False),
        sa.Column('pruned_at', sa.Float(), nullable=True),
        sa.PrimaryKeyConstraint('id'),
    )
    op.bulk_insert(table, [{'id': 1, 'epoch': 0, 'pruned_at': None}])
    op.create_index('ix_turns_system_hash', 'turns', ['system_hash'])
    op.create_index('ix_chain_nodes_message_hash', 'chain_nodes', ['message_hash'])


def downgrade() -> None:
    op.drop_index('ix_chain_nodes_message_hash', table_name='chain_nodes')
    op.drop_index('ix_turns_system_hash', table_name='turns')
    op.drop_table('store_epoch')
