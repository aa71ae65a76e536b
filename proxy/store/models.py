"""The database tables.

Requests repeat themselves: an agent resends its whole history, system prompt and tools
on every turn. So messages, tools arrays and system prompts live once each in `blobs`,
keyed by the hash of their canonical JSON; a request's message list is a path in
`chain_nodes` (a trie of message-list prefixes, each node hashing its parent's hash with
its own message); a turn keeps only the rest of its request body (the skeleton), the
hash of its last chain node and the hashes of its tools and system prompt. The same
chain threads turns into sessions (see threading.py).
"""

from __future__ import annotations

from typing import Any

from sqlalchemy import JSON, BigInteger, Column, LargeBinary, Text, UniqueConstraint
from sqlmodel import Field, SQLModel

_JSON = JSON(none_as_null=True)  # Python None is SQL NULL, not the JSON text 'null'


class Blob(SQLModel, table=True):
    __tablename__ = "blobs"
    hash: str = Field(primary_key=True, max_length=32)
    data: bytes = Field(sa_column=Column(LargeBinary, nullable=False))  # zlib of compact JSON


class ChainNode(SQLModel, table=True):
    __tablename__ = "chain_nodes"
    hash: str = Field(primary_key=True, max_length=32)
    parent: str | None = Field(default=None, max_length=32, index=True)  # walked down (sessions.ADOPTABLE)
    message_hash: str = Field(max_length=32, index=True)  # is a blob still used (retention.py)
    depth: int
    session_id: str = Field(index=True, max_length=64)


class Session(SQLModel, table=True):
    __tablename__ = "sessions"
    id: str = Field(primary_key=True, max_length=64)
    title: str | None = Field(default=None, sa_column=Column(Text))
    agent: str | None = None
    started_at: float = Field(index=True)
    last_at: float = Field(index=True)
    turns: int = 0
    tool_calls: int = 0
    # Summed over every turn: a long pinned session passes 2**31 tokens (Postgres INTEGER).
    input_tokens: int = Field(default=0, sa_column=Column(BigInteger, nullable=False, default=0))
    output_tokens: int = Field(default=0, sa_column=Column(BigInteger, nullable=False, default=0))
    errors: int = 0
    models: list[str] = Field(default_factory=list, sa_column=Column(_JSON, nullable=False))
    uids: dict[str, str] | None = Field(default=None, sa_column=Column(_JSON))  # Cline uid -> MCP server


class Turn(SQLModel, table=True):
    __tablename__ = "turns"
    id: int | None = Field(default=None, primary_key=True)
    session_id: str = Field(index=True, max_length=64)
    parent_id: int | None = Field(default=None, index=True)
    api: str
    method: str
    path: str = Field(sa_column=Column(Text, nullable=False))
    upstream: str
    http_status: int | None = None
    status: str = Field(index=True)
    stream: bool = False
    started_at: float = Field(index=True)
    ttft_ms: float | None = None
    duration_ms: float | None = None
    model: str | None = Field(default=None, index=True)
    # The request: skeleton + chain + blobs; request_raw only when the body is not JSON.
    request_skeleton: Any = Field(default=None, sa_column=Column(_JSON))
    request_raw: bytes | None = Field(default=None, sa_column=Column(LargeBinary))
    request_size: int = 0
    chain_hash: str | None = Field(default=None, index=True, max_length=32)
    message_count: int = 0
    system_hash: str | None = Field(default=None, max_length=32, index=True)
    tools_hash: str | None = Field(default=None, index=True, max_length=32)
    request_headers: Any = Field(default=None, sa_column=Column(_JSON))
    # The response: reassembled JSON and the exact bytes the client got, both zlib.
    response: bytes | None = Field(default=None, sa_column=Column(LargeBinary))
    response_headers: Any = Field(default=None, sa_column=Column(_JSON))
    usage: Any = Field(default=None, sa_column=Column(_JSON))
    raw: bytes | None = Field(default=None, sa_column=Column(LargeBinary))
    raw_size: int = Field(default=0, sa_column=Column(BigInteger, nullable=False, default=0))
    raw_sha256: str = ""
    content_type: str | None = None
    content_encoding: str | None = None
    timeline: bytes | None = Field(default=None, sa_column=Column(LargeBinary))
    error: str | None = Field(default=None, sa_column=Column(Text))
    stream_error: Any = Field(default=None, sa_column=Column(_JSON))
    tool_call_count: int = 0
    decoding: Any = Field(default=None, sa_column=Column(_JSON))  # agent decoders' per-turn output
    response_text: str | None = Field(default=None, sa_column=Column(Text))  # the reply, readable by SQL (readable.py)
    uid: str | None = Field(default=None, max_length=32, unique=True, index=True)  # the journal's id for the turn
    # The id a later request names to continue from this turn (a Responses answer's or
    # conversation's, apis.base.continues): how such a request finds its parent turn.
    continue_id: str | None = Field(default=None, index=True)
    # The path prefix that chose a named upstream ("/claude"), which `path` starts with and
    # the upstream never saw; "" at the root, NULL for turns stored before it was kept.
    route: str | None = None


class ToolCallRow(SQLModel, table=True):
    __tablename__ = "tool_calls"
    id: int | None = Field(default=None, primary_key=True)
    turn_id: int = Field(index=True)
    index: int
    call_id: str | None = None
    name: str = Field(sa_column=Column(Text, nullable=False))
    arguments_raw: str = Field(sa_column=Column(Text, nullable=False))
    arguments: Any = Field(default=None, sa_column=Column(_JSON))
    arguments_error: str | None = Field(default=None, sa_column=Column(Text))
    choice: int = 0
    source: str = "wire"  # "wire": a native tool call; "text": parsed from XML in the text
    decoded: Any = Field(default=None, sa_column=Column(_JSON))
    task_progress: Any = Field(default=None, sa_column=Column(_JSON))
    result: Any = Field(default=None, sa_column=Column(_JSON))
    violations: Any = Field(default=None, sa_column=Column(_JSON))


class StoreEpoch(SQLModel, table=True):
    """One row: raised by each prune that deletes blobs or chain nodes (retention.py), so a
    writer knows to forget which of them it had stored."""

    __tablename__ = "store_epoch"
    id: int = Field(default=1, primary_key=True)
    epoch: int = Field(default=0, sa_column=Column(BigInteger, nullable=False))
    pruned_at: float | None = None


class ReplayRun(SQLModel, table=True):
    """One stored replay of a session (proxy/replay/runs.py): what ran, against what, the
    verdict, and the whole report for the inspector."""

    __tablename__ = "replay_runs"
    id: int | None = Field(default=None, primary_key=True)
    session_id: str = Field(index=True, max_length=64)
    kind: str = Field(max_length=16)  # "tools" | "recorded" | "live"
    target: str = Field(sa_column=Column(Text, nullable=False))
    ok: bool
    created_at: float
    turns: int | None = None  # counted from the report, so a list needs no unpacking
    differing: int | None = None
    pass_hat_k: float | None = None
    report: bytes = Field(sa_column=Column(LargeBinary, nullable=False))  # zlib of compact JSON


# -- the MCP tap (proxy/mcp/): agent <-> MCP server traffic ------------------------------

class McpConnection(SQLModel, table=True):
    """One run of a wrapped stdio server (`tooltap mcp`) or one HTTP MCP session."""

    __tablename__ = "mcp_connections"
    id: str = Field(primary_key=True, max_length=64)
    server: str = Field(index=True, max_length=200)
    transport: str = Field(max_length=16)  # "stdio" | "http"
    command: str | None = Field(default=None, sa_column=Column(Text))  # key-shaped values fingerprinted
    url: str | None = Field(default=None, sa_column=Column(Text))
    started_at: float = Field(index=True)
    ended_at: float | None = None
    exit_code: int | None = None
    stderr_tail: str | None = Field(default=None, sa_column=Column(Text))


class McpMessage(SQLModel, table=True):
    """One JSON-RPC line (or HTTP body / SSE event) as it crossed, kept exactly (`raw`,
    zlib); the columns are what queries filter on."""

    __tablename__ = "mcp_messages"
    __table_args__ = (UniqueConstraint("connection", "seq", name="uq_mcp_messages_connection_seq"),)
    id: int | None = Field(default=None, primary_key=True)
    connection: str = Field(index=True, max_length=64)
    seq: int  # order within the connection; with it, a spool replayed twice stores nothing twice
    server: str = Field(index=True, max_length=200)
    direction: str = Field(max_length=16)  # "to_server" | "from_server"
    at: float = Field(index=True)
    kind: str = Field(max_length=16)  # request | response | notification | batch | invalid
    method: str | None = Field(default=None, index=True, max_length=200)  # a response: its request's
    jsonrpc_id: str | None = Field(default=None, sa_column=Column(Text))  # the id as JSON text
    tool: str | None = Field(default=None, sa_column=Column(Text))  # tools/call: params.name
    is_error: bool = False
    size: int = 0
    note: str | None = Field(default=None, sa_column=Column(Text))  # why it is flagged
    raw: bytes = Field(sa_column=Column(LargeBinary, nullable=False))


class McpToolSet(SQLModel, table=True):
    """Each distinct `tools/list` answer of a server, with when it was seen."""

    __tablename__ = "mcp_tool_sets"
    __table_args__ = (UniqueConstraint("server", "tools_hash", name="uq_mcp_tool_sets_server_hash"),)
    id: int | None = Field(default=None, primary_key=True)
    server: str = Field(index=True, max_length=200)
    tools_hash: str = Field(max_length=32)
    tool_count: int = 0
    first_seen: float
    last_seen: float
    seen: int = 1
    tools: bytes = Field(sa_column=Column(LargeBinary, nullable=False))  # zlib of compact JSON
