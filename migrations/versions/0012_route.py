"""route: the path prefix that chose a named upstream

A turn's `path` is what the agent asked tooltap for; under a named upstream
(`--upstream claude=https://api.anthropic.com`) it starts with `/claude`, which the
upstream never saw. Where a turn is written as the request the upstream got (a HAR
export) that prefix must come off: the new column keeps it ("" at the root). Turns
stored before hold NULL: their prefix is not known, and their path is used as it is.

Revision ID: 0012
Revises: 0011
Create Date: 2026-12-12 10:00:00.000000
"""
from alembic import op
import sqlalchemy as sa


revision = '0012'
down_revision = '0011'
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.add_column("turns", sa.Column("route", sa.String(), nullable=True))


def downgrade() -> None:
    op.drop_column("turns", "route")
