"""chain_nodes.parent indexed: a turn stored after later turns of its conversation finds them

Several tooltap instances may share one database, and consecutive turns of a
conversation may be stored in any order. A turn whose whole chain is already known walks
down the chain trie to the turns below it (sessions.ADOPTABLE); the walk looks nodes up
by their parent.

Revision ID: 0006
Revises: 0005
Create Date: 2026-12-05 10:00:00.000000
"""
from alembic import op


revision = '0006'
down_revision = '0005'
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_index('ix_chain_nodes_parent', 'chain_nodes', ['parent'])


def downgrade() -> None:
    op.drop_index('ix_chain_nodes_parent', table_name='chain_nodes')
