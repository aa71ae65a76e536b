"""Stored sessions read for converter replay only: each turn's tools and tool calls.

`recording.load` rebuilds every turn whole (the message history walked up its chain, the
raw bytes, the timing): tens of milliseconds a turn, most of it the messages, which
converter replay never reads. This reads what it does read, in three queries per batch of
sessions, and keeps the tools arrays it has read (agents send the same one on every turn;
the store keeps each once, by hash). The other fields of the turns it returns are empty.
"""

from __future__ import annotations

from typing import Iterable, Iterator

from sqlmodel import Session as DB, select

from .. import apis
from ..store import content
from ..store.models import Blob, Session, ToolCallRow, Turn
from ..store.read import text_calls_json, tool_call_json
from .recording import RecordedCall, RecordedTurn, Recording, RecordingError

BLOBS_KEPT = 256  # distinct tools arrays remembered (each is a few to a few hundred KB)


class ToolsLoader:
    def __init__(self, reader, batch: int = 200):
        self.engine = reader.engine
        self.batch = batch  # sessions read per round of queries
        self._blobs: dict[str, object] = {}

    def load(self, session_id: str) -> Recording:
        return next(self.recordings([session_id]))

    def recordings(self, session_ids: Iterable[str]) -> Iterator[Recording]:
        """The sessions in the order given, read `batch` at a time; RecordingError names
        the first one that is not stored."""
        ids = list(session_ids)
        for start in range(0, len(ids), self.batch):
            yield from self._batch(ids[start:start + self.batch])

    def _batch(self, ids: list[str]) -> list[Recording]:
        with DB(self.engine) as db:
            sessions = {s.id: s for s in db.exec(select(Session).where(Session.id.in_(ids)))}
            missing = next((i for i in ids if i not in sessions), None)
            if missing is not None:
                raise RecordingError(f"no session {missing!r} in this database")
            turns = db.exec(select(Turn.id, Turn.session_id, Turn.parent_id, Turn.api, Turn.method, Turn.path,
                                   Turn.status, Turn.http_status, Turn.stream, Turn.model, Turn.tools_hash,
                                   Turn.request_skeleton, Turn.decoding)
                            .where(Turn.session_id.in_(ids)).order_by(Turn.id)).all()
            calls: dict[int, list[RecordedCall]] = {}
            for c in db.exec(select(ToolCallRow).join(Turn, Turn.id == ToolCallRow.turn_id)
                             .where(Turn.session_id.in_(ids)).order_by(ToolCallRow.turn_id, ToolCallRow.index)):
                calls.setdefault(c.turn_id, []).append(RecordedCall.from_api(tool_call_json(c)))
            by_session: dict[str, list[RecordedTurn]] = {i: [] for i in ids}
            for t in turns:
                native = calls.get(t.id, [])
                texts = [RecordedCall.from_api(c) for c in text_calls_json(t.decoding, len(native))]
                by_session[t.session_id].append(RecordedTurn(
                    id=t.id, parent_id=t.parent_id, api=t.api, method=t.method, path=t.path, status=t.status,
                    http_status=t.http_status, stream=bool(t.stream), model=t.model,
                    request=self._request(db, t.api, t.tools_hash, t.request_skeleton),
                    request_headers=[], response=None, response_headers=[], raw=b"", content_type=None,
                    content_encoding=None, timeline=[], ttft_ms=None, duration_ms=None,
                    calls=native + texts, decoding=t.decoding))
        return [Recording(i, sessions[i].title, sessions[i].agent, by_session[i]) for i in ids]

    def _request(self, db: DB, api_name: str, tools_hash: str | None, skeleton) -> dict | None:
        """The request body reduced to its tools: {tools key: tools array}."""
        api = apis.by_name(api_name)
        if api is None or not api.keys.tools:
            return None
        if tools_hash is None:  # not split into blobs (no message list): the skeleton is the body
            tools = skeleton.get(api.keys.tools) if isinstance(skeleton, dict) else None
        else:
            tools = self._blob(db, tools_hash)
        return {api.keys.tools: tools} if tools is not None else {}

    def _blob(self, db: DB, h: str):
        if h not in self._blobs:
            if len(self._blobs) >= BLOBS_KEPT:
                self._blobs.clear()
            data = db.exec(select(Blob.data).where(Blob.hash == h)).first()
            self._blobs[h] = None if data is None else content.unpack(data)
        return self._blobs[h]
