"""`tooltap schemas ...` (being written)."""

import click


@click.group()
def schemas() -> None:
    """Tool schemas: list, show, convert and diff tool sets."""
