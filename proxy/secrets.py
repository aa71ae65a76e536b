"""Keep credentials out of the database and the logs.

A secret is replaced by a fingerprint: its last four characters and a hash prefix, enough
to tell two keys apart and recognize your own, useless to anyone who reads the database.

What is a secret is decided by rule, not by a list, since every gateway and cloud invents
its own header (`helicone-auth`, `x-portkey-api-key`, `x-amz-security-token`...):
- a header or query parameter whose name has a word that says credential (key, token,
  auth, secret, password, credential, session, signature, cookie...), whole or fused
  (`apiKey`, `X-Amz-Security-Token`, `sessionid`); the value becomes a fingerprint;
- anywhere in any other header value or query parameter, a string shaped like a known
  key (`sk-...`, `AIza...`, `xoxb-...`, `ghp_...`, a JWT...) is fingerprinted in place;
- names added by the operator (`tooltap serve --secret-header NAME`).
"""

from __future__ import annotations

import hashlib
import re
from functools import lru_cache
from typing import Iterable
from urllib.parse import unquote, unquote_plus

# The names everyone knows; the rule below covers them and many more.
SECRET_HEADERS = frozenset(
    {"authorization", "proxy-authorization", "x-api-key", "api-key", "x-goog-api-key",
     "cookie", "set-cookie", "x-tooltap-token"}
)
# Names the rule would catch that carry no credential: tooltap's own session header (a
# name the user chose, taken out by the forwarder before anything is stored) and the
# key SDKs send to make a retry safe, which ties retries together on the turn pages.
NOT_SECRET = frozenset({"x-tooltap-session", "idempotency-key"})

# One word of a name (split at punctuation and camelCase), matched whole: `tokens` (a
# count in rate-limit headers), `portkey`, `authenticate` (a challenge) do not match.
_CREDENTIAL_WORD = re.compile(
    r"(?:api|access|admin|auth|bearer|client|csrf|id|master|o|private|refresh|secret|security|"
    r"session|subscription|xsrf)?"
    r"(?:key|token|secret|auth|authorization|authentication|password|passwd|pwd|pass|"
    r"credentials?|creds|session|sessionid|signature|sig|cookie|jwt)"
)
_WORD_SPLIT = re.compile(r"[^A-Za-z0-9]+|(?<=[a-z0-9])(?=[A-Z])")

# Values shaped like the keys of well-known providers, wherever they appear.
_KEY_SHAPES = re.compile(
    r"(?<![A-Za-z0-9_-])(?:"
    r"sk-[A-Za-z0-9_-]{16,}"  # OpenAI, Anthropic (sk-ant-), OpenRouter (sk-or-), DeepSeek...
    r"|AIza[0-9A-Za-z_-]{20,}"  # Google
    r"|xox[abeposr]-[A-Za-z0-9-]{20,}"  # Slack
    r"|gh[pousr]_[A-Za-z0-9]{20,}|github_pat_[A-Za-z0-9_]{20,}"  # GitHub
    r"|glpat-[A-Za-z0-9_-]{20,}"  # GitLab
    r"|(?:AKIA|ASIA)[0-9A-Z]{16}"  # AWS access key id
    r"|hf_[A-Za-z0-9]{20,}|gsk_[A-Za-z0-9]{20,}|xai-[A-Za-z0-9]{20,}|r8_[A-Za-z0-9]{20,}"
    r"|pplx-[A-Za-z0-9]{20,}|nvapi-[A-Za-z0-9_-]{20,}"  # HF, Groq, xAI, Replicate, Perplexity, NVIDIA
    r"|(?:sk|rk)_(?:live|test)_[A-Za-z0-9]{16,}"  # Stripe
    r"|eyJ[A-Za-z0-9_-]{10,}\.eyJ[A-Za-z0-9_-]{10,}\.[A-Za-z0-9_-]*"  # a JWT
    r")"
)
_SHORTEST_KEY = 19  # `sk-` and 16 more: a shorter value cannot hold one of the shapes above
_SCHEME = re.compile(r"^(Bearer|Basic|Token|Bot)\s+", re.IGNORECASE)
# The query parameters `inspector_ui/curl.py` turns into `$API_KEY`.
_SECRET_PARAM = re.compile(r"(?:^|(?<=[&;]))((?:key|api_key|api-key|apikey|access_token|token)=)([^&;]*)", re.I)

_extra_names: frozenset[str] = frozenset()


def add_secret_names(names: Iterable[str]) -> None:
    """Also treat these header (or query parameter) names as secret, for this process."""
    global _extra_names
    _extra_names = _extra_names | {n.strip().lower() for n in names if n.strip()}
    for cached in (is_secret_name, redact_header, redact_query, redact_url):
        cached.cache_clear()


@lru_cache(maxsize=1024)
def is_secret_name(name: str) -> bool:
    """Does this header or query parameter name say its value is a credential?"""
    low = name.strip().lower()
    if low in NOT_SECRET:
        return False
    if low in SECRET_HEADERS or low in _extra_names:
        return True
    return any(_CREDENTIAL_WORD.fullmatch(w.lower()) for w in _WORD_SPLIT.split(name) if w)


def fingerprint(secret: str) -> str:
    """`…abcd#1f2e3d4c`: last 4 characters (only of a long secret) and a sha256 prefix."""
    digest = hashlib.sha256(secret.encode("utf-8", "surrogateescape")).hexdigest()[:8]
    tail = secret[-4:] if len(secret) >= 16 else ""
    return f"…{tail}#{digest}"


def redact_keys(text: str) -> str:
    """`text` with every key-shaped string in it fingerprinted."""
    if len(text) < _SHORTEST_KEY:  # most header values: skip the search
        return text
    return _KEY_SHAPES.sub(lambda m: fingerprint(m.group()), text)


# An agent sends the same headers and query on every request: the answers are cached,
# a few microseconds of regular expressions less before each request goes upstream.
@lru_cache(maxsize=1024)
def redact_header(name: str, value: str) -> str:
    if not is_secret_name(name):
        return redact_keys(value)
    if not value:
        return value
    scheme = _SCHEME.match(value)
    if scheme:
        return scheme.group(0) + fingerprint(value[scheme.end():])
    return fingerprint(value)


def redact_headers(headers: list[tuple[str, str]]) -> list[list[str]]:
    return [[name, redact_header(name, value)] for name, value in headers]


_QUERY_SEPARATORS = re.compile(r"([&;])")


@lru_cache(maxsize=256)
def redact_query(query: str) -> str:
    """Fingerprint secret parameters in place; the rest of the query stays verbatim."""
    parts = _QUERY_SEPARATORS.split(query)
    for i in range(0, len(parts), 2):  # odd indexes are the separators
        name, eq, value = parts[i].partition("=")
        if eq and value and is_secret_name(unquote_plus(name)):
            parts[i] = name + eq + fingerprint(unquote(value))
        else:
            parts[i] = redact_keys(parts[i])
    return "".join(parts)


@lru_cache(maxsize=64)
def redact_url(url: str) -> str:
    """Drop user:password from a URL and fingerprint secret query parameters."""
    url = re.sub(r"//[^/@]+@", "//", url, count=1)
    base, sep, query = url.partition("?")
    return base + sep + redact_query(query) if sep else url
