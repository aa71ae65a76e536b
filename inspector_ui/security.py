"""Headers and the UI token, on every inspector response.

Everything the inspector shows was written by someone else (a model, a file, a tool), so
the browser is told to run nothing but our own static files, and never to guess a content
type. When tooltap listens beyond loopback it needs `--ui-token`: the token is accepted as
a bearer header, a cookie, or once as `?token=` (which sets the cookie, so links and the
live stream work without repeating it).
"""

from __future__ import annotations

import hmac
import ipaddress
import logging
from http.cookies import SimpleCookie
from urllib.parse import parse_qsl, urlencode

log = logging.getLogger("tooltap.inspector")
COOKIE = "tooltap_token"

CSP = "; ".join([
    "default-src 'self'",
    "script-src 'self'",
    "style-src 'self'",
    "img-src 'self' data:",
    "connect-src 'self'",
    "object-src 'none'",
    "base-uri 'none'",
    "form-action 'self'",
    "frame-ancestors 'none'",
])

SECURITY_HEADERS = [
    (b"content-security-policy", CSP.encode()),
    (b"x-content-type-options", b"nosniff"),
    (b"referrer-policy", b"no-referrer"),
    (b"x-frame-options", b"DENY"),
    (b"cross-origin-resource-policy", b"same-origin"),
]


class Guard:
    """Pure ASGI (not BaseHTTPMiddleware) so the live event stream is never buffered."""

    def __init__(self, app, token: str | None = None):
        self.app = app
        self.token = token or None

    async def __call__(self, scope, receive, send):
        if scope["type"] == "websocket":  # there are none; never let one past the checks
            return await send({"type": "websocket.close", "code": 1008})
        if scope["type"] != "http":
            return await self.app(scope, receive, send)

        async def send_secured(message):
            if message["type"] == "http.response.start":
                names = {k for k, _ in SECURITY_HEADERS}
                headers = [(k, v) for k, v in message.get("headers", []) if k.lower() not in names]
                message = {**message, "headers": headers + SECURITY_HEADERS}
            await send(message)

        if self.token is None and not _loopback_host(scope):
            # Without a token the inspector serves loopback only; a page from elsewhere that
            # made its own name resolve to 127.0.0.1 (DNS rebinding) must not read it.
            return await _plain(send_secured, 421, b"tooltap: this inspector answers to localhost only\n")
        if self.token is not None:
            verdict = self._check(scope)
            if verdict == "refuse":
                return await _plain(send_secured, 401, b"tooltap: this inspector needs its UI token: open a page "
                                    b"once with ?token=..., or send Authorization: Bearer ...\n")
            if verdict == "from_query":
                return await _set_cookie_and_redirect(send_secured, scope, self.token)
        started = False

        async def send_tracked(message):
            nonlocal started
            started = started or message["type"] == "http.response.start"
            await send_secured(message)

        try:
            return await self.app(scope, receive, send_tracked)
        except Exception as exc:
            # Starlette's own 500 page would be sent outside this guard, without headers.
            if started:
                raise
            if "database is locked" in str(exc):  # SQLite held by another program: not a bug
                log.warning("inspector: %s could not be read: the database is locked by another program",
                            scope.get("path"))
                return await _plain(send_secured, 503, LOCKED)
            log.exception("inspector error on %s", scope.get("path"))
            await _plain(send_secured, 500, b"tooltap: internal error (see the server log)\n")

    def _check(self, scope) -> str:
        headers = dict(scope["headers"])
        auth = headers.get(b"authorization", b"").decode("latin-1")
        if auth.startswith("Bearer ") and self._ok(auth[7:]):
            return "ok"
        if self._ok(headers.get(b"x-tooltap-token", b"").decode("latin-1")):
            return "ok"
        cookie = SimpleCookie()
        try:
            cookie.load(headers.get(b"cookie", b"").decode("latin-1"))
        except Exception:  # a malformed cookie header is just no cookie
            pass
        if COOKIE in cookie and self._ok(cookie[COOKIE].value):
            return "ok"
        query = dict(parse_qsl(scope.get("query_string", b"").decode("latin-1")))
        if self._ok(query.get("token", "")):
            return "from_query"
        return "refuse"

    def _ok(self, given: str) -> bool:
        return bool(given) and hmac.compare_digest(given.encode(), self.token.encode())


def _loopback_host(scope) -> bool:
    """True only for a Host that names loopback exactly: `localhost`, or a loopback address.

    A prefix test is not enough: `127.0.0.1.attacker.example` is a name the attacker's DNS
    answers, and after rebinding it reaches us with that Host."""
    host = next((v.decode("latin-1") for k, v in scope["headers"] if k == b"host"), "")
    if host.startswith("["):
        name, _, port = host[1:].partition("]")
        port = port[1:] if port.startswith(":") else port
    else:
        name, _, port = host.partition(":")
    if port and not port.isdigit():
        return False
    return is_loopback_name(name)


def is_loopback_name(name: str) -> bool:
    """`localhost` or a loopback address (IPv4, IPv6 or IPv4-mapped), nothing that merely
    starts like one."""
    name = name.lower().strip("[]")
    if name in ("localhost", "localhost."):
        return True
    try:
        address = ipaddress.ip_address(name)
    except ValueError:
        return False
    mapped = getattr(address, "ipv4_mapped", None)
    return address.is_loopback or bool(mapped and mapped.is_loopback)


LOCKED = (b"tooltap: the database is locked by another program (a sqlite3 shell, a backup?); "
          b"this page can be read again once it lets go. Turns are still recorded: they wait on disk.\n")


async def _plain(send, status: int, body: bytes) -> None:
    await send({"type": "http.response.start", "status": status, "headers": [
        (b"content-type", b"text/plain; charset=utf-8"), (b"content-length", str(len(body)).encode())]})
    await send({"type": "http.response.body", "body": body})


async def _set_cookie_and_redirect(send, scope, token: str) -> None:
    """Trade `?token=` for a cookie and drop it from the address bar and history."""
    rest = [(k, v) for k, v in parse_qsl(scope.get("query_string", b"").decode("latin-1")) if k != "token"]
    location = scope["path"] + ("?" + urlencode(rest) if rest else "")
    cookie = f"{COOKIE}={token}; Path=/_tooltap; HttpOnly; SameSite=Strict"
    await send({"type": "http.response.start", "status": 303, "headers": [
        (b"location", location.encode()), (b"set-cookie", cookie.encode()), (b"content-length", b"0")]})
    await send({"type": "http.response.body", "body": b""})
