"""`tooltap demo`: tooltap with a built-in scripted upstream and a few recorded sessions.

A newcomer with no API key runs one command and sees the inspector working: the real
cline-weather session (Cline 3.x through DeepSeek, an MCP call, task_progress, "result
missing" pairing) and an English one beside it (a retried request, a changed tool set,
and the weather MCP server's side of its call, as `tooltap mcp` records it), a generic
agent making parallel tool calls (one with an argument outside its schema), an
upstream error (Anthropic 529) and a stream the upstream drops halfway. Every scenario
goes through tooltap over real HTTP, exactly like an agent's traffic.
"""

from __future__ import annotations

import asyncio
import json
import logging
import signal
import socket
import tempfile
import threading
import time
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator

import httpx
import uvicorn

from .config import Settings, Upstream, normalize_db_url
from .scripted import Dropped, Received, Reply, ScriptedUpstream

DATA = Path(__file__).parent / "demo_data"
AUTH = {"authorization": "Bearer sk-demo-not-a-real-key-0000"}


# -- building streams --------------------------------------------------------------------

def chat_sse(model: str, deltas: list[dict], usage: dict | None = None, finish: str = "stop",
             cid: str = "chatcmpl-demo") -> bytes:
    """An OpenAI chat.completion.chunk stream from a list of deltas."""
    def event(choices, extra=None) -> bytes:
        body = {"id": cid, "object": "chat.completion.chunk", "created": 1767225600, "model": model,
                "choices": choices, **(extra or {})}
        return b"data: " + json.dumps(body, ensure_ascii=False).encode() + b"\n\n"

    out = [event([{"index": 0, "delta": {"role": "assistant", "content": ""}, "finish_reason": None}])]
    out += [event([{"index": 0, "delta": d, "finish_reason": None}]) for d in deltas]
    out.append(event([{"index": 0, "delta": {}, "finish_reason": finish}]))
    if usage:
        out.append(event([], {"usage": usage}))
    out.append(b"data: [DONE]\n\n")
    return b"".join(out)


def words(text: str) -> list[dict]:
    """Content deltas a few characters at a time, the way models stream."""
    return [{"content": text[i:i + 6]} for i in range(0, len(text), 6)]


# -- scenarios -------------------------------------------------------------------------

@dataclass
class Step:
    path: str
    body: dict | bytes
    reply: Reply
    # The MCP traffic the agent's tool call caused before its next request: (direction,
    # JSON-RPC message, seconds after the one before), recorded as `tooltap mcp` records.
    mcp: tuple[tuple[str, dict, float], ...] = ()


def weather_server(tools: list[dict], arguments: dict, answer: str) -> tuple[tuple[str, dict, float], ...]:
    """The weather MCP server's side of a Cline session: initialize, tools/list (the tools
    as the server describes them, before Cline renamed them and prefixed their
    descriptions) and one tools/call with its answer."""
    from .mcp.messages import FROM_SERVER, TO_SERVER

    listed = [{"name": fn["name"].split("0mcp0", 1)[1], "description": fn["description"].split(": ", 1)[1],
               "inputSchema": fn["parameters"]}
              for fn in (t["function"] for t in tools) if "0mcp0" in fn["name"]]
    version = "2025-06-18"
    return (
        (TO_SERVER, {"jsonrpc": "2.0", "id": 0, "method": "initialize", "params": {
            "protocolVersion": version, "capabilities": {}, "clientInfo": {"name": "Cline", "version": "3.17.9"}}}, 0),
        (FROM_SERVER, {"jsonrpc": "2.0", "id": 0, "result": {
            "protocolVersion": version, "capabilities": {"tools": {"listChanged": False}},
            "serverInfo": {"name": "weather", "version": "1.9.4"}}}, 0.012),
        (TO_SERVER, {"jsonrpc": "2.0", "method": "notifications/initialized"}, 0.001),
        (TO_SERVER, {"jsonrpc": "2.0", "id": 1, "method": "tools/list"}, 0.001),
        (FROM_SERVER, {"jsonrpc": "2.0", "id": 1, "result": {"tools": listed}}, 0.003),
        (TO_SERVER, {"jsonrpc": "2.0", "id": 2, "method": "tools/call",
                     "params": {"name": "get_forecast", "arguments": arguments}}, 0.02),
        (FROM_SERVER, {"jsonrpc": "2.0", "id": 2, "result": {  # the server asked weather.gov
            "content": [{"type": "text", "text": answer}], "isError": False}}, 0.18),
    )


def cline_weather(delay: float = 0.0) -> list[Step]:
    steps = []
    for n in (1, 2, 3, 4):
        turn = DATA / "cline-weather" / f"turn{n}"
        sse = turn / "response.sse"
        body = sse.read_bytes() if sse.exists() else chat_sse("deepseek-chat", words(
            "根据 weather › get_forecast 的结果：华盛顿特区明天以多云为主，有零星阵雨的可能，"
            "白天最高气温约 68°F（20°C），南风 2 到 9 英里/小时。"), finish="stop", cid="demo-final")
        steps.append(Step("/chat/completions", (turn / "request.json").read_bytes(), Reply.sse(body, delay=delay)))
    return steps


WEATHER_TOOL = {"type": "function", "function": {
    "name": "get_weather", "description": "Current weather for a city.",
    "parameters": {"type": "object", "properties": {
        "city": {"type": "string"}, "units": {"type": "string", "enum": ["celsius", "fahrenheit"]}},
        "required": ["city"], "additionalProperties": False}}}


def parallel_calls(delay: float = 0.0) -> list[Step]:
    model = "gpt-4.1-mini"
    system = {"role": "system", "content": "You are a concise travel assistant. Use tools for facts."}
    user = {"role": "user", "content": "Compare the weather in Paris and Tokyo right now."}
    call_a = {"id": "call_paris", "type": "function",
              "function": {"name": "get_weather", "arguments": '{"city": "Paris", "units": "celsius"}'}}
    call_b = {"id": "call_tokyo", "type": "function",
              "function": {"name": "get_weather", "arguments": '{"city": "Tokyo", "units": "kelvin"}'}}
    # The two calls' fragments interleave, as parallel calls do on the wire.
    deltas = words("Checking both cities at once.") + [
        {"tool_calls": [{"index": 0, "id": "call_paris", "type": "function",
                         "function": {"name": "get_weather", "arguments": ""}}]},
        {"tool_calls": [{"index": 1, "id": "call_tokyo", "type": "function",
                         "function": {"name": "get_weather", "arguments": ""}}]},
        {"tool_calls": [{"index": 0, "function": {"arguments": '{"city": "Pa'}}]},
        {"tool_calls": [{"index": 1, "function": {"arguments": '{"city": "Tokyo", '}}]},
        {"tool_calls": [{"index": 0, "function": {"arguments": 'ris", "units": "celsius"}'}}]},
        {"tool_calls": [{"index": 1, "function": {"arguments": '"units": "kelvin"}'}}]},
    ]
    first = {"model": model, "stream": True, "stream_options": {"include_usage": True},
             "messages": [system, user], "tools": [WEATHER_TOOL], "parallel_tool_calls": True}
    second = {**first, "messages": [
        system, user,
        {"role": "assistant", "content": "Checking both cities at once.", "tool_calls": [call_a, call_b]},
        {"role": "tool", "tool_call_id": "call_paris", "content": '{"temp": 14, "units": "celsius", "sky": "overcast"}'},
        {"role": "tool", "tool_call_id": "call_tokyo", "content": "error: units must be celsius or fahrenheit"},
    ]}
    answer = ("Paris: 14 °C and overcast. Tokyo: the lookup failed because I asked for kelvin, "
              "which the tool does not support; ask again and I will retry in celsius.")
    return [
        Step("/chat/completions", first, Reply.sse(chat_sse(model, deltas, {
            "prompt_tokens": 96, "completion_tokens": 58, "total_tokens": 154}, "tool_calls", "chatcmpl-par1"),
            delay=delay)),
        Step("/chat/completions", second, Reply.sse(chat_sse(model, words(answer), {
            "prompt_tokens": 188, "completion_tokens": 41, "total_tokens": 229}, "stop", "chatcmpl-par2"),
            delay=delay)),
    ]


def upstream_error() -> list[Step]:
    body = {"model": "claude-sonnet-4-5", "max_tokens": 1024, "stream": True,
            "system": "You are a careful code reviewer.",
            "messages": [{"role": "user", "content": "Review this diff for race conditions."}]}
    reply = Reply.json({"type": "error", "error": {"type": "overloaded_error", "message": "Overloaded"}},
                       status=529)
    return [Step("/v1/messages", body, reply)]


def aborted_stream() -> list[Step]:
    model = "qwen3-coder"
    body = {"model": model, "stream": True, "messages": [
        {"role": "user", "content": "Write a shell one-liner that counts lines in every .py file."}]}
    sse = chat_sse(model, words("Use find with wc: find . -name '*.py' -print0 | xargs -0 wc -l"),
                   cid="chatcmpl-cut")
    return [Step("/chat/completions", body, Reply.sse(sse, drop_after=5))]


def slow_haiku(delay: float = 0.15) -> list[Step]:
    """One slowly streamed answer: what a turn growing live looks like."""
    model = "gpt-4.1-mini"
    text = ("Bytes pass through the tap,\nevery tool call written down,\nthe agent's mind, "
            "logged.\n\n(streamed slowly so you can watch it arrive)")
    body = {"model": model, "stream": True,
            "messages": [{"role": "user", "content": "Write a haiku about a logging proxy."}]}
    return [Step("/chat/completions", body,
                 Reply.sse(chat_sse(model, words(text), finish="stop", cid="chatcmpl-haiku"), delay=delay))]


def cline_seattle(delay: float = 0.0) -> list[Step]:
    """An English Cline session over the same MCP weather server: the second request is
    retried after a 503 (a branch), and it offers a newer version of the
    weather tools (get_forecast gains `days`), so the schemas page has a real diff."""
    first = json.loads((DATA / "cline-weather" / "turn1" / "request.json").read_bytes())
    task, hint, env = first["messages"][1]["content"]
    env_text = env["text"].replace("2026/3/7 下午9:28:57 (Asia/Shanghai, UTC+8:00)",
                                   "3/7/2026, 9:28:57 AM (America/Los_Angeles, UTC-8:00)")
    user = {"role": "user", "content": [{"type": "text", "text": "<task>\nWhat's the weather in Seattle "
                                         "tomorrow?\n</task>"}, hint, {"type": "text", "text": env_text}]}
    turn1 = {**first, "messages": [first["messages"][0], user]}
    progress = ("- [x] Find Seattle's coordinates\n- [ ] Get tomorrow's forecast\n- [ ] Summarize it")
    call = {"id": "call_sea_1", "type": "function", "function": {
        "name": "cIya4J0mcp0get_forecast",
        "arguments": json.dumps({"latitude": 47.6062, "longitude": -122.3321, "task_progress": progress})}}
    deltas = words("Seattle is at about 47.61 N, 122.33 W. I'll ask the weather server.") + [
        {"tool_calls": [{"index": 0, **{k: v for k, v in call.items() if k != "function"},
                         "function": {"name": call["function"]["name"], "arguments": ""}}]},
        {"tool_calls": [{"index": 0, "function": {"arguments": call["function"]["arguments"]}}]}]
    model = first["model"]
    answer1 = chat_sse(model, deltas, {"prompt_tokens": 11920, "completion_tokens": 88, "total_tokens": 12008},
                       "tool_calls", "chatcmpl-sea1")
    forecast = ("[use_mcp_tool for 'weather'] Result:\n\nTomorrow:\nTemperature: 51°F\nWind: 5 mph S\n"
                "Forecast: Rain likely, mostly cloudy, high near 51.")
    tools_v2 = json.loads(json.dumps(first["tools"]))
    for tool in tools_v2:
        fn = tool["function"]
        if fn["name"] == "cIya4J0mcp0get_forecast":
            fn["parameters"]["properties"]["days"] = {"type": "integer", "minimum": 1, "maximum": 7,
                                                      "description": "How many days to forecast"}
    turn2 = {**first, "tools": tools_v2, "messages": [
        first["messages"][0], user,
        {"role": "assistant", "content": "Seattle is at about 47.61 N, 122.33 W. I'll ask the weather server.",
         "tool_calls": [call]},
        {"role": "tool", "tool_call_id": "call_sea_1", "content": "result missing"},
        {"role": "user", "content": [{"type": "text", "text": forecast}, {"type": "text", "text": env_text}]}]}
    answer2 = chat_sse(model, words("Tomorrow in Seattle: rain likely and mostly cloudy, with a high "
                                    "near 51°F (11°C) and a light south wind."),
                       {"prompt_tokens": 12240, "completion_tokens": 31, "total_tokens": 12271}, "stop", "chatcmpl-sea2")
    busy = Reply.json({"error": {"message": "Service temporarily unavailable, retry", "type": "overloaded"}},
                      status=503)
    mcp = weather_server(first["tools"], {"latitude": 47.6062, "longitude": -122.3321},
                         forecast.split("Result:\n\n", 1)[1])
    return [Step("/chat/completions", turn1, Reply.sse(answer1, delay=delay), mcp),
            Step("/chat/completions", turn2, busy),  # Cline retries the same request
            Step("/chat/completions", turn2, Reply.sse(answer2, delay=delay))]


def all_scenarios(delay: float = 0.0) -> list[list[Step]]:
    return [cline_weather(delay), cline_seattle(delay), parallel_calls(delay), upstream_error(), aborted_stream()]


class _QuietDrops(logging.Filter):
    """The aborted-stream scenario drops a connection on purpose, and a stop cuts the
    scripted upstream's reply still streaming (the slow haiku); uvicorn would print a
    traceback for each."""

    def filter(self, record: logging.LogRecord) -> bool:
        return not (record.exc_info and isinstance(record.exc_info[1], (Dropped, asyncio.CancelledError)))


logging.getLogger("uvicorn.error").addFilter(_QuietDrops())


# -- serving -----------------------------------------------------------------------------

class Router:
    """The scripted upstream answers each request with the reply of the step being played."""

    def __init__(self) -> None:
        self.next: Reply | None = None

    def __call__(self, _req: Received) -> Reply:
        reply, self.next = self.next, None
        return reply or Reply.json({"error": {"message": "demo: no scripted reply"}}, status=500)


def free_port(host: str = "127.0.0.1") -> int:
    with socket.socket() as s:
        s.bind((host, 0))
        return s.getsockname()[1]


class Served:
    """An ASGI app on a real uvicorn in a daemon thread, stopped as `tooltap serve` stops."""

    def __init__(self, app, host: str, port: int, log_level: str = "warning", quiet: bool = False):
        from .app import TooltapApp
        from .server import TooltapServer

        self.host, self.port = host, port
        on_stop = (lambda t: setattr(app, "stop_by", t)) if isinstance(app, TooltapApp) else None
        self.server = TooltapServer(uvicorn.Config(
            app, host=host, port=port, log_level=log_level, access_log=False,
            server_header=False, date_header=False), grace=3.0, on_stop=on_stop, announce=False,
            say_cuts=not quiet)
        self.thread = threading.Thread(target=self.server.run, daemon=True)

    def start(self) -> "Served":
        self.thread.start()
        deadline = time.monotonic() + 15
        while not self.server.started:
            if time.monotonic() > deadline or not self.thread.is_alive():
                raise RuntimeError(f"could not serve on {self.host}:{self.port}")
            time.sleep(0.02)
        return self

    def stop(self) -> None:
        if self.thread.ident is None:  # never started
            return
        self.server.should_exit = True
        self.thread.join(15)


@dataclass
class Demo:
    url: str  # tooltap's base URL
    app: object  # the TooltapApp
    router: Router
    mcp: object  # the MCP recorder (proxy.mcp.store.Recorder) of the scenarios' MCP traffic

    @property
    def inspector(self) -> str:
        return self.url + "/_tooltap/"

    def play(self, steps: list[Step]) -> list[int]:
        """Send each step through tooltap; return the HTTP statuses the agent saw."""
        statuses = []
        with httpx.Client(base_url=self.url, timeout=30) as client:
            for step in steps:
                self.router.next = step.reply
                content = step.body if isinstance(step.body, bytes) else json.dumps(step.body).encode()
                try:
                    r = client.post(step.path, content=content,
                                    headers={"content-type": "application/json", **AUTH})
                    statuses.append(r.status_code)
                except httpx.HTTPError:  # the aborted stream: the agent sees a cut connection
                    statuses.append(0)
                if step.mcp:
                    self._record_mcp(step.mcp)
        return statuses

    def _record_mcp(self, messages: tuple[tuple[str, dict, float], ...]) -> None:
        """In real time: the agent's next request comes after the server's answer."""
        from .mcp.store import Connection, new_id

        conn = Connection(new_id(), "stdio", fallback="weather", command="uv run weather.py")
        for direction, message, after in messages:
            time.sleep(after)
            self.mcp.record(conn, direction, json.dumps(message, ensure_ascii=False).encode())
        self.mcp.ended(conn, 0)

    def play_all(self, delay: float = 0.0) -> None:
        for steps in all_scenarios(delay):
            self.play(steps)
        self.app.writer.flush()
        self.mcp.flush()


@contextmanager
def running(db_url: str | None = None, host: str = "127.0.0.1", port: int | None = None,
            ui_token: str | None = None) -> Iterator[Demo]:
    """tooltap and its scripted upstream, both served in this process. `db_url` as
    `serve --db` takes it (a bare path is a SQLite file): its spool and journal go beside
    it, as serve's do; without one, a database in a temporary folder removed at the end."""
    from .app import TooltapApp
    from .mcp.store import Recorder
    from .store.db import sqlite_path
    from .store.files import create_private

    with tempfile.TemporaryDirectory(prefix="tooltap-demo-") as tmp:
        started: list[Served] = []  # stopped whatever happens, before the folder goes
        recorder = None
        try:
            db_url = normalize_db_url(db_url) if db_url else f"sqlite:///{tmp}/demo.db"
            if (path := sqlite_path(db_url)) is not None:
                create_private(str(path))  # owner-only, as serve makes it (its -wal and -shm follow)
            router = Router()
            upstream = Served(ScriptedUpstream({"/chat/completions": router, "/v1/messages": router}),
                              "127.0.0.1", free_port())
            started.append(upstream)
            upstream.start()
            settings = Settings(upstreams=(Upstream.parse(f"http://127.0.0.1:{upstream.port}"),),
                                db_url=db_url, ui_token=ui_token)
            app = TooltapApp(settings)
            server = Served(app, host, port or free_port(host))
            started.append(server)
            server.start()
            recorder = Recorder(settings.db_url, Path(tmp) / "mcp-spool")
            recorder.start()
            shown = "127.0.0.1" if host in ("0.0.0.0", "::") else host
            yield Demo(f"http://{shown}:{server.port}", app, router, recorder)
        finally:
            if recorder is not None:
                recorder.close()
            for served in reversed(started):
                served.stop()


STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)


@contextmanager
def stopped_by_signals() -> Iterator[None]:
    """SIGTERM and SIGHUP (a closed terminal) stop the demo as Ctrl-C does, by raising
    KeyboardInterrupt, so its servers, its writer process and its temporary folder are
    cleaned up; further signals are ignored from then on, to the process's end: one that
    raised again while the interpreter unwound would end it as killed by SIGINT."""
    stopping = False

    def stop(_sig, _frame):
        nonlocal stopping
        stopping = True
        for sig in STOP_SIGNALS:
            signal.signal(sig, signal.SIG_IGN)
        raise KeyboardInterrupt

    previous = {sig: signal.signal(sig, stop) for sig in STOP_SIGNALS}
    try:
        yield
    finally:
        if not stopping:
            for sig, handler in previous.items():
                signal.signal(sig, handler)
