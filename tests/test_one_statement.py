"""store/one_statement.py: many rows in one SQLite statement store exactly what
executemany stores, or it declines and the caller's executemany does."""

from __future__ import annotations

import json

import pytest
from sqlalchemy import insert, text

from proxy.store.db import make_engine, migrate
from proxy.store.models import ToolCallRow, Turn
from proxy.store.one_statement import OneStatement

CALLS = ToolCallRow.__table__
COLUMNS = ["turn_id", "index", "call_id", "name", "arguments_raw", "arguments", "arguments_error", "choice",
           "source", "decoded", "task_progress", "result", "violations"]


def call(k: int, **over) -> dict:
    row = {"turn_id": 1, "index": k, "call_id": f"call_{k}", "name": "write_to_file",
           "arguments_raw": json.dumps({"path": f"src/f{k}.py", "content": "print('é')\n" * 50}),
           "arguments": {"path": f"src/f{k}.py", "big": 2 ** 70, "nul": "a\x00b", "deep": [[[[{}]]]]},
           "arguments_error": None, "choice": 0, "source": "stream", "decoded": None,
           "task_progress": None, "result": None, "violations": []}
    return {**row, **over}


@pytest.fixture
def engines(tmp_path):
    made = [make_engine(f"sqlite:///{tmp_path / name}.db") for name in ("one", "each")]
    for engine in made:
        migrate(engine)
    yield made
    for engine in made:
        engine.dispose()


def stored(engine) -> list:
    with engine.connect() as c:
        return c.execute(text("SELECT *, typeof(result), typeof(violations) FROM tool_calls ORDER BY id")).all()


def test_rows_stored_in_one_statement_are_the_rows_executemany_stores(engines):
    one, each = engines
    rows = [call(k) for k in range(5)]
    with one.begin() as c:
        assert OneStatement(CALLS, COLUMNS).run(c, rows)
    with each.begin() as c:
        c.execute(insert(CALLS), rows)
    assert stored(one) == stored(each)
    update = [{"turn_id": 1, "index": k, "decoded": {"tool": "write_to_file"}, "task_progress": None,
               "result": {"text": f"wrote f{k}.py\n\u2028 ünïcode \\ \"quoted\""}, "violations": None}
              for k in (1, 3)]
    setter = OneStatement(CALLS, ["decoded", "task_progress", "result", "violations"], key=("turn_id", "index"))
    with one.begin() as c:
        assert setter.run(c, update)
    with each.begin() as c:
        for row in update:
            c.execute(CALLS.update().where(CALLS.c.turn_id == row["turn_id"], CALLS.c["index"] == row["index"])
                      .values(**{k: v for k, v in row.items() if k not in ("turn_id", "index")}))
    rows_one = stored(one)
    assert rows_one == stored(each)
    assert [r.result is not None for r in rows_one] == [False, True, False, True, False]
    assert {r[-1] for r in rows_one} == {"null", "text"}  # None is SQL NULL, [] is the text '[]'
    with one.connect() as c:  # and the search index has the results' words
        hits = c.execute(text("SELECT rowid FROM search_tool_results WHERE search_tool_results MATCH 'ünïcode'"))
        assert sorted(r[0] for r in hits) == [rows_one[1].id, rows_one[3].id]


def test_a_value_json_would_change_is_left_to_executemany(engines):
    one, _ = engines
    with one.begin() as c:
        # SQLite's JSON ends a string at a NUL: such a row is declined, and nothing is written.
        assert not OneStatement(CALLS, COLUMNS).run(c, [call(0), call(1, arguments_raw="a\x00b")])
        assert not OneStatement(CALLS, COLUMNS).run(c, [call(0, choice=2 ** 70)])
    assert stored(one) == []
    with pytest.raises(ValueError, match="REAL"):  # a float may not come back bit for bit
        OneStatement(Turn.__table__, ["started_at"])
