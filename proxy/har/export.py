"""A stored session as a HAR 1.2 log: one entry per turn, in the order they arrived.

Requests carry their headers and body as stored (secrets are fingerprints there already),
responses the exact body text the agent got, and timings from the capture: `wait` is
the time to the first byte, `receive` the rest of the stream.
"""

from __future__ import annotations

import base64
import json
from http import HTTPStatus
from typing import Any
from urllib.parse import parse_qsl, quote, urlsplit

from ..capture import decompress
from ..store.read import Reader
from . import TOOLTAP_FIELD, HarError


def session_har(reader: Reader, session_id: str) -> dict:
    reader = Reader(reader.engine, cache_blobs=True)  # every request repeats the messages before it
    try:
        session_id = reader.full_session_id(session_id)
    except LookupError as exc:
        raise HarError(str(exc)) from None
    session = reader.session(session_id)
    if session is None:  # pruned meanwhile
        raise HarError(f"no session {session_id!r} in this database")
    from sqlmodel import Session as DB, select

    from ..store.models import Turn

    # What the read API leaves out: the exact start (it shows milliseconds) and the turn's uid.
    with DB(reader.engine) as db:
        stored = {i: (start, uid) for i, start, uid in db.exec(
            select(Turn.id, Turn.started_at, Turn.uid).where(Turn.session_id == session_id)).all()}
    return har_log([entry(reader, t["id"], *stored.get(t["id"], (None, None))) for t in session["turns"]])


def har_secrets(har: dict) -> list:
    """Key-like values left in clear in the log (a key pasted into a prompt, say; the
    store fingerprints only those in headers and the query), found by the search
    `tooltap export --pytest` refuses them with. Each says where: `turn N` (its place in
    the session) and the field, with a JSON path into a JSON body."""
    from ..replay.cassette import find_in

    out = []
    for n, e in enumerate(har["log"]["entries"], 1):
        request, response = e.get("request") or {}, e.get("response") or {}
        turn = f"turn {n}"
        out += find_in(request.get("url", ""), f"{turn} request URL")
        for side, message in (("request", request), ("response", response)):
            for h in message.get("headers") or []:
                out += find_in(h.get("value", ""), f"{turn} {side} header {h.get('name')}")
        post = request.get("postData") or {}
        out += _body_secrets(post.get("text"), post.get("_encoding"), f"{turn} request body")
        content = response.get("content") or {}
        out += _body_secrets(content.get("text"), content.get("encoding"), f"{turn} response body")
        out += find_in(e.get(TOOLTAP_FIELD) or {}, f"{turn} {TOOLTAP_FIELD}")
    return out


def _body_secrets(text: str | None, encoding: str | None, where: str) -> list:
    """A JSON body is searched parsed, so a finding gets its path ($.messages[0].content)."""
    from ..replay.cassette import find_in

    if not text:
        return []
    try:
        if encoding == "base64":
            text = base64.b64decode(text).decode("utf-8", "replace")
        return find_in(json.loads(text), f"{where} $")
    except ValueError:
        return find_in(text, where)


def har_log(entries: list[dict]) -> dict:
    return {"log": {"version": "1.2", "creator": {"name": "tooltap", "version": _version()},
                    "pages": [], "entries": entries}}


def entry(reader: Reader, turn_id: int, started_at: float | None = None, uid: str | None = None) -> dict:
    turn = reader.turn(turn_id)
    raw, content_type, encoding = reader.raw(turn_id) or (b"", None, None)
    timeline = reader.timeline(turn_id) or []
    ttft = turn["ttft_ms"] or 0.0
    duration = max(turn["duration_ms"] or ttft, ttft)
    path, sep, query = _upstream_path(turn).partition("?")
    # A fingerprinted secret (`key=…abcd#1f2e3d4c`) is quoted: its `#` would start a fragment.
    url = turn["upstream"].rstrip("/") + path + sep + quote(query, safe="=&;+%/:,@!$'()*~-._")
    request: dict[str, Any] = {
        "method": turn["method"], "url": url, "httpVersion": "HTTP/1.1", "cookies": [],
        "headers": _headers(turn["request_headers"]),
        "queryString": [{"name": k, "value": v} for k, v in parse_qsl(urlsplit(url).query, keep_blank_values=True)],
        "headersSize": -1, "bodySize": 0,
    }
    body = _request_body(turn)
    if body is not None:
        text, size, body_encoding = body
        if not body_encoding:  # the text is the body decoded: its coding no longer applies
            request["headers"] = [h for h in request["headers"] if h["name"].lower() != "content-encoding"]
        request["postData"] = {"mimeType": _header(turn["request_headers"], "content-type") or "", "text": text}
        if body_encoding:
            request["postData"]["_encoding"] = body_encoding  # HAR has no field for a binary request body
        request["bodySize"] = size
    status = turn["http_status"] or 0
    return {
        "startedDateTime": turn["started_at"],
        "time": round(duration, 3),
        "request": request,
        "response": {
            "status": status, "statusText": _reason(status), "httpVersion": "HTTP/1.1", "cookies": [],
            "headers": _headers(turn["response_headers"]),
            "content": _content(raw, content_type, encoding),
            "redirectURL": _header(turn["response_headers"], "location") or "",
            "headersSize": -1, "bodySize": len(raw),
        },
        "cache": {},
        "timings": {"blocked": -1, "dns": -1, "connect": -1, "ssl": -1, "send": 0,
                    "wait": round(ttft, 3), "receive": round(duration - ttft, 3)},
        TOOLTAP_FIELD: {
            "session_id": turn["session_id"], "turn_id": turn["id"], "parent_id": turn["parent_id"],
            "started_at": started_at,  # unix seconds, exact (startedDateTime keeps milliseconds)
            "uid": uid,  # imported back into this database, the turn is known and skipped
            "api": turn["api"], "upstream": turn["upstream"], "path": turn["path"], "route": turn.get("route"),
            "status": turn["status"],
            "error": turn["error"], "stream": turn["stream"], "ttft_ms": turn["ttft_ms"],
            "duration_ms": turn["duration_ms"], "timeline": timeline, "raw_sha256": turn["raw_sha256"],
        },
    }


def _upstream_path(turn: dict) -> str:
    """The path the upstream got: the agent's, less the prefix that chose a named upstream."""
    path, route = turn["path"], turn.get("route") or ""
    if not (route and path.startswith(route) and path[len(route):][:1] in ("", "/", "?")):
        return path
    rest = path[len(route):]
    return rest if rest.startswith("/") else "/" + rest


def _content(raw: bytes, content_type: str | None, encoding: str | None) -> dict:
    """The body as HAR keeps it: decoded from its Content-Encoding, as text when it is
    UTF-8, else base64."""
    body = raw
    if encoding and encoding != "identity":
        try:
            body = decompress(raw, encoding)
        except Exception:  # a body that does not decompress is given as it came
            body = raw
    out: dict[str, Any] = {"size": len(body), "mimeType": content_type or ""}
    if len(body) != len(raw):
        out["compression"] = len(body) - len(raw)
    try:
        out["text"] = body.decode("utf-8")
    except UnicodeDecodeError:
        out["text"], out["encoding"] = base64.b64encode(body).decode("ascii"), "base64"
    return out


def _request_body(turn: dict) -> tuple[str, int, str | None] | None:
    """(text, size in bytes, "base64" or None) of the request body, or None for none."""
    body, encoding = turn["request"], turn["request_encoding"]
    if encoding is None:
        return None
    if encoding == "json":
        text = json.dumps(body, ensure_ascii=False, separators=(",", ":"))
    elif encoding == "base64":
        return body, len(base64.b64decode(body)), "base64"
    else:
        text = body
    return text, len(text.encode("utf-8", "surrogatepass")), None


def _headers(headers: list | None) -> list[dict]:
    return [{"name": k, "value": v} for k, v in headers or []]


def _header(headers: list | None, name: str) -> str | None:
    return next((v for k, v in headers or [] if k.lower() == name), None)


def _reason(status: int) -> str:
    try:
        return HTTPStatus(status).phrase
    except ValueError:
        return ""


def _version() -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("tooltap")
    except PackageNotFoundError:
        return "0"

