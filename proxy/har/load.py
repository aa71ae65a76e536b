"""HAR files in: each entry becomes the `TurnRecord` the proxy would have captured, and
goes through the store's own ingest (assembly of streams, tool calls, threading into
sessions, the agent decoders), so an imported session reads like a recorded one.

Reads what browsers, mitmproxy (`.har`, and its zlib-compressed `.zhar`) and tooltap
write. Secrets are fingerprinted on the way in, as the proxy does: a HAR from elsewhere
holds keys in clear. Each entry gets a uid from its content, so a file imported twice
stores nothing twice.
"""

from __future__ import annotations

import base64
import hashlib
import json
import os
import re
import tempfile
import zlib
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any, Iterable, Iterator
from urllib.parse import unquote, urlsplit

from .. import apis
from ..capture import TurnRecord
from ..secrets import redact_headers, redact_query, redact_url
from . import TOOLTAP_FIELD, HarError

_DROPPED_REQUEST_HEADERS = {"host", "x-tooltap-session"}
# A fingerprint (secrets.py) stays as it is: redacting twice must change nothing.
_FINGERPRINT = re.compile(r"(?:(?:Bearer|Basic|Token|Bot)\s+)?…[^#\s]{0,4}#[0-9a-f]{8}", re.IGNORECASE)


@dataclass
class Imported:
    turns: int = 0
    already: int = 0  # entries stored by an earlier import
    skipped: int = 0  # entries that are no model call (unless all requests were asked for)
    sessions: set[str] = field(default_factory=set)


def read_har(path: str | Path) -> dict:
    try:
        data = Path(path).read_bytes()
    except OSError as exc:
        raise HarError(f"cannot read {path}: {exc.strerror or exc}") from None
    if data[:1] == b"\x78":  # mitmproxy's .zhar: the JSON, zlib-compressed
        try:
            data = zlib.decompress(data)
        except zlib.error:
            pass
    try:
        har = json.loads(data.decode("utf-8-sig"))
    except (UnicodeDecodeError, ValueError) as exc:
        raise HarError(f"{path} is not a HAR file: not JSON ({exc})") from None
    entries = har.get("log", {}).get("entries") if isinstance(har, dict) and isinstance(har.get("log"), dict) else None
    if not isinstance(entries, list):
        raise HarError(f"{path} is not a HAR file: no log.entries list")
    return har


def records(har: dict, all_requests: bool = False) -> Iterator[TurnRecord | None]:
    """A TurnRecord per entry, oldest first; None for an entry that is no model call
    (a page, an image, a model list), unless `all_requests`."""
    entries = list(enumerate(e for e in har["log"]["entries"] if isinstance(e, dict)))
    entries.sort(key=lambda item: _sort_key(item[1]))  # stable: entries of one instant keep their order
    for i, e in entries:
        try:
            record = entry_record(e)
        except (KeyError, TypeError, ValueError, AttributeError) as exc:
            what = f"no {exc}" if isinstance(exc, KeyError) else str(exc)
            raise HarError(f"entry {i + 1} of the HAR cannot be read: {what}") from None
        yield record if all_requests or record.api != "other" else None


def _route(ours: dict) -> str | None:
    """Another tool's HAR names the upstream's own path (no route); an older tooltap's
    kept the agent's path without saying which part chose the upstream (not known)."""
    route = ours.get("route")
    return route if isinstance(route, str) else (None if ours else "")


def entry_record(e: dict) -> TurnRecord:
    ours = e.get(TOOLTAP_FIELD) if isinstance(e.get(TOOLTAP_FIELD), dict) else {}
    req, resp = e["request"], e.get("response") or {}
    method = str(req["method"]).upper()
    parts = urlsplit(req["url"])
    upstream = redact_url(ours.get("upstream") or f"{parts.scheme}://{parts.hostname or ''}" + (
        f":{parts.port}" if parts.port else ""))
    path = ours.get("path") or ((parts.path or "/") + (f"?{parts.query}" if parts.query else ""))
    base, sep, query = path.partition("?")
    path = base + sep + _redact_query(query)
    api = ours.get("api") or _api(method, parts.path or "/")

    request_headers = _pairs(req.get("headers"))
    hint = ours.get("session_id") or next((v for k, v in request_headers if k.lower() == "x-tooltap-session"), None)
    body = _post_body(req.get("postData"))
    raw = _response_body(resp.get("content") or {})
    response_headers = _pairs(resp.get("headers"))
    if any(k.lower() == "content-encoding" and v.strip().lower() not in ("", "identity") for k, v in response_headers):
        # HAR keeps the body decoded: the stored bytes are not encoded, and their length changed.
        response_headers = [(k, v) for k, v in response_headers if k.lower() not in ("content-encoding", "content-length")]
    status_code = resp.get("status") if isinstance(resp.get("status"), int) and resp.get("status") > 0 else None
    content_type = next((v for k, v in response_headers if k.lower() == "content-type"), "") or (
        (resp.get("content") or {}).get("mimeType") or "")
    ttft, duration = _timings(e, ours)

    record = TurnRecord(
        started_at=ours.get("started_at") or _started_at(e),
        method=method, path=path, upstream=upstream,
        route=_route(ours),
        request_headers=_redact([(k, v) for k, v in request_headers
                                 if k.lower() not in _DROPPED_REQUEST_HEADERS and not k.startswith(":")]),
        request_body=body, session_hint=hint, api=api, http_status=status_code,
        response_headers=_redact([(k, v) for k, v in response_headers if not k.startswith(":")]),
        status=ours.get("status") or _status(status_code), error=ours.get("error") or resp.get("_error") or None,
        stream=content_type.lower().startswith("text/event-stream"),
        ttft_ms=ttft, duration_ms=duration,
        raw=raw, raw_size=len(raw), raw_sha256=hashlib.sha256(raw).hexdigest(),
        timeline=ours.get("timeline") or ([[0, round(ttft or 0.0, 3)]] if raw else []),
    )
    if record.error is None and status_code is None:
        record.error = "the HAR entry has no response"
    # The store skips a turn whose uid it holds: tooltap's own export carries the turn's.
    uid = ours.get("uid")
    record.uid = uid if isinstance(uid, str) and 0 < len(uid) <= 32 else _uid(e, body, raw)
    return record


def store(db_url: str, recs: Iterable[TurnRecord | None]) -> Imported:
    """Store the records through the store's own writer (store/writer.py), as the proxy's
    turns are: batched, decoded, threaded, each uid stored once."""
    from ..store.db import open_database
    from ..store.writer import Writer

    open_database(db_url).dispose()  # a database tooltap cannot use fails here, in one line
    done = Imported()
    submitted = 0
    with tempfile.TemporaryDirectory(prefix="tooltap-import-") as folder:
        writer = Writer(db_url, os.path.join(folder, "spool.jsonl"))
        writer.on_stored = lambda events: done.sessions.update(e["session_id"] for e in events)
        writer.start(migrate_first=False)
        seen: set[str] = set()
        try:
            for rec in recs:
                if rec is None:
                    done.skipped += 1
                elif rec.uid in seen:  # the same exchange twice in one file
                    done.already += 1
                else:
                    seen.add(rec.uid)
                    writer.submit(rec)
                    submitted += 1
        finally:
            writer.close()
    done.turns, done.already = writer.written, done.already + writer.duplicates
    missing = submitted - writer.written - writer.duplicates
    if missing:
        raise HarError(f"{missing} of {submitted} turn(s) were not stored (the database stopped answering "
                       "or refused them; see the log). Import the file again: what is stored is skipped")
    return done


def import_har(path: str | Path, db_url: str, all_requests: bool = False) -> Imported:
    # Every entry read before any is stored: a file with a bad entry stores nothing (the
    # whole file is in memory already).
    return store(db_url, list(records(read_har(path), all_requests)))


# -- the fields of an entry -----------------------------------------------------------------

def _redact(headers: list[tuple[str, str]]) -> list[list[str]]:
    return [[k, v] if _FINGERPRINT.fullmatch(v) else redact_headers([(k, v)])[0] for k, v in headers]


def _redact_query(query: str) -> str:
    parts = re.split(r"([&;])", query)  # odd indexes are the separators
    for i in range(0, len(parts), 2):
        value = unquote(parts[i].partition("=")[2])
        if not _FINGERPRINT.fullmatch(value):
            parts[i] = redact_query(parts[i])
    return "".join(parts)


def _api(method: str, path: str) -> str:
    api = apis.detect(method, path)
    return api.name if api else "other"


def _pairs(headers: Any) -> list[tuple[str, str]]:
    """Headers as [{"name", "value"}] (the format) or [name, value] (some tools)."""
    out = []
    for h in headers or []:
        if isinstance(h, dict) and "name" in h:
            out.append((str(h["name"]), str(h.get("value", ""))))
        elif isinstance(h, (list, tuple)) and len(h) == 2:
            out.append((str(h[0]), str(h[1])))
    return out


def _post_body(post: Any) -> bytes:
    if not isinstance(post, dict):
        return b""
    text = post.get("text")
    if isinstance(text, str):
        if post.get("_encoding") == "base64" or post.get("encoding") == "base64":
            return base64.b64decode(text)
        return text.encode("utf-8", "surrogateescape")
    params = post.get("params")
    if isinstance(params, list) and params:  # a form, given as its fields only
        from urllib.parse import urlencode

        return urlencode([(p.get("name", ""), p.get("value", "")) for p in params if isinstance(p, dict)]).encode()
    return b""


def _response_body(content: dict) -> bytes:
    text = content.get("text")
    if not isinstance(text, str):
        return b""
    if content.get("encoding") == "base64":
        return base64.b64decode(text)
    return text.encode("utf-8", "surrogateescape")


def _sort_key(e: dict) -> float:
    try:
        return _started_at(e)
    except (TypeError, ValueError):
        return float("inf")  # reported when its turn comes


def _started_at(e: dict) -> float:
    value = e.get("startedDateTime")
    if not isinstance(value, str):
        raise ValueError("startedDateTime is missing")
    return datetime.fromisoformat(value.replace("Z", "+00:00")).timestamp()


def _timings(e: dict, ours: dict) -> tuple[float | None, float | None]:
    """(time to first byte, duration) in ms: tooltap's own when it wrote the file, else
    from the timings: everything before the response began, then the whole `time`."""
    if "duration_ms" in ours:
        return ours.get("ttft_ms"), ours.get("duration_ms")
    t = e.get("timings") if isinstance(e.get("timings"), dict) else {}

    def ms(name: str) -> float:
        value = t.get(name)
        return float(value) if isinstance(value, (int, float)) and value > 0 else 0.0

    ttft = sum(ms(k) for k in ("blocked", "dns", "connect", "ssl", "send", "wait"))
    if isinstance(t.get("ssl"), (int, float)) and t["ssl"] > 0 and ms("connect") >= ms("ssl"):
        ttft -= ms("ssl")  # HAR counts ssl inside connect as well
    total = e.get("time")
    duration = float(total) if isinstance(total, (int, float)) and total >= 0 else ttft + ms("receive")
    return ttft, max(duration, ttft)


def _status(code: int | None) -> str:
    if code is None:
        return "proxy_error"
    return "ok" if code < 400 else "upstream_error"


def _uid(e: dict, body: bytes, raw: bytes) -> str:
    h = hashlib.sha256()
    for part in (str(e.get("startedDateTime")), str(e["request"].get("method")), str(e["request"].get("url"))):
        h.update(part.encode("utf-8", "surrogateescape") + b"\0")
    h.update(hashlib.sha256(body).digest() + hashlib.sha256(raw).digest())
    return "har-" + h.hexdigest()[:28]
