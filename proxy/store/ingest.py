"""Turn captured exchanges (`TurnRecord`s) into rows, a batch at a time. Runs in the writer.

`add()` does, per turn, the work that needs no database: parse the request, split it
into blobs and a message chain, reassemble the response, read its tool calls. `write()`
then stores a whole batch in a fixed number of statements, whatever its size: the new
blobs and chain nodes (upserts that ignore what exists), the placement lookups
(sessions.Placer), the turns (their ids returned), their tool calls, and one upsert per
session that adds the batch's counts to it. Blob and chain hashes this process wrote
are remembered, so an agent's resent history costs neither a statement nor a row.

Several writers may share one database: every shared row has a unique key and is
written by an upsert, and on Postgres the writers serialise per conversation (an
advisory lock on its first message's hash, taken before placing). Locks are taken
table by table in key order, so two writers never wait on each other in a cycle.
SQLite serialises writers by itself (the writer begins with BEGIN IMMEDIATE).
"""

from __future__ import annotations

import hashlib
import uuid
from dataclasses import dataclass, field
from types import SimpleNamespace
from typing import Any

from pydantic_core import PydanticUndefined
from sqlalchemy import bindparam, case, func, select, text, update
from sqlalchemy.dialects import postgresql, sqlite
from sqlmodel import Session as DB

from .. import apis
from ..capture import TurnRecord, assemble, codings, decompress, header_values, model_of
from . import content, search
from .db import PRUNE_LOCK
from .models import Blob, ChainNode, Session, ToolCallRow, Turn
from .one_statement import OneStatement
from .readable import reply_text, upstream_note
from .requests import Parsed, Prefix, Requests
from .sessions import OTHER_PREFIX, OTHER_TITLE, Ask, Placer, adoptable, chain_root, lock_key, session_key

TITLE_MAX = 200
KNOWN_MAX = 500_000  # blob and chain hashes remembered as written (~40 MB at most)
JSON_MAX = 32 << 20  # a bigger body is stored raw, not parsed: it would cost its size many times over

_TURNS, _CALLS, _SESSIONS = Turn.__table__, ToolCallRow.__table__, Session.__table__


def _defaults(model, table) -> dict[str, Any]:
    """Every column but the id, at the model's default: executemany wants rows alike."""
    out = {}
    for column in table.columns:
        if column.primary_key and column.name == "id":
            continue
        f = model.model_fields.get(column.name)
        default = None if f is None or f.default is PydanticUndefined else f.default
        out[column.name] = default
    return out


_TURN_DEFAULTS = _defaults(Turn, _TURNS)
_CALL_DEFAULTS = _defaults(ToolCallRow, _CALLS)


def _header(headers: list[list[str]], name: str) -> str | None:
    return next((v for k, v in headers if k.lower() == name), None)


class NewTurn(SimpleNamespace):
    """A `turns` row being built, one attribute per column (`id` once written)."""


@dataclass
class Ingested:
    """A turn on its way into the database, with what the decoders need: nothing is
    read back."""

    turn: NewTurn
    request: dict | None
    response: Any
    calls: list[dict]  # tool_calls rows (turn_id set once the turn is written)
    chain: list[str] = field(default_factory=list)
    hashes: list[str] = field(default_factory=list)  # the chain's message hashes
    hint: str | None = None  # the session the client named (X-Tooltap-Session)
    title: str | None = None
    continues: str | None = None  # the id it names to continue a conversation (apis.base.continues)
    new_session: bool = False
    adopted: list[int] = field(default_factory=list)  # stored turns it became the parent of
    prefix: Prefix | None = None  # this request, as later requests may reuse it (requests.py)
    base: Prefix | None = None  # the earlier request whose first `reused` messages it shares
    reused: int = 0


class Ingestor:
    """Writes turns; remembers which blobs and chain nodes exist to skip re-inserting them."""

    def __init__(self, dialect: str):
        self.dialect = dialect
        self._insert = postgresql.insert if dialect == "postgresql" else sqlite.insert
        self._known: set[str] = set()  # blob and chain hashes written by this process
        self._generation = 0  # counts the times _known was emptied (see _split_request)
        self._epoch: int | None = None  # store_epoch when _known was last checked
        self._blobs: dict[str, bytes] = {}  # new blobs of the batch being built
        self._messages: dict[str, Any] = {}  # the messages among them, for the search index
        self._requests = Requests()  # recent requests: a resent history is not parsed again
        # Built once: building a statement costs more than running it.
        self._blob_stmt = self._insert(Blob.__table__).on_conflict_do_nothing(index_elements=["hash"])
        self._node_stmt = self._insert(ChainNode.__table__).on_conflict_do_nothing(index_elements=["hash"])
        # Turns go in by executemany, their ids read back by uid. (INSERT ... RETURNING of
        # many rows is one long statement whose text changes with the batch size: psycopg
        # parsed it anew every batch, 12 ms for 64 turns.)
        self._turn_stmt = self._insert(_TURNS)
        self._turn_ids = (text("SELECT id, uid FROM turns WHERE uid = ANY(:uids)") if dialect == "postgresql" else
                          select(_TURNS.c.id, _TURNS.c.uid).where(_TURNS.c.uid.in_(bindparam("uids", expanding=True))))
        self._call_stmt = self._insert(_CALLS)
        self._calls_at_once = OneStatement(_CALLS, list(_CALL_DEFAULTS))  # SQLite: for the search index
        self._parent_stmt = (update(_TURNS).where(_TURNS.c.id == bindparam("turn"))
                             .values(parent_id=bindparam("parent")))
        ins = self._insert(_SESSIONS)
        t, new = _SESSIONS.c, ins.excluded
        self._session_stmt = ins.on_conflict_do_update(index_elements=["id"], set_={
            "turns": t.turns + new.turns, "tool_calls": t.tool_calls + new.tool_calls,
            "input_tokens": t.input_tokens + new.input_tokens, "output_tokens": t.output_tokens + new.output_tokens,
            "errors": t.errors + new.errors,
            "started_at": case((new.started_at < t.started_at, new.started_at), else_=t.started_at),
            "last_at": case((new.last_at > t.last_at, new.last_at), else_=t.last_at),
            "title": func.coalesce(func.nullif(t.title, ""), new.title),
        })
        self._models_of = select(_SESSIONS.c.id, _SESSIONS.c.models).where(
            _SESSIONS.c.id.in_(bindparam("ids", expanding=True)))
        self._models_stmt = (update(_SESSIONS).where(_SESSIONS.c.id == bindparam("sid"))
                             .values(models=bindparam("models")))

    def check_epoch(self, conn) -> bool:
        """Call first in each batch's transaction. A prune (retention.py) may have deleted
        blobs or chain nodes this process remembers as stored: it raises store_epoch in
        the transaction that deletes them, and this transaction cannot overlap it (SQLite:
        both BEGIN IMMEDIATE; Postgres: PRUNE_LOCK, shared here, alone in the prune). A
        moved epoch means: trust nothing remembered, upsert every blob and node again.
        Returns True when that dropped hashes which `add()` may have trusted already."""
        if self.dialect == "postgresql":
            conn.execute(text("SELECT pg_advisory_xact_lock_shared(:k)"), {"k": PRUNE_LOCK})
        epoch = conn.execute(text("SELECT epoch FROM store_epoch WHERE id = 1")).scalar()
        if epoch == self._epoch:
            return False
        trusted = bool(self._known)
        self._forget_known()
        self._epoch = epoch
        return trusted

    def discard_batch(self) -> None:
        """Forget the blobs `add()` gathered for a batch that is prepared again."""
        self._blobs, self._messages = {}, {}
        self._generation += 1

    def _forget_known(self) -> None:
        self._known.clear()
        self._generation += 1

    # -- per turn, no database ---------------------------------------------------------

    def add(self, rec: TurnRecord) -> Ingested:
        api = apis.by_name(rec.api)
        body = rec.body()
        uid = getattr(rec, "uid", None) or uuid.uuid4().hex
        key = api.keys.messages if api and api.keys else None
        coding = header_values(rec.request_headers, "content-encoding")
        undecoded = False
        if codings(coding) and len(body):
            # Parsed decoded, kept as sent. What the journal says this body shares with
            # another is about its compressed bytes: neither taken nor given (no uid for
            # a later body to name).
            try:
                decoded = decompress(bytes(body), coding, JSON_MAX)
            except Exception as exc:
                parsed, undecoded = Parsed(None, f"cannot decompress (content-encoding {coding!r}: {exc})"), True
            else:
                parsed = self._requests.parse(decoded, key)
                if parsed.problem:
                    parsed.problem += f" once decompressed (content-encoding {coding!r})"
        else:
            parsed = self._requests.parse(body, key, uid, getattr(rec, "extends", None))
        request, request_problem = parsed.value, parsed.problem
        response, response_note = self._response(rec, api)
        sha = None if rec.raw_sha256 else hashlib.sha256()  # the hot path leaves it to the writer
        raw = rec.iter_raw() if sha is None else _hashed(rec.iter_raw(), sha)
        turn = NewTurn(**_TURN_DEFAULTS)
        turn.id = None
        turn.__dict__.update(
            api=rec.api, method=rec.method, path=rec.path, upstream=rec.upstream, route=rec.route,
            http_status=rec.http_status, status=rec.status, stream=rec.stream,
            started_at=rec.started_at, ttft_ms=rec.ttft_ms, duration_ms=rec.duration_ms,
            request_size=len(body), request_headers=rec.request_headers,
            response_headers=rec.response_headers,
            raw=content.compress_chunks(raw, 6 if rec.raw_size < (8 << 20) else 1),
            raw_size=rec.raw_size, raw_sha256=rec.raw_sha256 or sha.hexdigest(),
            content_type=_header(rec.response_headers, "content-type"),
            content_encoding=header_values(rec.response_headers, "content-encoding"),
            timeline=content.pack(rec.timeline) if rec.timeline else None,
            error="; ".join(e for e in (rec.error, _request_note(rec, request_problem, undecoded), response_note,
                                        _upstream_note(rec, response)) if e) or None,
            stream_error=rec.stream_error,
            # The journal's id: a turn read again is never stored twice. A turn from
            # elsewhere gets one too: the batch insert matches rows to turns by it.
            uid=uid,
        )
        if response is not None:
            turn.response = content.pack(response)
            turn.response_text = reply_text(rec.api, response)
        if not isinstance(request, dict):
            turn.request_raw = content.compress_chunks([bytes(body)]) if len(body) else None
            request = None

        hashes: list[str] = []
        continues = api.continues(request) if api is not None and request is not None else None
        if request is not None:
            turn.model = model_of(api, request, response, rec.path)
            hashes = self._split_request(turn, request, api, parsed, continues)
        if api is not None:
            turn.continue_id = api.continue_id(request, response)
        root = chain_root(rec.api, rec.upstream, continues)
        base, prefix, known = parsed.base, parsed.prefix, ()
        if base is not None and prefix is not None and base.root == root and base.lead == prefix.lead:
            known = base.chain[:max(0, parsed.reused - prefix.lead)]
        chain = content.chain(hashes, root, known)
        if prefix is not None:
            prefix.chain, prefix.root = chain, root
        turn.chain_hash = chain[-1] if chain else None

        calls: list[apis.ToolCall] = []
        if api is not None and isinstance(response, dict):
            turn.usage = api.usage(response)
            try:
                calls = api.tool_calls(response)
            except Exception as exc:  # a response we cannot read still stores
                turn.error = "; ".join(filter(None, [turn.error, f"tool calls: {exc}"]))
        turn.tool_call_count = len(calls)
        hint = session_key(rec.session_hint)
        title = first_user_text(request)
        item = Ingested(turn, request, response, [_call_row(call) for call in calls], chain, hashes, hint, title,
                        continues)
        if parsed.prefix is not None and request is not None:
            item.prefix, item.base, item.reused = parsed.prefix, parsed.base, parsed.reused
            self._requests.keep(parsed)
        return item

    def _response(self, rec: TurnRecord, api) -> tuple[Any, str | None]:
        """The response as JSON: assembled from the stream, or the body parsed."""
        if rec.stream and rec.response is None and api is not None and rec.raw_size:
            assemble(rec, api, header_values(rec.response_headers, "content-encoding"))
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
            body = decompress(rec.raw_bytes(), header_values(rec.response_headers, "content-encoding"), JSON_MAX)
        except Exception as exc:
            return None, f"response body: cannot decompress ({exc})"
        parsed, problem = content.parse_strict(body)
        if problem:
            return None, f"response body: {problem} (kept raw)"
        return parsed, None

    def _split_request(self, turn: NewTurn, request: dict, api, parsed: Parsed, continues: str | None) -> list[str]:
        """Move messages, tools and system prompt into blobs; keep the rest as the skeleton.
        Returns the hashes of the conversation's messages (the system prompt apart: a
        changed system prompt is the same conversation). Messages taken from an earlier
        request (requests.py) keep the hashes worked out for it."""
        keys = api.keys if api else None
        messages = request.get(keys.messages) if keys else None
        short = api.short_input(messages) if keys else None  # threaded as the list it stands for
        if short is not None:
            messages = short
        if not isinstance(messages, list):
            turn.request_skeleton = request
            return []
        base, reused = parsed.base, parsed.reused
        skeleton = dict(request)
        if short is None and not continues:
            # Rebuilt from the chain. Kept in the skeleton as sent: a short form, and the
            # new messages of a request that continues a conversation the server keeps
            # (its chain reads on up through the parent's).
            skeleton[keys.messages] = None
        lead = 0
        if keys.system:
            system = request.get(keys.system)
        else:  # OpenAI Chat: the system prompt is the leading system/developer messages
            lead = next((i for i, m in enumerate(messages) if not _is_system(m)), len(messages))
            system = messages[:lead] or None
        if system is not None:
            if keys.system:
                turn.system_hash = self._blob(system, _hash_kept(parsed, keys.system, system))
                skeleton[keys.system] = None
            else:
                known = base.system_hash if base is not None and base.lead == lead <= reused else None
                turn.system_hash = self._blob(system, known)
        tools = request.get(keys.tools) if keys.tools else None
        if isinstance(tools, list):
            turn.tools_hash = self._blob(tools, _hash_kept(parsed, keys.tools, tools))
            skeleton[keys.tools] = None
        turn.request_skeleton = skeleton
        turn.message_count = len(messages) - lead
        earlier = base.hashes if base is not None else ()
        if base is not None and base.lead == lead < reused and base.known_in == self._generation:
            # The shared messages' blobs are stored or in this batch since the earlier
            # request: only the new ones are looked at (a long session costs no more).
            first = reused
            hashes = earlier[lead:reused] + [self._blob(m) for m in messages[reused:]]
        else:
            first = lead
            hashes = [self._blob(m, earlier[i] if i < reused else None) for i, m in enumerate(messages) if i >= lead]
        for h, m in zip(hashes[first - lead:], messages[first:]):
            if h in self._blobs:  # new to this writer: index it with the batch
                self._messages[h] = m
        if parsed.prefix is not None:
            parsed.prefix.hashes = [None] * lead + hashes
            parsed.prefix.lead, parsed.prefix.system_hash = lead, turn.system_hash if lead else None
            parsed.prefix.known_in = self._generation
        return hashes

    def _blob(self, value: Any, known_hash: str | None = None) -> str:
        """The hash of `value` (given, when an earlier request worked it out); the value
        waits for `write()` unless known to be stored."""
        h = known_hash or content.content_hash(value)
        if h not in self._known and h not in self._blobs:
            self._blobs[h] = content.pack(value)
        return h

    # -- the batch, in one transaction ---------------------------------------------------

    def write(self, db: DB, items: list[Ingested]) -> None:
        """Store the turns `add()` prepared, in their order; sets each turn's id, session
        and parent."""
        conn = db.connection()
        if self.dialect == "postgresql":
            keys = sorted({lock_key(it.chain) for it in items if it.chain})
            if keys:  # writers holding turns of the same conversations wait for each other
                conn.execute(text("SELECT pg_advisory_xact_lock(k) FROM unnest(CAST(:keys AS bigint[])) AS k"),
                             {"keys": keys})
        blobs, self._blobs = self._blobs, {}
        if blobs:
            conn.execute(self._blob_stmt, [{"hash": h, "data": blobs[h]} for h in sorted(blobs)])
            self._remember(blobs)
        messages, self._messages = self._messages, {}
        search.index_messages(conn, self.dialect, messages)

        placer = Placer(conn, self.dialect)
        asks = [Ask(it.chain, it.hint, it.hashes, it.continues, it.turn.continue_id, it.turn.started_at)
                for it in items]
        placements = placer.place_all(asks)
        nodes: dict[str, dict] = {}
        for it, placement in zip(items, placements):
            it.turn.session_id, it.turn.parent_id = placement.session_id, placement.parent_id
            if placement.chain is not None:  # going on from the conversation it continues
                it.chain, it.turn.chain_hash = placement.chain, placement.chain[-1]
                it.turn.message_count += placement.offset
            it.new_session = placement.new_session
            if it.new_session and it.continues and not it.title:  # results alone, say, to an answer never seen
                it.title = f"(continues {it.continues[:80]}, not recorded)"
            for i in range(placement.known_depth, len(it.chain)):  # the nodes above are stored
                h = it.chain[i]
                if h not in self._known and h not in placer.nodes and h not in nodes:
                    nodes[h] = {"hash": h, "parent": it.chain[i - 1] if i else placement.base,
                                "message_hash": it.hashes[i], "depth": placement.offset + i + 1,
                                "session_id": placement.session_id}
        if nodes:
            conn.execute(self._node_stmt, [nodes[h] for h in sorted(nodes)])
            self._remember(nodes)

        conn.execute(self._turn_stmt, [_turn_row(it.turn) for it in items])
        uids = [it.turn.uid for it in items]
        ids = {uid: turn_id for turn_id, uid in conn.execute(self._turn_ids, {"uids": uids})}
        for it in items:
            it.turn.id = ids[it.turn.uid]
        later = []  # parents stored in this same batch
        for it, placement in zip(items, placements):
            if placement.parent_index is not None:
                it.turn.parent_id = items[placement.parent_index].turn.id
                later.append({"turn": it.turn.id, "parent": it.turn.parent_id})
        if later:
            conn.execute(self._parent_stmt, later)
        adopted = []
        for it, placement in zip(items, placements):
            if placement.adopt:
                it.adopted = adoptable(conn, it.chain[-1], placement.session_id, placement.offset + len(it.chain))
                adopted += [{"turn": child, "parent": it.turn.id} for child in it.adopted]
        if adopted:
            conn.execute(self._parent_stmt, adopted)

        for it in items:
            for row in it.calls:
                row["turn_id"] = it.turn.id
        calls = [row for it in items for row in it.calls]
        if calls and not self._calls_at_once.run(conn, calls):
            conn.execute(self._call_stmt, calls)
        self._update_sessions(conn, items)

    def _remember(self, hashes) -> None:
        if len(self._known) > KNOWN_MAX:  # a cache, not a record: start over
            self._forget_known()
        self._known.update(hashes)

    def _update_sessions(self, conn, items: list[Ingested]) -> None:
        """Add the batch's turns to their sessions' counts: one upsert per session."""
        rows: dict[str, dict] = {}
        for it in items:
            t = it.turn
            row = rows.get(t.session_id)
            if row is None:
                row = rows[t.session_id] = {
                    "id": t.session_id, "title": None, "agent": None, "started_at": t.started_at,
                    "last_at": t.started_at, "turns": 0, "tool_calls": 0, "input_tokens": 0,
                    "output_tokens": 0, "errors": 0, "models": [], "uids": None}
            row["started_at"] = min(row["started_at"], t.started_at)
            row["last_at"] = max(row["last_at"], t.started_at)
            row["turns"] += 1
            row["tool_calls"] += t.tool_call_count
            row["errors"] += t.status != "ok"
            tokens_in, tokens_out = usage_tokens(t.usage)
            row["input_tokens"] += tokens_in
            row["output_tokens"] += tokens_out
            if t.model and t.model not in row["models"]:
                row["models"].append(t.model)
            if not row["title"]:
                row["title"] = OTHER_TITLE if t.session_id.startswith(OTHER_PREFIX) else it.title
        ordered = [rows[k] for k in sorted(rows)]  # rows locked in key order: no deadlock between writers
        conn.execute(self._session_stmt, ordered)
        wanted = {k: r["models"] for k, r in rows.items() if r["models"]}
        if not wanted:
            return
        stored = conn.execute(self._models_of, {"ids": sorted(wanted)})
        changes = []
        for sid, models in stored:
            models = models or []
            merged = models + [m for m in wanted[sid] if m not in models]
            if merged != models:
                changes.append({"sid": sid, "models": merged})
        if changes:
            conn.execute(self._models_stmt, changes)


def _hash_kept(parsed: Parsed, key: str, value: Any) -> str | None:
    """The hash of a large request value the request parser took, as the very same
    object, from the request this one extends (requests.py); None: work it out. Either
    way it is remembered for the next request."""
    base, prefix = parsed.base, parsed.prefix
    kept = base.values.get(key) if base is not None else None
    known = base.hashes_of.get(key) if kept is not None and kept[1] is value else None
    if prefix is not None and key in prefix.values:
        prefix.hashes_of[key] = known or content.content_hash(value)
        return prefix.hashes_of[key]
    return known


def _hashed(chunks, sha):
    """The chunks, each added to `sha` on the way (the raw bytes are read once)."""
    for chunk in chunks:
        sha.update(chunk)
        yield chunk


def _turn_row(turn: NewTurn) -> dict:
    row = dict(turn.__dict__)
    del row["id"]
    return row


def _call_row(call: apis.ToolCall) -> dict:
    """A tool call as any database holds it: arguments a model wrote with NaN or half a
    surrogate pair count as not parsed (their text stays in arguments_raw)."""
    arguments, error = call.arguments, call.arguments_error
    problem = None if arguments is None else content.unstorable(arguments)
    if problem:
        arguments, error = None, problem
    safe = content.text_safe
    return {**_CALL_DEFAULTS, "index": call.index, "call_id": call.id and safe(call.id), "name": safe(call.name),
            "arguments_raw": safe(call.arguments_raw), "arguments": arguments, "arguments_error": error,
            "choice": call.choice}


def _upstream_note(rec: TurnRecord, response: Any) -> str | None:
    if rec.status != "upstream_error":
        return None
    note = upstream_note(rec.http_status, response, rec.stream_error)
    return None if note and rec.error and note in rec.error else note  # (a HAR import brings it along)


def _request_note(rec: TurnRecord, problem: str | None, undecoded: bool = False) -> str | None:
    """Say why a body sent as JSON, or one that could not be decompressed, is kept as
    bytes (a body of another type, an upload, needs no word)."""
    if problem is None:
        return None
    if not undecoded and "json" not in (_header(rec.request_headers, "content-type") or "").lower():
        return None
    return f"request body: {problem} (kept as sent, unparsed)"


def _is_system(message: Any) -> bool:
    return isinstance(message, dict) and message.get("role") in ("system", "developer")


def usage_tokens(usage: Any) -> tuple[int, int]:
    """(input, output) tokens of a turn's usage, whichever API wrote it."""
    usage = usage if isinstance(usage, dict) else {}
    return (_int(usage, "prompt_tokens", "input_tokens", "promptTokenCount"),
            _int(usage, "completion_tokens", "output_tokens", "candidatesTokenCount"))


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
