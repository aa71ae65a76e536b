"""Keep credentials out of the database and the logs.

A secret is replaced by a fingerprint: its last four characters and a hash prefix, enough
to tell two keys apart and recognize your own, useless to anyone who reads the database.
"""

from __future__ import annotations

import hashlib
import re
from urllib.parse import unquote

SECRET_HEADERS = frozenset(
    {"authorization", "proxy-authorization", "x-api-key", "api-key", "x-goog-api-key",
     "cookie", "set-cookie", "x-tooltap-token"}
)
_SECRET_PARAM = re.compile(r"(?:^|(?<=[&;]))((?:key|api_key|api-key|apikey|access_token|token)=)([^&;]*)", re.I)
_SCHEME = re.compile(r"^(Bearer|Basic|Token|Bot)\s+", re.IGNORECASE)


def fingerprint(secret: str) -> str:
    """`…abcd#1f2e3d4c`: last 4 characters (only of a long secret) and a sha256 prefix."""
    digest = hashlib.sha256(secret.encode("utf-8", "surrogateescape")).hexdigest()[:8]
    tail = secret[-4:] if len(secret) >= 16 else ""
    return f"…{tail}#{digest}"


def redact_header(name: str, value: str) -> str:
    if name.lower() not in SECRET_HEADERS:
        return value
    scheme = _SCHEME.match(value)
    if scheme:
        return scheme.group(0) + fingerprint(value[scheme.end():])
    return fingerprint(value)


def redact_headers(headers: list[tuple[str, str]]) -> list[list[str]]:
    return [[name, redact_header(name, value)] for name, value in headers]


def redact_query(query: str) -> str:
    """Fingerprint `?key=` and its kin in place; the rest of the query stays verbatim."""
    return _SECRET_PARAM.sub(lambda m: m.group(1) + fingerprint(unquote(m.group(2))), query)


def redact_url(url: str) -> str:
    """Drop user:password from a URL and fingerprint secret query parameters."""
    url = re.sub(r"//[^/@]+@", "//", url, count=1)
    base, sep, query = url.partition("?")
    return base + sep + redact_query(query) if sep else url
