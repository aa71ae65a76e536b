"""the MCP tap: mcp_connections, mcp_messages, mcp_tool_sets

Revision ID: 0004
Revises: 0003
Create Date: 2026-12-03 10:00:00.000000
"""
from alembic import op
import sqlalchemy as sa
import sqlmodel


revision = '0004'
down_revision = '0003'
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table('mcp_connections',
    sa.Column('id', sqlmodel.sql.sqltypes.AutoString(length=64), nullable=False),
    sa.Column('server', sqlmodel.sql.sqltypes.AutoString(length=200), nullable=False),
    sa.Column('transport', sqlmodel.sql.sqltypes.AutoString(length=16), nullable=False),
    sa.Column('command', sa.Text(), nullable=True),
    sa.Column('url', sa.Text(), nullable=True),
    sa.Column('started_at', sa.Float(), nullable=False),
    sa.Column('ended_at', sa.Float(), nullable=True),
    sa.Column('exit_code', sa.Integer(), nullable=True),
    sa.Column('stderr_tail', sa.Text(), nullable=True),
    sa.PrimaryKeyConstraint('id')
    )
    op.create_index('ix_mcp_connections_server', 'mcp_connections', ['server'], unique=False)
    op.create_index('ix_mcp_connections_started_at', 'mcp_connections', ['started_at'], unique=False)

    op.create_table('mcp_messages',
    sa.Column('id', sa.Integer(), nullable=False),
    sa.Column('connection', sqlmodel.sql.sqltypes.AutoString(length=64), nullable=False),
    sa.Column('seq', sa.Integer(), nullable=False),
    sa.Column('server', sqlmodel.sql.sqltypes.AutoString(length=200), nullable=False),
    sa.Column('direction', sqlmodel.sql.sqltypes.AutoString(length=16), nullable=False),
    sa.Column('at', sa.Float(), nullable=False),
    sa.Column('kind', sqlmodel.sql.sqltypes.AutoString(length=16), nullable=False),
    sa.Column('method', sqlmodel.sql.sqltypes.AutoString(length=200), nullable=True),
    sa.Column('jsonrpc_id', sa.Text(), nullable=True),
    sa.Column('tool', sa.Text(), nullable=True),
    sa.Column('is_error', sa.Boolean(), nullable=False),
    sa.Column('size', sa.Integer(), nullable=False),
    sa.Column('note', sa.Text(), nullable=True),
    sa.Column('raw', sa.LargeBinary(), nullable=False),
    sa.PrimaryKeyConstraint('id'),
    sa.UniqueConstraint('connection', 'seq', name='uq_mcp_messages_connection_seq')
    )
    op.create_index('ix_mcp_messages_connection', 'mcp_messages', ['connection'], unique=False)
    op.create_index('ix_mcp_messages_server', 'mcp_messages', ['server'], unique=False)
    op.create_index('ix_mcp_messages_at', 'mcp_messages', ['at'], unique=False)
    op.create_index('ix_mcp_messages_method', 'mcp_messages', ['method'], unique=False)

    op.create_table('mcp_tool_sets',
    sa.Column('id', sa.Integer(), nullable=False),
    sa.Column('server', sqlmodel.sql.sqltypes.AutoString(length=200), nullable=False),
    sa.Column('tools_hash', sqlmodel.sql.sqltypes.AutoString(length=32), nullable=False),
    sa.Column('tool_count', sa.Integer(), nullable=False),
    sa.Column('first_seen', sa.Float(), nullable=False),
    sa.Column('last_seen', sa.Float(), nullable=False),
    sa.Column('seen', sa.Integer(), nullable=False),
    sa.Column('tools', sa.LargeBinary(), nullable=False),
    sa.PrimaryKeyConstraint('id'),
    sa.UniqueConstraint('server', 'tools_hash', name='uq_mcp_tool_sets_server_hash')
    )
    op.create_index('ix_mcp_tool_sets_server', 'mcp_tool_sets', ['server'], unique=False)


def downgrade() -> None:
    op.drop_index('ix_mcp_tool_sets_server', table_name='mcp_tool_sets')
    op.drop_table('mcp_tool_sets')
    for name in ('method', 'at', 'server', 'connection'):
        op.drop_index(f'ix_mcp_messages_{name}', table_name='mcp_messages')
    op.drop_table('mcp_messages')
    op.drop_index('ix_mcp_connections_started_at', table_name='mcp_connections')
    op.drop_index('ix_mcp_connections_server', table_name='mcp_connections')
    op.drop_table('mcp_connections')
