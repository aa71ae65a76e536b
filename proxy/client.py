"""A typed Python read API over tooltap's captures, for notebooks, scripts and tests.

    from proxy import client

    tt = client.connect("tooltap.db")                # a database file (or any --db URL)
    tt = client.connect("http://127.0.0.1:8000")     # or a running tooltap (token=... if it asks)

    for session in tt.sessions():
        print(session.id, session.title, session.turns, session.input_tokens)
    for call in tt.tool_calls(session.id):
        print(call.tool, call.server, call.arguments, call.result_text)

Both read the same JSON the inspector's API serves (proxy/store/read.py), so a script
works the same against a file and against a server. Everything is read-only.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, Iterator
from urllib.parse import quote

PAGE = 500


class ClientError(RuntimeError):
    """The database or server cannot be read (the message says why)."""


@dataclass(frozen=True)
class ToolCall:
    turn_id: int
    index: int
    id: str | None
    name: str  # as the model wrote it: `cIya4J0mcp0get_forecast`
    tool: str  # decoded: `get_forecast`
    server: str | None  # the MCP server, for an MCP tool: `weather`
    kind: str | None  # "builtin", "mcp", ...
    arguments: Any
    arguments_raw: str
    arguments_error: str | None
    task_progress: dict | None  # Cline's checklist: {raw, items, done, total, ...}
    result: dict | None  # paired from the next request: {text, status, ...}
    violations: list
    source: str  # "wire" (a native tool call) or "text" (XML in the reply's text)
    decoded: dict | None
    mcp: dict | None = None  # the MCP exchange it became, when the MCP tap saw it

    @property
    def result_text(self) -> str | None:
        return (self.result or {}).get("text")

    @classmethod
    def from_json(cls, turn_id: int, c: dict) -> "ToolCall":
        decoded = c.get("decoded") or {}
        return cls(
            turn_id=turn_id, index=c.get("index", 0), id=c.get("id"), name=c.get("name") or "",
            tool=decoded.get("tool") or c.get("name") or "", server=decoded.get("server"), kind=decoded.get("kind"),
            arguments=c.get("arguments"), arguments_raw=c.get("arguments_raw") or "",
            arguments_error=c.get("arguments_error"), task_progress=c.get("task_progress"), result=c.get("result"),
            violations=c.get("violations") or [], source=c.get("source") or "wire", decoded=c.get("decoded"),
            mcp=c.get("mcp"),
        )


@dataclass(frozen=True)
class Turn:
    id: int
    session_id: str
    parent_id: int | None
    api: str
    method: str
    path: str
    upstream: str
    model: str | None
    http_status: int | None
    status: str
    stream: bool
    started_at: datetime | None
    ttft_ms: float | None
    duration_ms: float | None
    usage: dict | None
    error: str | None
    request: Any  # the body as sent (JSON rebuilt), or its text
    response: Any  # the non-streaming equivalent of what the agent got
    request_headers: list  # secrets as fingerprints
    response_headers: list
    tool_calls: list[ToolCall]
    decoding: dict | None

    @classmethod
    def from_json(cls, t: dict) -> "Turn":
        return cls(
            id=t["id"], session_id=t["session_id"], parent_id=t.get("parent_id"), api=t["api"], method=t["method"],
            path=t["path"], upstream=t["upstream"], model=t.get("model"), http_status=t.get("http_status"),
            status=t["status"], stream=bool(t.get("stream")), started_at=_time(t.get("started_at")),
            ttft_ms=t.get("ttft_ms"), duration_ms=t.get("duration_ms"), usage=t.get("usage"), error=t.get("error"),
            request=t.get("request"), response=t.get("response"), request_headers=t.get("request_headers") or [],
            response_headers=t.get("response_headers") or [],
            tool_calls=[ToolCall.from_json(t["id"], c) for c in t.get("tool_calls") or []],
            decoding=t.get("decoding"),
        )


@dataclass(frozen=True)
class Session:
    id: str
    title: str | None
    agent: str | None
    started_at: datetime | None
    last_at: datetime | None
    turns: int
    tool_calls: int
    input_tokens: int
    output_tokens: int
    errors: int
    models: list[str] = field(default_factory=list)
    turn_ids: list[int] = field(default_factory=list)  # filled by `session()`, oldest first

    @classmethod
    def from_json(cls, s: dict) -> "Session":
        # The list gives a count; one session read alone gives its turns instead.
        turns = s.get("turns") or 0
        return cls(
            id=s["id"], title=s.get("title"), agent=s.get("agent"), started_at=_time(s.get("started_at")),
            last_at=_time(s.get("last_at")), turns=len(turns) if isinstance(turns, list) else turns,
            tool_calls=s.get("tool_calls", 0), input_tokens=s.get("input_tokens", 0),
            output_tokens=s.get("output_tokens", 0), errors=s.get("errors", 0), models=list(s.get("models") or []),
            turn_ids=[t["id"] for t in turns] if isinstance(turns, list) else [],
        )


class Tooltap:
    """Reads sessions, turns and tool calls; build it with `connect()`."""

    def __init__(self, source) -> None:
        self._source = source

    def sessions(self, limit: int | None = None) -> list[Session]:
        """Sessions, the most recently active first."""
        return list(self._sessions(limit))

    def _sessions(self, limit: int | None) -> Iterator[Session]:
        offset = 0
        while limit is None or offset < limit:
            page = self._source.sessions(PAGE if limit is None else min(PAGE, limit - offset), offset)
            yield from (Session.from_json(s) for s in page)
            if len(page) < PAGE:
                return
            offset += len(page)

    def session(self, session_id: str) -> Session | None:
        found = self._source.session(session_id)
        return None if found is None else Session.from_json(found)

    def turns(self, session_id: str) -> list[Turn]:
        """Every turn of a session, whole, in the order they arrived."""
        found = self._source.session(session_id)
        if found is None:
            raise ClientError(f"no session {session_id!r}")
        return [self.turn(t["id"]) for t in found["turns"]]

    def turn(self, turn_id: int) -> Turn:
        found = self._source.turn(turn_id)
        if found is None:
            raise ClientError(f"no turn {turn_id}")
        return Turn.from_json(found)

    def tool_calls(self, session_id: str | None = None) -> list[ToolCall]:
        """The tool calls of one session (or of every session), in order."""
        ids = [session_id] if session_id is not None else [s.id for s in reversed(self.sessions())]
        return [c for sid in ids for t in self.turns(sid) for c in t.tool_calls]

    def close(self) -> None:
        self._source.close()

    def __enter__(self) -> "Tooltap":
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def connect(target: str, token: str | None = None, timeout: float = 30.0) -> Tooltap:
    """A database (a file path or a --db URL) or a running tooltap (http://HOST:PORT)."""
    if target.startswith(("http://", "https://")):
        return Tooltap(_Http(target, token, timeout))
    return Tooltap(_File(target))


class _File:
    def __init__(self, db_url: str) -> None:
        from .store.db import DatabaseUnavailable, open_database
        from .store.read import Reader

        try:
            self.engine = open_database(db_url, create=False)
        except DatabaseUnavailable as exc:
            raise ClientError(str(exc)) from None
        self.reader = Reader(self.engine)

    def sessions(self, limit: int, offset: int) -> list[dict]:
        return self.reader.sessions(limit=limit, offset=offset)

    def session(self, session_id: str) -> dict | None:
        return self.reader.session(session_id)

    def turn(self, turn_id: int) -> dict | None:
        return self.reader.turn(turn_id)

    def close(self) -> None:
        self.engine.dispose()


class _Http:
    def __init__(self, url: str, token: str | None, timeout: float) -> None:
        import httpx

        headers = {"x-tooltap-token": token} if token else {}
        self.http = httpx.Client(base_url=url.rstrip("/") + "/_tooltap/api", headers=headers, timeout=timeout)
        self.url = url

    def _get(self, path: str, **params) -> Any:
        import httpx

        try:
            r = self.http.get(path, params=params)
        except httpx.HTTPError as exc:
            raise ClientError(f"cannot reach tooltap at {self.url}: {exc}") from None
        if r.status_code == 404:
            return None
        if r.status_code == 401:
            raise ClientError(f"tooltap at {self.url} asks for its UI token: connect(..., token=...)")
        if r.status_code != 200:
            raise ClientError(f"tooltap at {self.url} answered {r.status_code} for {path}")
        return r.json()

    def sessions(self, limit: int, offset: int) -> list[dict]:
        return (self._get("/sessions", limit=limit, offset=offset) or {}).get("sessions", [])

    def session(self, session_id: str) -> dict | None:
        return self._get(f"/sessions/{quote(session_id, safe='')}")

    def turn(self, turn_id: int) -> dict | None:
        return self._get(f"/turns/{int(turn_id)}")

    def close(self) -> None:
        self.http.close()


def _time(value: str | None) -> datetime | None:
    return datetime.fromisoformat(value.replace("Z", "+00:00")) if value else None
