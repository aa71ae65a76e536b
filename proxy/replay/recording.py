"""A stored session as plain data, the input of every replay.

Reading the store happens here, once; everything downstream works on `Recording`."""

from __future__ import annotations

import functools
from dataclasses import dataclass, field
from typing import Any, Iterator

from ..apis.base import ToolCall


class RecordingError(LookupError):
    """The database or the session asked for is not there (the message says which)."""


@dataclass
class RecordedCall:
    """One tool call as stored: the raw name, what the decoders made of it, the arguments."""

    index: int
    id: str | None
    name: str
    decoded: dict | None
    arguments: Any
    arguments_raw: str = ""
    task_progress: dict | None = None
    result: dict | None = None
    violations: list = field(default_factory=list)

    @classmethod
    def from_api(cls, c: dict) -> "RecordedCall":
        raw, arguments = c.get("arguments_raw") or "", c.get("arguments")
        if arguments is None and raw.strip():
            # What the store could not hold (a lone surrogate, NaN) is parsed again from the
            # text by the assemblers' own rule: else a replay of the same bytes would differ.
            arguments = ToolCall.from_raw(0, None, "", raw).arguments
        return cls(index=c.get("index", 0), id=c.get("id"), name=c.get("name") or "",
                   decoded=c.get("decoded"), arguments=arguments, arguments_raw=raw,
                   task_progress=c.get("task_progress"), result=c.get("result"), violations=c.get("violations") or [])

    @property
    def tool(self) -> str:
        """The tool this call names, decoded: `server/tool` for MCP, else the tool."""
        return tool_key(self.name, self.decoded)


def tool_key(name: str, decoded: dict | None) -> str:
    if not decoded:
        return name
    if decoded.get("kind") == "mcp" and decoded.get("server"):
        return f"{decoded['server']}/{decoded.get('tool') or name}"
    return decoded.get("tool") or name


@dataclass
class RecordedTurn:
    id: int
    parent_id: int | None
    api: str  # "openai.chat", "anthropic.messages", "openai.responses", "gemini", "other"
    method: str
    path: str  # as the agent asked, query included
    status: str
    http_status: int | None
    stream: bool
    model: str | None
    request: Any  # the body as sent: a dict for JSON, else text
    request_headers: list  # [[name, value]], secrets as fingerprints
    response: dict | None  # the non-streaming equivalent
    response_headers: list
    raw: bytes  # the exact bytes the agent got
    content_type: str | None
    content_encoding: str | None
    timeline: list  # [[byte offset, ms since start]]
    ttft_ms: float | None
    duration_ms: float | None
    calls: list[RecordedCall]
    decoding: dict | None

    def chunks(self) -> list[tuple[float, bytes]]:
        """The raw bytes cut where the network cut them: [(ms since start, bytes)]."""
        cuts = [(int(off), float(ms)) for off, ms in self.timeline if 0 <= int(off) <= len(self.raw)]
        if not cuts:
            return [(self.ttft_ms or 0.0, self.raw)] if self.raw else []
        out, start = [], 0
        for i, (off, ms) in enumerate(cuts):
            end = cuts[i + 1][0] if i + 1 < len(cuts) else len(self.raw)
            if end > start:
                out.append((ms, self.raw[start:end]))
                start = end
        if start < len(self.raw):  # a timeline cut short at its limit keeps the rest whole
            out.append((cuts[-1][1], self.raw[start:]))
        return out


@dataclass
class Recording:
    session_id: str
    title: str | None
    agent: str | None
    turns: list[RecordedTurn]

    def turn(self, turn_id: int) -> RecordedTurn | None:
        return next((t for t in self.turns if t.id == turn_id), None)

    @functools.cached_property  # asked for each turn named
    def places(self) -> dict[int, int]:
        """Turn id -> its place in the session (1 for the first), by id as the inspector
        numbers them: what a person calls the turn; the id is for URLs and the API."""
        return {turn_id: n for n, turn_id in enumerate(sorted(t.id for t in self.turns), 1)}


def turn_name(place: int | None, turn_id: int | None) -> str:
    """`turn 2 (#7)`: the turn's place in its session, its id beside it (the id alone
    when the place is not known, as in a run stored before places were)."""
    if place is None:
        return f"turn #{turn_id}"
    return f"turn {place} (#{turn_id})"


def open_reader(db_url: str):
    """A Reader over an existing database: a read never creates one."""
    from ..store.db import DatabaseUnavailable, open_database
    from ..store.read import Reader

    try:
        return Reader(open_database(db_url, create=False))
    except DatabaseUnavailable as exc:
        raise RecordingError(str(exc)) from exc


def full_id(reader, given: str) -> str:
    """The session id `given` names, whole or by its start; RecordingError saying why not."""
    try:
        return reader.full_session_id(given)
    except LookupError as exc:
        raise RecordingError(f"{exc} (session ids are in the inspector's addresses and in "
                             "/_tooltap/api/sessions)") from None


def load(reader, session_id: str) -> Recording:
    """One stored session with every turn whole, in the order they arrived."""
    from ..store.read import Reader

    reader = Reader(reader.engine, cache_blobs=True)  # each message read once per session
    session_id = full_id(reader, session_id)
    session = reader.session(session_id)
    if session is None:  # pruned meanwhile
        raise RecordingError(f"no session {session_id!r} in this database")
    turns = []
    for summary in session["turns"]:
        t = reader.turn(summary["id"])
        raw, content_type, encoding = reader.raw(t["id"]) or (b"", None, None)
        turns.append(RecordedTurn(
            id=t["id"], parent_id=t.get("parent_id"), api=t["api"], method=t["method"], path=t["path"],
            status=t["status"], http_status=t["http_status"], stream=bool(t["stream"]), model=t.get("model"),
            request=t["request"], request_headers=t.get("request_headers") or [],
            response=t.get("response"), response_headers=t.get("response_headers") or [],
            raw=raw or b"", content_type=content_type, content_encoding=encoding,
            timeline=reader.timeline(t["id"]) or [], ttft_ms=t.get("ttft_ms"), duration_ms=t.get("duration_ms"),
            calls=[RecordedCall.from_api(c) for c in t["tool_calls"]], decoding=t.get("decoding"),
        ))
    return Recording(session_id, session.get("title"), session.get("agent"), turns)


def session_ids(reader) -> Iterator[str]:
    """Every stored session id, oldest first."""
    from sqlmodel import Session as DB, select

    from ..store.models import Session

    with DB(reader.engine) as db:
        yield from db.exec(select(Session.id).order_by(Session.started_at, Session.id)).all()
