"""Alembic environment: run with the connection tooltap hands over, or from alembic.ini's URL."""

from alembic import context
from sqlalchemy import engine_from_config, pool
from sqlmodel import SQLModel

from proxy.store import models  # noqa: F401  (registers the tables on SQLModel.metadata)

config = context.config
target_metadata = SQLModel.metadata


def run(connection) -> None:
    sqlite = connection.dialect.name == "sqlite"
    context.configure(
        connection=connection,
        target_metadata=target_metadata,
        render_as_batch=sqlite,
    )
    if sqlite:
        # Batch mode rebuilds a table and renames the copy; SQLite's modern rename would
        # refuse while a view (0005) names the table, so the legacy rename is used.
        connection.exec_driver_sql("PRAGMA legacy_alter_table=ON")
    try:
        with context.begin_transaction():
            context.run_migrations()
    finally:
        if sqlite:
            connection.exec_driver_sql("PRAGMA legacy_alter_table=OFF")


connection = config.attributes.get("connection")
if connection is not None:
    run(connection)
else:
    engine = engine_from_config(config.get_section(config.config_ini_section) or {},
                                prefix="sqlalchemy.", poolclass=pool.NullPool)
    with engine.connect() as conn:
        run(conn)
