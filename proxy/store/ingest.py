"""Turn a captured exchange (`TurnRecord`) into rows. Runs on the writer thread."""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

from sqlalchemy.dialects import postgresql, sqlite
from sqlmodel import Session as DB

from .. import apis
from ..capture import TurnRecord, assemble, decompress
from . import content
from .models import Blob, ChainNode, Session, ToolCallRow, Turn
from .readable import reply_text
from .sessions import OTHER_PREFIX, OTHER_TITLE, chain_root, place, session_key

TITLE_MAX = 200
KNOWN_MAX = 500_000  # blob and chain hashes remembered as written (~40 MB at most)
JSON_MAX = 32 << 20  # a bigger body is stored raw, not parsed: it would cost its size many times over


def _header(headers: list[list[str]], name: str) -> str | None:
    return next((v for k, v in headers if k.lower() == name), None)


@dataclass
class Ingested:
    """A stored turn with what the decoders need, still in memory: no need to read it back."""

    turn: Turn
    request: dict | None
    response: Any
    calls: list[ToolCallRow]


class Ingestor:
    """Writes turns; remembers which blobs and chain nodes exist to skip re-inserting them."""

    def __init__(self, dialect: str):
        self._insert = postgresql.insert if dialect == "postgresql" else sqlite.insert
        self._known: set[str] = set()  # blob and chain hashes written by this process

    def _put_ignore(self, db: DB, model, rows: list[dict], key: str) -> None:
        rows = [r for r in rows if r[key] not in self._known]
        if rows:
            # One statement shape for any number of rows (executemany): compiled once.
            stmt = self._insert(model).on_conflict_do_nothing(index_elements=[key])
            db.connection().execute(stmt, rows)
            if len(self._known) > KNOWN_MAX:  # a cache, not a record: start over
                self._known.clear()
            self._known.update(r[key] for r in rows)

    def put_blobs(self, db: DB, values: list[Any]) -> list[str]:
        hashes, rows = [], []
        for value in values:
            h = content.content_hash(value)
            hashes.append(h)
            if h not in self._known:
                rows.append({"hash": h, "data": content.pack(value)})
        self._put_ignore(db, Blob, list({r["hash"]: r for r in rows}.values()), "hash")
        return hashes

    def add(self, db: DB, rec: TurnRecord) -> "Ingested":
        api = apis.by_name(rec.api)
        request, request_problem = content.parse_strict(rec.request_body)
        response, response_note = self._response(rec, api)
        turn = Turn(
            session_id="", api=rec.api, method=rec.method, path=rec.path, upstream=rec.upstream,
            http_status=rec.http_status, status=rec.status, stream=rec.stream,
            started_at=rec.started_at, ttft_ms=rec.ttft_ms, duration_ms=rec.duration_ms,
            request_size=len(rec.request_body), request_headers=rec.request_headers,
            response_headers=rec.response_headers,
            raw=content.compress_chunks(rec.iter_raw(), 6 if rec.raw_size < (8 << 20) else 1),
            raw_size=rec.raw_size, raw_sha256=rec.raw_sha256,
            content_type=_header(rec.response_headers, "content-type"),
            content_encoding=_header(rec.response_headers, "content-encoding"),
            timeline=content.pack(rec.timeline) if rec.timeline else None,
            error="; ".join(e for e in (rec.error, _request_note(rec, request_problem), response_note) if e) or None,
            stream_error=rec.stream_error,
            uid=getattr(rec, "uid", None) or None,  # the journal's id: a turn is never stored twice
        )
        if response is not None:
            turn.response = content.pack(response)
            turn.response_text = reply_text(rec.api, response)
        if not isinstance(request, dict):
            turn.request_raw = content.compress_chunks([rec.request_body]) if rec.request_body else None
            request = None

        hashes: list[str] = []
        if request is not None:
            turn.model = ((api.model(request, response) if api else None) or request.get("model")
                          or _model_in_path(rec.path))
            hashes = self._split_request(db, turn, request, api)
        chain = content.chain(hashes, chain_root(rec.api, rec.upstream))
        turn.chain_hash = chain[-1] if chain else None
        placement = place(db, chain, session_key(rec.session_hint))
        turn.session_id, turn.parent_id = placement.session_id, placement.parent_id
        if chain:
            self._put_ignore(db, ChainNode, [
                {"hash": h, "parent": chain[i - 1] if i else None, "message_hash": m,
                 "depth": i + 1, "session_id": placement.session_id}
                for i, (h, m) in enumerate(zip(chain, hashes))
            ], "hash")

        calls: list[apis.ToolCall] = []
        if api is not None and isinstance(response, dict):
            turn.usage = api.usage(response)
            try:
                calls = api.tool_calls(response)
            except Exception as exc:  # a response we cannot read still stores
                turn.error = "; ".join(filter(None, [turn.error, f"tool calls: {exc}"]))
        turn.tool_call_count = len(calls)
        db.add(turn)
        db.flush()  # the id, and visibility to the next turn's threading in this batch
        rows = [_call_row(turn.id, call) for call in calls]
        db.add_all(rows)
        self._update_session(db, turn, request, placement.new_session)
        return Ingested(turn, request if isinstance(request, dict) else None, response, rows)

    def _response(self, rec: TurnRecord, api) -> tuple[Any, str | None]:
        """The response as JSON: assembled from the stream, or the body parsed."""
        if rec.stream and rec.response is None and api is not None and rec.raw_size:
            assemble(rec, api, _header(rec.response_headers, "content-encoding"))
        if rec.response is not None:
            return rec.response, None
        if rec.stream or not rec.raw_size:
            return None, None
        ctype = _header(rec.response_headers, "content-type") or ""
        if "json" not in ctype:
            return None, None  # a file, an image, HTML: kept raw only
        if rec.raw_size > JSON_MAX:
            return None, f"response body: {rec.raw_size} bytes, too large to parse (kept raw)"
        try:
            body = decompress(rec.raw_bytes(), _header(rec.response_headers, "content-encoding"))
        except Exception as exc:
            return None, f"response body: cannot decompress ({exc})"
        parsed, problem = content.parse_strict(body)
        if problem:
            return None, f"response body: {problem} (kept raw)"
        return parsed, None

    def _split_request(self, db: DB, turn: Turn, request: dict, api) -> list[str]:
        """Move messages, tools and system prompt into blobs; keep the rest as the skeleton.
        Returns the hashes of the conversation's messages (the system prompt apart: a
        changed system prompt is the same conversation)."""
        keys = api.keys if api else None
        messages = request.get(keys.messages) if keys else None
        if not isinstance(messages, list):
            turn.request_skeleton = request
            return []
        skeleton = dict(request)
        skeleton[keys.messages] = None
        if keys.system:
            system = request.get(keys.system)
        else:  # OpenAI Chat: the system prompt is the leading system/developer messages
            lead = next((i for i, m in enumerate(messages) if not _is_system(m)), len(messages))
            system, messages = (messages[:lead] or None), messages[lead:]
        if system is not None:
            turn.system_hash = self.put_blobs(db, [system])[0]
            if keys.system:
                skeleton[keys.system] = None
        tools = request.get(keys.tools) if keys.tools else None
        if isinstance(tools, list):
            turn.tools_hash = self.put_blobs(db, [tools])[0]
            skeleton[keys.tools] = None
        turn.request_skeleton = skeleton
        turn.message_count = len(messages)
        return self.put_blobs(db, messages)

    def _update_session(self, db: DB, turn: Turn, request: dict | None, new: bool) -> None:
        session = None if new else db.get(Session, turn.session_id)
        if session is None:
            title = OTHER_TITLE if turn.session_id.startswith(OTHER_PREFIX) else first_user_text(request)
            session = Session(id=turn.session_id, started_at=turn.started_at, last_at=turn.started_at,
                              title=title, models=[])
        session.last_at = max(session.last_at, turn.started_at)
        session.turns += 1
        session.tool_calls += turn.tool_call_count
        session.errors += turn.status != "ok"
        usage = turn.usage if isinstance(turn.usage, dict) else {}
        session.input_tokens += _int(usage, "prompt_tokens", "input_tokens", "promptTokenCount")
        session.output_tokens += _int(usage, "completion_tokens", "output_tokens", "candidatesTokenCount")
        if turn.model and turn.model not in session.models:
            session.models = [*session.models, turn.model]
        if not session.title:
            session.title = first_user_text(request)
        db.add(session)


def _call_row(turn_id: int, call: apis.ToolCall) -> ToolCallRow:
    """A tool call as any database holds it: arguments a model wrote with NaN or half a
    surrogate pair count as not parsed (their text stays in arguments_raw)."""
    arguments, error = call.arguments, call.arguments_error
    problem = None if arguments is None else content.unstorable(arguments)
    if problem:
        arguments, error = None, problem
    safe = content.text_safe
    return ToolCallRow(
        turn_id=turn_id, index=call.index, call_id=call.id and safe(call.id), name=safe(call.name),
        arguments_raw=safe(call.arguments_raw), arguments=arguments, arguments_error=error, choice=call.choice,
    )


def _request_note(rec: TurnRecord, problem: str | None) -> str | None:
    """Say why a body sent as JSON is kept as bytes (a body of another type, an upload,
    needs no word)."""
    if problem is None or "json" not in (_header(rec.request_headers, "content-type") or "").lower():
        return None
    return f"request body: {problem} (kept as sent, unparsed)"


_MODEL_IN_PATH = re.compile(r"/models/([^/:?]+)")


def _model_in_path(path: str) -> str | None:
    """Gemini names the model in the URL (`/v1beta/models/gemini-2.5-pro:generateContent`)."""
    m = _MODEL_IN_PATH.search(path)
    return m.group(1) if m else None


def _is_system(message: Any) -> bool:
    return isinstance(message, dict) and message.get("role") in ("system", "developer")


def _int(d: dict, *keys: str) -> int:
    for k in keys:
        v = d.get(k)
        if isinstance(v, int):
            return v
    return 0


def first_user_text(request: dict | None) -> str | None:
    """A session title: the first user text, or what sits inside Cline's <task> tags."""
    if not isinstance(request, dict):
        return None
    for msgs_key in ("messages", "input", "contents"):
        messages = request.get(msgs_key)
        if isinstance(messages, str):
            return messages[:TITLE_MAX]
        if not isinstance(messages, list):
            continue
        for m in messages:
            if isinstance(m, dict) and m.get("role") == "user":
                text = _text_of(m.get("content", m.get("parts")))
                if text:
                    start, end = text.find("<task>"), text.find("</task>")
                    if start >= 0 and end > start:
                        text = text[start + 6:end]
                    return " ".join(text.split())[:TITLE_MAX]
    return None


def _text_of(content_: Any) -> str:
    if isinstance(content_, str):
        return content_
    if isinstance(content_, list):
        for part in content_:
            if isinstance(part, dict) and isinstance(part.get("text"), str) and part["text"].strip():
                return part["text"]
    return ""
