"""A cassette: one session's exchanges in a file a person can read and review in a diff.

JSON, one interaction per recorded turn. The request body is JSON as sent; the response
body is text when it is UTF-8 (base64 otherwise), whole, with the network's cuts beside it
as `[byte offset, ms since the request]`, the same shape as the store's timeline. So a
changed answer reads as a changed line of text, and the chunk timing is kept.

    {"tooltap_cassette": 1,
     "session": {"id": ..., "title": ..., "agent": ..., "mcp_servers": {uid: server}},
     "ignore": [...],
     "interactions": [{"turn": 12, "api": "openai.chat",
                       "request": {"method": "POST", "path": "/chat/completions",
                                   "headers": {...}, "body": {...}},
                       "response": {"status": 200, "headers": {...},
                                    "body": "data: ...", "timeline": [[0, 812.4], ...]}}]}

Credentials never get in: credential headers are dropped when an interaction is built
(the store already keeps only fingerprints), and `find_secrets` looks through the whole
cassette for anything key-like that is left, so the export can refuse to write it.
"""

from __future__ import annotations

import base64
import json
import math
import re
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterable

from ..bidi import escaped
from ..secrets import SECRET_HEADERS, fingerprint
from .upstream import CassetteUpstream, Interaction, replayable_headers, sendable_headers

FORMAT = 1


class CassetteError(ValueError):
    """A file that is not a cassette this version reads (the message says why)."""


@dataclass
class Cassette:
    session: dict
    interactions: list[Interaction]
    ignore: list[str] = field(default_factory=list)

    @classmethod
    def from_recording(cls, recording) -> "Cassette":
        servers: dict[str, str] = {}
        for turn in recording.turns:
            for call in turn.calls:
                d = call.decoded or {}
                if d.get("uid") and d.get("server") and d.get("server") != d.get("uid"):
                    servers[d["uid"]] = d["server"]
        session = {"id": recording.session_id, "title": recording.title, "agent": recording.agent}
        if servers:
            session["mcp_servers"] = servers
        return cls(session, [Interaction.from_turn(t) for t in recording.turns])

    def upstream(self, *, speed: float = 0.0, ignore: Iterable[str] | None = None) -> CassetteUpstream:
        return CassetteUpstream(self.interactions, speed=speed,
                                ignore=list(self.ignore if ignore is None else ignore))

    # -- to and from JSON ----------------------------------------------------------------

    def to_json(self) -> dict:
        return {"tooltap_cassette": FORMAT, "session": self.session, "ignore": list(self.ignore),
                "interactions": [_interaction_json(i) for i in self.interactions]}

    def dumps(self) -> str:
        """Indented JSON, except each timeline on one line: thousands of cuts would
        otherwise take thousands of lines."""
        doc = self.to_json()
        timelines = []
        for n, i in enumerate(doc["interactions"]):
            timelines.append(json.dumps(i["response"]["timeline"], separators=(",", ":")))
            i["response"]["timeline"] = f"\0timeline{n}\0"
        text = escaped(json.dumps(doc, indent=2, ensure_ascii=False))  # the same JSON, safe to review
        for n, line in enumerate(timelines):
            text = text.replace(json.dumps(f"\0timeline{n}\0"), line, 1)
        return text + "\n"

    def save(self, path: str | Path) -> Path:
        path = Path(path)
        path.write_text(self.dumps(), encoding="utf-8")
        return path

    @classmethod
    def from_json(cls, doc: Any) -> "Cassette":
        if not isinstance(doc, dict) or doc.get("tooltap_cassette") != FORMAT:
            raise CassetteError(f"not a tooltap cassette (format {FORMAT})")
        found = doc.get("interactions")
        if not isinstance(found, list):
            raise CassetteError("damaged cassette: no list of 'interactions'")
        interactions = []
        for n, i in enumerate(found):
            try:
                interactions.append(_interaction(i))
            except KeyError as exc:
                raise CassetteError(f"damaged cassette: interactions[{n}]: {exc.args[0]!r} is missing") from None
            except (TypeError, ValueError, AttributeError) as exc:
                raise CassetteError(f"damaged cassette: interactions[{n}]: {type(exc).__name__}: {exc}") from None
        try:
            return cls(doc.get("session") or {}, interactions, list(doc.get("ignore") or []))
        except (TypeError, ValueError) as exc:
            raise CassetteError(f"damaged cassette: {type(exc).__name__}: {exc}") from None

    @classmethod
    def load(cls, path: str | Path) -> "Cassette":
        path = Path(path)
        try:
            doc = json.loads(path.read_text(encoding="utf-8"))
        except OSError as exc:
            raise CassetteError(f"cannot read cassette {path}: {exc.strerror or exc}") from None
        except ValueError as exc:
            raise CassetteError(f"cassette {path} is not JSON: {exc}") from None
        try:
            return cls.from_json(doc)
        except CassetteError as exc:
            raise CassetteError(f"{path}: {exc}") from None


def _interaction_json(i: Interaction) -> dict:
    body = i.body
    timeline, offset = [], 0
    for ms, data in i.chunks:
        timeline.append([offset, round(ms, 3)])
        offset += len(data)
    try:
        response_body = {"body": body.decode("utf-8")}
    except UnicodeDecodeError:
        response_body = {"body_base64": base64.b64encode(body).decode("ascii")}
    request_body = {"body": i.request} if not isinstance(i.request, str) else {"body_text": i.request}
    return {
        "turn": i.turn_id, "api": i.api,
        "request": {"method": i.method, "path": i.path, "headers": dict(sendable_headers(i.request_headers)),
                    **request_body},
        "response": {"status": i.status, "headers": dict(replayable_headers(i.headers)), **response_body,
                     "timeline": timeline, **({"cut_short": True} if i.cut_short else {})},
    }


def _interaction(d: dict) -> Interaction:
    req, resp = d["request"], d["response"]
    body = (base64.b64decode(resp["body_base64"]) if "body_base64" in resp
            else str(resp.get("body", "")).encode("utf-8"))
    return Interaction(
        method=req["method"], path=req["path"],
        request=req["body"] if "body" in req else req.get("body_text", ""),
        status=int(resp["status"]), headers=replayable_headers((resp.get("headers") or {}).items()),
        chunks=cut(body, resp.get("timeline") or []),
        request_headers=sendable_headers((req.get("headers") or {}).items()),
        turn_id=d.get("turn"), api=d.get("api"), cut_short=bool(resp.get("cut_short")))


def cut(body: bytes, timeline: list) -> list[tuple[float, bytes]]:
    """The body cut at the timeline's offsets. An edited body may be shorter or longer
    than its cuts: cuts past the end are dropped, the last piece takes the rest."""
    cuts = sorted((int(off), float(ms)) for off, ms in timeline if 0 <= int(off) < len(body))
    if not cuts or cuts[0][0] != 0:
        cuts.insert(0, (0, cuts[0][1] if cuts else 0.0))
    out = []
    for n, (off, ms) in enumerate(cuts):
        end = cuts[n + 1][0] if n + 1 < len(cuts) else len(body)
        if end > off:
            out.append((ms, body[off:end]))
    return out


# -- secrets ------------------------------------------------------------------------------------

@dataclass
class Finding:
    where: str  # a JSON path in the cassette, or "line N" of a text
    kind: str
    secret: str

    def __str__(self) -> str:
        return f"{self.where}: {self.kind} ({fingerprint(self.secret)})"


_RANDOM = r"[A-Za-z0-9._~+/=\-]"
_PATTERNS = [
    ("an Anthropic key", re.compile(r"sk-ant-[A-Za-z0-9_\-]{16,}")),
    ("an sk- API key", re.compile(r"(?<![A-Za-z0-9_\-])sk-(?!ant-)[A-Za-z0-9_\-]{20,}")),
    ("a Google API key", re.compile(r"AIza[0-9A-Za-z_\-]{30,}")),
    ("a GitHub token", re.compile(r"\bgh[pousr]_[A-Za-z0-9]{30,}")),
    ("an AWS access key", re.compile(r"\b(?:AKIA|ASIA)[0-9A-Z]{16}\b")),
    ("a Slack token", re.compile(r"\bxox[abprs]-[A-Za-z0-9\-]{10,}")),
    ("a private key", re.compile(r"-----BEGIN [A-Z ]*PRIVATE KEY-----")),
    ("a bearer token", re.compile(rf"(?i)\bbearer\s+({_RANDOM}{{16,}})")),
]
# `x-api-key: ...`, `"api_key": "..."`, `?key=...`, `token=...`: a value that looks random.
_ASSIGNED = re.compile(
    r"(?i)(?<![A-Za-z0-9])(?:x-api-key|x-goog-api-key|api[_-]?key|access[_-]?token|auth[_-]?token|secret|password|key|token)"
    rf"\\?[\"']?\s*[:=]\s*\\?[\"']?({_RANDOM}{{20,}})")


def _looks_random(value: str) -> bool:
    """Shannon entropy per character: keys sit around 4.5-6, words and paths lower."""
    counts = Counter(value)
    entropy = -sum(c / len(value) * math.log2(c / len(value)) for c in counts.values())
    return entropy >= 3.5 and any(ch.isdigit() for ch in value)


def secrets_in_text(text: str) -> list[tuple[str, str]]:
    """(kind, secret) for each key-like string in `text`."""
    found: list[tuple[str, str]] = []
    for kind, pattern in _PATTERNS:
        for m in pattern.finditer(text):
            found.append((kind, m.group(m.lastindex or 0)))
    for m in _ASSIGNED.finditer(text):
        value = m.group(1)
        if _looks_random(value) and not any(value in s or s in value for _, s in found):
            found.append(("a key-like value after " + m.group(0).split(value)[0].strip(" \"':=\\"), value))
    return found


def find_secrets(cassette: Cassette) -> list[Finding]:
    """Everything key-like left in the cassette, each with the JSON path where it sits."""
    out: list[Finding] = []
    for n, i in enumerate(cassette.to_json()["interactions"]):
        for side in ("request", "response"):
            for name, value in (i[side].get("headers") or {}).items():
                if name.lower() in SECRET_HEADERS:
                    out.append(Finding(f"interactions[{n}].{side}.headers[{name!r}]", "a credential header", value))
        if "body_base64" in i["response"]:
            i["response"]["body"] = base64.b64decode(i["response"].pop("body_base64")).decode("utf-8", "replace")
        _walk(i, f"interactions[{n}]", out)
    _walk(cassette.session, "session", out)
    return out


def find_in(value: Any, where: str) -> list[Finding]:
    """Everything key-like in a JSON value, each with its path from `where` (the same
    search, for another file the export writes: a HAR)."""
    out: list[Finding] = []
    _walk(value, where, out)
    return out


def _walk(value: Any, where: str, out: list[Finding]) -> None:
    if isinstance(value, dict):
        for k, v in value.items():
            _walk(k, f"{where} (a key)", out)
            _walk(v, f"{where}.{k}" if re.fullmatch(r"\w+", str(k)) else f"{where}[{json.dumps(k)}]", out)
    elif isinstance(value, list):
        for n, v in enumerate(value):
            _walk(v, f"{where}[{n}]", out)
    elif isinstance(value, str):
        out += [Finding(where, kind, secret) for kind, secret in secrets_in_text(value)]
