"""Helpers for the MCP tap tests: the wrapper's command line, a process driven with raw
bytes, the official SDK's stdio client, and the recorded messages read back."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time
from pathlib import Path

import anyio
from sqlmodel import Session as DB

from proxy.mcp import read
from proxy.store.db import make_engine

HERE = Path(__file__).parent
WEATHER = [sys.executable, str(HERE / "mcp_weather_server.py")]
ROOT = HERE.parent
WASHINGTON = {"latitude": 38.9072, "longitude": -77.0369}
TASK_PROGRESS = "- [x] 分析项目结构和可用工具\n- [x] 确定华盛顿的地理位置坐标\n- [ ] 使用天气API查询华盛顿明天的天气预报\n- [ ] 整理并展示查询结果"


def wrapped(db_url: str, *command: str, name: str | None = None, spool: str | None = None) -> list[str]:
    argv = [sys.executable, "-m", "proxy", "mcp", "--db", db_url]
    if name:
        argv += ["--name", name]
    if spool:
        argv += ["--spool", spool]
    return [*argv, "--", *command]


def env() -> dict[str, str]:
    return {**os.environ, "PYTHONPATH": str(ROOT), "PYTHONUNBUFFERED": "1"}


_env = env  # (Driven's parameter hides it)


class Driven:
    """A process fed raw bytes on stdin; everything it writes is collected."""

    def __init__(self, argv: list[str], env: dict[str, str] | None = None):
        """env: variables set on top of this process's."""
        self.proc = subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                     bufsize=0, env={**_env(), **(env or {})}, cwd=str(ROOT))
        self.out = bytearray()
        self.err = bytearray()
        self._cond = threading.Condition()
        self._threads = [threading.Thread(target=self._collect, args=(self.proc.stdout, self.out), daemon=True),
                         threading.Thread(target=self._collect, args=(self.proc.stderr, self.err), daemon=True)]
        for t in self._threads:
            t.start()

    def _collect(self, pipe, buf: bytearray) -> None:
        while data := pipe.read(65536):
            with self._cond:
                buf += data
                self._cond.notify_all()

    def send(self, data: bytes) -> None:
        self.proc.stdin.write(data)
        self.proc.stdin.flush()

    def wait_for(self, lines: int, timeout: float = 60.0) -> bytes:
        """Wait until stdout holds `lines` complete lines."""
        deadline = time.monotonic() + timeout
        with self._cond:
            while self.out.count(b"\n") < lines:
                left = deadline - time.monotonic()
                if left <= 0 or (self.proc.poll() is not None and not self._threads[0].is_alive()):
                    raise AssertionError(f"waited for {lines} lines; got {bytes(self.out)[:500]!r} "
                                         f"stderr {bytes(self.err)[-2000:]!r}")
                self._cond.wait(min(left, 0.2))
            return bytes(self.out)

    def finish(self, timeout: float = 60.0) -> int:
        try:
            self.proc.stdin.close()
        except OSError:
            pass
        code = self.proc.wait(timeout)
        for t in self._threads:
            t.join(10)
        return code


def jsonrpc(obj: dict) -> bytes:
    return json.dumps(obj, ensure_ascii=False).encode() + b"\n"


INITIALIZE = {"jsonrpc": "2.0", "id": 1, "method": "initialize",
              "params": {"protocolVersion": "2025-06-18", "capabilities": {},
                         "clientInfo": {"name": "Cline", "version": "3.38.0"}}}
INITIALIZED = {"jsonrpc": "2.0", "method": "notifications/initialized"}


def recorded(db_url: str, server: str | None = None, limit: int = 1000) -> list[dict]:
    """The stored messages, oldest first."""
    engine = make_engine(db_url)
    try:
        with DB(engine) as db:
            return list(reversed(read.messages(db, server=server, limit=limit)))
    finally:
        engine.dispose()


def with_db(db_url: str, fn):
    engine = make_engine(db_url)
    try:
        with DB(engine) as db:
            return fn(db)
    finally:
        engine.dispose()


def sdk_conversation(argv: list[str], body) -> object:
    """Run `body(session)` inside the official SDK's stdio client and session."""
    from mcp import ClientSession, StdioServerParameters, stdio_client

    async def main():
        params = StdioServerParameters(command=argv[0], args=argv[1:], env=env(), cwd=str(ROOT))
        async with stdio_client(params) as (r, w):
            async with ClientSession(r, w) as session:
                await session.initialize()
                return await body(session)

    return anyio.run(main)
