"""A turn's request as a curl command, credentials left as placeholders.

The stored headers hold fingerprints, never keys, so the command says `$API_KEY` where
the key goes; hop-by-hop and transport headers are left to curl.
"""

from __future__ import annotations

import json
import shlex
from typing import Any

from proxy.bidi import CONTROLS, escaped
from proxy.secrets import _SECRET_PARAM, is_secret_name

from .longtext import CLIP

SKIP = {"host", "content-length", "accept-encoding", "connection", "transfer-encoding", "cookie",
        "x-tooltap-token", "x-tooltap-session"}


def as_curl(turn: dict[str, Any], tooltap_url: str, body_limit: int = CLIP) -> str:
    """The request again, sent through tooltap (`tooltap_url`, where the inspector is
    served) to the same upstream route, so the replay is recorded too."""
    path = turn.get("path") or "/"
    base, sep, query = path.partition("?")
    if sep:
        query = _SECRET_PARAM.sub(lambda m: m.group(1) + "$API_KEY", query)
        path = f"{base}?{query}"
    url = tooltap_url.rstrip("/") + path
    lines = [f"curl -sS -X {turn.get('method') or 'POST'} {_quote_url(url)}"]
    for name, value in turn.get("request_headers") or []:
        low = name.lower()
        if low in SKIP or (low == "content-encoding" and turn.get("request_encoding") == "json"):
            continue  # (a compressed body is stored and given decoded when it parsed: it goes so)
        if is_secret_name(low):
            scheme = value.split(" ", 1)[0] if " " in value else ""
            value = f"{scheme} $API_KEY" if scheme else "$API_KEY"
            lines.append(f'-H "{name}: {value}"')  # double quotes: the shell fills in $API_KEY
        else:
            lines.append(f"-H {_shell_quote(f'{name}: {value}')}")
    body = turn.get("request")
    if body is not None:
        # JSON with its bidirectional controls as escapes: the page need not mark them, and
        # the command copied from it sends the same JSON (a text body holding one goes in a file).
        text = body if isinstance(body, str) else escaped(json.dumps(body, ensure_ascii=False))
        if _needs_file(turn, text, body_limit):
            lines.append(f"--data-binary @{request_file_name(turn)}")
        else:
            lines.append(f"--data-binary {shlex.quote(text)}")  # quoted whole: nothing in it runs
    return " \\\n  ".join(lines)


def _needs_file(turn: dict[str, Any], text: str, body_limit: int) -> bool:
    """Whether the body must go in a file (the turn's /request download) to reach curl as sent:
    a page cannot carry a long body, nor a shell argument a binary one; a browser reads CR in
    a page as LF and drops NUL, no shell argument holds a NUL, and curl reads an argument
    starting with `@` as a file name (it would send that file instead)."""
    if len(text) > body_limit or turn.get("request_encoding") == "base64":
        return True
    return text.startswith("@") or "\r" in text or "\0" in text or CONTROLS.search(text) is not None


def request_file_name(turn: dict[str, Any]) -> str:
    kind = {"json": "json", "text": "txt"}.get(turn.get("request_encoding"), "bin")
    return f"tooltap-turn-{turn.get('id')}-request.{kind}"


def _shell_quote(text: str) -> str:
    """Quoted for the shell; a bidirectional control as its UTF-8 bytes in a `$'\\xe2...'`
    word (bash, zsh; bytes, so whatever the locale): the same value, nothing to mark."""
    if not CONTROLS.search(text):
        return shlex.quote(text)
    inner = text.replace("\\", "\\\\").replace("'", "\\'")
    return "$'" + CONTROLS.sub(lambda m: "".join(f"\\x{b:02x}" for b in m[0].encode()), inner) + "'"


def _quote_url(url: str) -> str:
    return f'"{url}"' if "$API_KEY" in url else shlex.quote(url)
