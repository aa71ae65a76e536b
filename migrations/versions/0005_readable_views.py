"""readable SQL views: turns_v, tool_calls_v, sessions_v (and turns.response_text)

Plain views anyone can query (`sqlite3 tooltap.db`, Datasette, psql) with no knowledge of
tooltap's storage: decoded tool names and MCP servers, task_progress checklists, paired
results, token counts, times as UTC text. One definition per dialect (JSON paths and
dates are written differently in SQLite and Postgres); the columns are the same.

What a view can show: every tool-call column and the decoders' output are plain JSON
columns, readable in place. What it cannot: messages and responses are zlib-compressed
blobs, which SQLite cannot open in SQL; the reply's text is kept readable beside them
(turns.response_text, filled here for turns stored before, and by ingest from now on).

A later migration that rebuilds turns, tool_calls or sessions in SQLite's batch mode
needs nothing special: migrations/env.py sets `legacy_alter_table` so the final rename
does not trip over these views.

Revision ID: 0005
Revises: 0004
Create Date: 2026-12-04 10:00:00.000000
"""
from alembic import op
import sqlalchemy as sa


revision = '0005'
down_revision = '0004'
branch_labels = None
depends_on = None

VIEWS = ("sessions_v", "tool_calls_v", "turns_v")


class _Dialect:
    """The few expressions the two databases write differently."""

    def __init__(self, name: str):
        self.pg = name == "postgresql"

    def j(self, column: str, path: str) -> str:
        """A JSON value at `a.b` as SQL text/number (NULL when absent)."""
        if self.pg:
            return f"({column} #>> '{{{path.replace('.', ',')}}}')"
        return f"json_extract({column}, '$.{path}')"

    def j_json(self, column: str, path: str) -> str:
        """A JSON value at `path`, as JSON text."""
        if self.pg:
            return f"(({column} #> '{{{path.replace('.', ',')}}}')::text)"
        return f"json_extract({column}, '$.{path}')"  # objects and arrays come out as JSON text

    def array_length(self, json_expr: str) -> str:
        """The length of a JSON array (NULL when it is no array)."""
        if self.pg:
            return f"json_array_length(CASE WHEN json_typeof({json_expr}) = 'array' THEN {json_expr} END)"
        return f"json_array_length({json_expr})"

    def time(self, column: str) -> str:
        """Unix seconds as 'YYYY-MM-DD HH:MM:SS.mmm' (UTC)."""
        if self.pg:
            return f"to_char(to_timestamp({column}) AT TIME ZONE 'UTC', 'YYYY-MM-DD HH24:MI:SS.MS')"
        return f"strftime('%Y-%m-%d %H:%M:%f', {column}, 'unixepoch')"

    def int(self, expr: str) -> str:
        return f"CAST({expr} AS INTEGER)"

    def joined(self, array_column: str) -> str:
        """A JSON array of strings as 'a, b'."""
        if self.pg:
            return f"(SELECT string_agg(value, ', ') FROM json_array_elements_text({array_column}))"
        return f"(SELECT group_concat(value, ', ') FROM json_each({array_column}))"

    def joined_values(self, object_column: str) -> str:
        """The distinct values of a JSON object as 'a, b'."""
        if self.pg:
            return f"(SELECT string_agg(DISTINCT value, ', ') FROM json_each_text({object_column}))"
        return f"(SELECT group_concat(value, ', ') FROM (SELECT DISTINCT value FROM json_each({object_column})))"

    def tool_names(self, turn_id: str) -> str:
        """The decoded names of a turn's calls, in order, as 'a, b'."""
        name = f"COALESCE({self.j('c.decoded', 'tool')}, c.name)"
        if self.pg:
            return f'(SELECT string_agg({name}, \', \' ORDER BY c."index") FROM tool_calls c WHERE c.turn_id = {turn_id})'
        return (f"(SELECT group_concat(x, ', ') FROM (SELECT {name} AS x FROM tool_calls c "
                f'WHERE c.turn_id = {turn_id} ORDER BY c."index"))')

    def text_calls(self) -> str:
        """FROM clause: turns joined with the calls a model wrote as XML in its text
        (kept in turns.decoding); `c.value` is one call, `c.pos` its place."""
        if self.pg:
            return ("turns t CROSS JOIN LATERAL json_array_elements(CASE WHEN json_typeof(t.decoding -> "
                    "'text_tool_calls') = 'array' THEN t.decoding -> 'text_tool_calls' END) "
                    "WITH ORDINALITY AS c(value, pos)")
        return ("turns t JOIN (SELECT t2.id AS turn_id, e.value AS value, e.key + 1 AS pos FROM turns t2, "
                "json_each(t2.decoding, '$.text_tool_calls') e "
                "WHERE json_type(t2.decoding, '$.text_tool_calls') = 'array') c ON c.turn_id = t.id")


def _sessions_v(d: _Dialect) -> str:
    return f"""CREATE VIEW sessions_v AS
SELECT s.id, s.title, s.agent,
  {d.time('s.started_at')} AS started_at, {d.time('s.last_at')} AS last_at,
  s.last_at - s.started_at AS seconds,
  s.turns, s.tool_calls, s.input_tokens, s.output_tokens, s.errors,
  {d.joined('s.models')} AS models,
  {d.joined_values('s.uids')} AS mcp_servers
FROM sessions s"""


def _turns_v(d: _Dialect) -> str:
    def tokens(*keys: str) -> str:
        return d.int("COALESCE(" + ", ".join(d.j("t.usage", k) for k in keys) + ")")

    return f"""CREATE VIEW turns_v AS
SELECT t.id, t.session_id, t.parent_id,
  {d.time('t.started_at')} AS started_at, t.started_at AS started_unix,
  t.api, t.model, {d.j('t.decoding', 'agent')} AS agent, {d.j('t.decoding', 'environment.mode')} AS mode,
  t.status, t.http_status, t.stream, t.ttft_ms, t.duration_ms,
  {tokens('prompt_tokens', 'input_tokens', 'promptTokenCount')} AS input_tokens,
  {tokens('completion_tokens', 'output_tokens', 'candidatesTokenCount')} AS output_tokens,
  t.tool_call_count AS tool_calls, {d.tool_names('t.id')} AS tools,
  t.response_text, t.error, t.message_count AS messages, t.request_size AS request_bytes,
  t.raw_size AS response_bytes, t.upstream, t.path
FROM turns t"""


def _tool_calls_v(d: _Dialect) -> str:
    wire = f"""SELECT c.id, c.turn_id, t.session_id, {d.time('t.started_at')} AS started_at, t.model,
  COALESCE({d.j('c.decoded', 'tool')}, c.name) AS tool, {d.j('c.decoded', 'server')} AS server,
  {d.j('c.decoded', 'kind')} AS kind, c.name, c.call_id, c.arguments_raw AS arguments, c.arguments_error,
  {d.j('c.task_progress', 'raw')} AS task_progress,
  {d.int(d.j('c.task_progress', 'done'))} AS progress_done,
  {d.int(d.j('c.task_progress', 'total'))} AS progress_total,
  {d.j('c.result', 'status')} AS result_status, {d.j('c.result', 'text')} AS result_text,
  {d.array_length('c.violations')} AS violations,
  c.source, c."index", t.status AS turn_status
FROM tool_calls c JOIN turns t ON t.id = c.turn_id"""
    v = "c.value"
    text = f"""SELECT NULL, t.id, t.session_id, {d.time('t.started_at')}, t.model,
  COALESCE({d.j(v, 'decoded.tool')}, {d.j(v, 'name')}), {d.j(v, 'decoded.server')},
  {d.j(v, 'decoded.kind')}, {d.j(v, 'name')}, NULL, {d.j_json(v, 'params')}, {d.j(v, 'arguments_error')},
  {d.j(v, 'task_progress.raw')},
  {d.int(d.j(v, 'task_progress.done'))}, {d.int(d.j(v, 'task_progress.total'))},
  {d.j(v, 'result.status')}, {d.j(v, 'result.text')},
  {d.array_length("(c.value -> 'violations')" if d.pg else d.j_json(v, 'violations'))},
  'text', t.tool_call_count + {d.int('c.pos')} - 1, t.status
FROM {d.text_calls()}"""
    return f"CREATE VIEW tool_calls_v AS\n{wire}\nUNION ALL\n{text}"


def upgrade() -> None:
    op.add_column('turns', sa.Column('response_text', sa.Text(), nullable=True))
    _fill_response_text()
    d = _Dialect(op.get_bind().dialect.name)
    for create in (_turns_v(d), _tool_calls_v(d), _sessions_v(d)):
        op.execute(create)


def downgrade() -> None:
    for view in VIEWS:
        op.execute(f"DROP VIEW IF EXISTS {view}")
    with op.batch_alter_table('turns', schema=None) as batch_op:
        batch_op.drop_column('response_text')


def _fill_response_text(batch: int = 500) -> None:
    """The reply's text for turns stored before this migration (a one-time pass)."""
    from proxy.store.content import unpack
    from proxy.store.readable import reply_text

    conn = op.get_bind()
    turns = sa.table('turns', sa.column('id', sa.Integer), sa.column('api', sa.String),
                     sa.column('response', sa.LargeBinary), sa.column('response_text', sa.Text))
    last = 0
    while True:
        rows = conn.execute(
            sa.select(turns.c.id, turns.c.api, turns.c.response)
            .where(turns.c.id > last, turns.c.response.is_not(None)).order_by(turns.c.id).limit(batch)
        ).all()
        if not rows:
            return
        updates = []
        for turn_id, api, response in rows:
            try:
                text = reply_text(api, unpack(response))
            except Exception:  # a response that does not unpack keeps no readable copy
                text = None
            if text is not None:
                updates.append({"turn_id": turn_id, "text": text})
        if updates:
            conn.execute(turns.update().where(turns.c.id == sa.bindparam("turn_id"))
                         .values(response_text=sa.bindparam("text")), updates)
        last = rows[-1][0]
