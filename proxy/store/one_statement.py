"""Many rows of a table written by one SQL statement on SQLite, where executemany would run
one statement a row.

Why: tool_calls carries the search index's triggers (migration 0008), which write to
FTS5 tables, and SQLite (3.40 here) has FTS5 flush the words it holds to the database at
every statement's savepoint. A statement per row therefore wrote a small index segment
per tool call and merged them as they piled up: 0.3-0.4 ms a call with a 3 KB result or
a 3 KB argument (a file Cline writes), against about 0.05 ms once per batch. The rows
travel as one JSON array, unpacked by json_each; each value arrives as the column would
store it (a JSON column's text, SQL NULL for None).

Postgres, and a SQLite older than 3.33 (no UPDATE ... FROM), keep executemany, as do
rows JSON cannot carry as they are: a NUL in a string (SQLite's JSON cuts the string
there), an integer past 64 bits. `OneStatement.run` says whether it wrote the rows. A
REAL column is refused outright: SQLite's parse of a number may differ from Python's in
the last bit.
"""

from __future__ import annotations

import sqlite3
from typing import Any

import orjson
from sqlalchemy import JSON, Float, Table, text

from .db import json_text

AVAILABLE = sqlite3.sqlite_version_info >= (3, 33)


class OneStatement:
    """INSERT rows into `table` (no `key`), or UPDATE the rows matched on the `key`
    columns, setting the other `columns`; rows are dicts by column name."""

    def __init__(self, table: Table, columns: list[str], key: tuple[str, ...] = ()) -> None:
        self.columns = [*key, *columns]
        if any(isinstance(table.c[n].type, Float) for n in self.columns):
            raise ValueError(f"{table.name}: a REAL column would not come back bit for bit through JSON")
        self._json = {n for n in self.columns if isinstance(table.c[n].type, JSON)}
        value = {n: f"json_extract(r.value, '$[{k}]')" for k, n in enumerate(self.columns)}
        quoted = {n: f'"{n}"' for n in self.columns}
        if key:
            self._sql = text(
                f"UPDATE {table.name} SET {', '.join(f'{quoted[n]} = {value[n]}' for n in columns)} "
                f"FROM json_each(:rows) AS r WHERE "
                + " AND ".join(f"{table.name}.{quoted[n]} = {value[n]}" for n in key))
        else:
            self._sql = text(f"INSERT INTO {table.name} ({', '.join(quoted[n] for n in self.columns)}) "
                             f"SELECT {', '.join(value.values())} FROM json_each(:rows) AS r")

    def run(self, conn, rows: list[dict[str, Any]]) -> bool:
        """Write the rows in one statement; False (nothing written) where that cannot be:
        not SQLite, an old SQLite, or a value JSON cannot carry (the caller then uses
        executemany, which stores it or says why not)."""
        if conn.dialect.name != "sqlite" or not AVAILABLE:
            return False
        try:
            packed = orjson.dumps([[self._value(n, row[n]) for n in self.columns] for row in rows])
        except (_Unfit, TypeError, orjson.JSONEncodeError):  # also a lone surrogate
            return False
        conn.execute(self._sql, {"rows": packed.decode()})
        return True

    def _value(self, name: str, v: Any) -> Any:
        if v is not None and name in self._json:
            return json_text(v)  # its NULs escaped, as \\u0000
        if isinstance(v, str) and "\x00" in v:
            raise _Unfit
        return v


class _Unfit(Exception):
    """A value one JSON statement would not store as it is."""
