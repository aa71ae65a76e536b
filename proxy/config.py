"""Settings for one tooltap server: where to forward, where to store."""

from __future__ import annotations

import os
import re
from dataclasses import dataclass
from urllib.parse import urlsplit

DEFAULT_DB = "sqlite:///tooltap.db"
RESERVED_PREFIX = "/_tooltap"
_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]*$")


@dataclass(frozen=True)
class Upstream:
    name: str | None  # None: served at the root
    url: str  # scheme://host[:port][/base-path], no trailing slash

    @property
    def prefix(self) -> str:
        return f"/{self.name}" if self.name else ""

    @classmethod
    def parse(cls, spec: str) -> "Upstream":
        """`URL` (served at the root) or `NAME=URL` (served under /NAME/)."""
        name, sep, url = spec.partition("=")
        if not sep or "://" in name:
            name, url = None, spec
        elif name.startswith("_"):
            raise ValueError(f"the upstream name {name!r} starts with '_', as tooltap's own paths do "
                             "(/_tooltap, /_mcp); choose another")
        elif not _NAME.match(name):
            raise ValueError(f"bad upstream name {name!r}: use letters, digits, '.', '_', '-'")
        parts = urlsplit(url.strip())
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise ValueError(f"bad upstream URL {url!r}: expected http(s)://host[:port][/path]")
        try:
            parts.port  # noqa: B018 - raises on a port that is not a number in 0-65535
        except ValueError:
            raise ValueError(f"bad upstream URL {url!r}: the port is not a number from 1 to 65535") from None
        if parts.query or parts.fragment:
            raise ValueError(f"bad upstream URL {url!r}: no query string or fragment")
        if parts.username or parts.password:
            # Never sent (the agent's own headers go upstream), and it would be printed in clear.
            shown = parts._replace(netloc=parts.netloc.rpartition("@")[2]).geturl()
            raise ValueError(f"the upstream URL holds a user name or password: give {shown} and let the agent "
                             "send its key, which tooltap forwards")
        return cls(name=name, url=url.strip().rstrip("/"))


@dataclass(frozen=True)
class Settings:
    upstreams: tuple[Upstream, ...]
    db_url: str = DEFAULT_DB
    spool_path: str | None = None  # default: beside the SQLite file, else ./tooltap-spool.jsonl
    connect_timeout: float = 10.0
    read_timeout: float = 600.0  # a slow model may think for minutes before its first byte
    ui_token: str | None = None
    mcp_servers: tuple = ()  # proxy.mcp.http.McpUpstream: streamable-HTTP MCP servers served under /_mcp/NAME
    turn_header: bool = False  # answer each forwarded request with X-Tooltap-Turn: the turn's uid
    writers: int = 1  # writer processes (store/shards.py)

    def resolve(self, path: str) -> tuple[Upstream, str] | None:
        """The upstream serving `path` and the path to send it, or None."""
        root = None
        for up in self.upstreams:
            if up.name is None:
                root = up
            elif path == up.prefix or path.startswith(up.prefix + "/"):
                return up, path[len(up.prefix):] or "/"
        return (root, path) if root else None

    def spool_file(self) -> str:
        if self.spool_path:
            return self.spool_path
        url = normalize_db_url(self.db_url)  # a bare path is a SQLite file, as everywhere else
        if url.startswith("sqlite:///") and url != "sqlite:///:memory:":
            return url[len("sqlite:///"):] + ".spool.jsonl"
        return "tooltap-spool.jsonl"


def upstreams_from_env(value: str | None = None) -> list[Upstream]:
    value = os.environ.get("TOOLTAP_UPSTREAM", "") if value is None else value
    return [Upstream.parse(s) for s in re.split(r"[\s,]+", value) if s]


def normalize_db_url(url: str) -> str:
    """Accept a bare file path as SQLite, and plain postgres:// URLs as psycopg 3."""
    if "://" not in url:
        return f"sqlite:///{url}"
    for plain in ("postgres://", "postgresql://"):
        if url.startswith(plain):
            return "postgresql+psycopg://" + url[len(plain):]
    return url
