"""Test against a recorded session, offline: tooltap's testing API and pytest plugin.

A cassette (written by `tooltap export SESSION --pytest DIR`) is served as the model's
API on a free loopback port. Whatever asks it, the exported test module or your own
agent code, gets the recorded answers, byte for byte; a request that was not recorded
gets an error naming the closest recorded request and how the two differ, and fails the
test: never a silent pass, never a call to the network.

    import pytest
    from proxy.testing import CLINE_VOLATILE

    pytestmark = pytest.mark.tooltap_cassette("session_x.cassette.json", ignore=CLINE_VOLATILE)

    def test_my_agent(tooltap_cassette):
        client = openai.OpenAI(base_url=tooltap_cassette.url, api_key="unused")
        ...

The plugin (pytest_plugin.py) is registered with pytest through the `pytest11` entry point
(`tooltap`): installing tooltap is enough. Outside pytest, `serve_cassette(path)` does the
same, and this module needs no pytest.
"""

from __future__ import annotations

import json
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterable, Iterator

import httpx

from . import apis
from .replay.cassette import Cassette
from .replay.compare import Call, Rules, compare_calls
from .replay.recording import tool_key
from .replay.upstream import CLINE_VOLATILE, WANTED_HEADER, CassetteUpstream, Interaction, Miss
from .sse import SSEDecoder

__all__ = ["CLINE_VOLATILE", "Answer", "Call", "CassetteMiss", "ServedCassette", "assert_calls",
           "calls_in", "serve_cassette"]

class CassetteMiss(AssertionError):
    """A request the cassette holds no answer for."""


@dataclass
class Answer:
    """What the cassette answered one request: the bytes, and what they assemble to."""

    status: int
    content_type: str
    body: bytes
    response: Any  # the provider's non-streaming response (assembled when streamed)
    calls: list[Call] = field(default_factory=list)  # decoded, as the inspector shows them
    stream_error: dict | None = None
    # The connection dropped before the answer's end: `body` is what came before the cut
    # (a turn the upstream aborted replays so; the exported test fails on any other cut).
    cut_short: bool = False


class ServedCassette:
    """A cassette being served: its `url`, the recorded interactions, the misses so far."""

    def __init__(self, cassette: Cassette, upstream: CassetteUpstream, url: str) -> None:
        self.cassette = cassette
        self.upstream = upstream
        self.url = url
        self._reported = 0

    @property
    def interactions(self) -> list[Interaction]:
        return self.upstream.interactions

    @property
    def misses(self) -> list[Miss]:
        return self.upstream.misses

    def send(self, index: int, client: httpx.Client | None = None) -> Answer:
        """Send recorded request `index` to the cassette and assemble the answer. A
        connection dropped mid-body is not raised: the answer says `cut_short`, with the
        bytes that came, so a test can check that a recorded abort replays as one."""
        i = self.interactions[index]
        # A request recorded without a body (a GET /models) is sent without one, not as "null".
        body = i.request if isinstance(i.request, str) else "" if i.request is None else json.dumps(
            i.request, ensure_ascii=False)
        headers = dict(i.request_headers)
        headers[WANTED_HEADER.decode()] = str(index)
        with ExitStack() as stack:
            if client is None:
                client = stack.enter_context(httpx.Client(timeout=60))
            r = stack.enter_context(client.stream(i.method, self.url + i.path, content=body.encode("utf-8"),
                                                  headers=headers))
            received, cut_short = bytearray(), False
            try:
                for data in r.iter_bytes():
                    received += data
            except (httpx.RemoteProtocolError, httpx.ReadError):  # the peer closed it mid-body
                cut_short = True
        self.check()
        answer = calls_in(i.api, i.request, r.status_code, r.headers.get("content-type", ""), bytes(received),
                          self.cassette.session.get("mcp_servers"))
        answer.cut_short = cut_short
        return answer

    def check(self) -> None:
        """Fail on every miss not reported yet."""
        fresh = self.misses[self._reported:]
        self._reported = len(self.misses)
        if fresh:
            raise CassetteMiss("\n".join(m.explain() for m in fresh))


@contextmanager
def serve_cassette(path: str | Path | Cassette, *, ignore: Iterable[str] | None = None,
                   speed: float = 0.0) -> Iterator[ServedCassette]:
    """Serve a cassette on a free loopback port for the duration of the block. `ignore`
    adds to the cassette's own ignore rules (see `proxy.replay.upstream.IgnoreRules`)."""
    cassette = path if isinstance(path, Cassette) else Cassette.load(path)
    upstream = cassette.upstream(speed=speed, ignore=[*cassette.ignore, *(ignore or ())])
    with upstream.serving() as url:
        yield ServedCassette(cassette, upstream, url)


def calls_in(api_name: str | None, request: Any, status: int, content_type: str, body: bytes,
             mcp_servers: dict | None = None) -> Answer:
    """Assemble a response (streamed or not) with its wire API and decode its tool calls
    with the agent decoders, the way tooltap does for a captured turn."""
    api = apis.by_name(api_name or "")
    response, error = None, None
    if api is not None and content_type.startswith("text/event-stream"):
        decoder, assembler = SSEDecoder(), api.new_assembler()
        for event in decoder.feed(body) + decoder.close():
            assembler.feed(event)
        response, error = assembler.result(), assembler.error
    else:
        try:
            response = json.loads(body) if body else None
        except ValueError:
            response = body.decode("utf-8", "replace")
    answer = Answer(status, content_type, body, response, stream_error=error)
    if api is not None and isinstance(response, dict) and status < 400:
        answer.calls = _decoded_calls(api, request, response, mcp_servers)
    return answer


def _decoded_calls(api, request: Any, response: dict, mcp_servers: dict | None) -> list[Call]:
    from .agents import CallInput, TurnInput, decode_session

    raw = api.tool_calls(response)
    turn = TurnInput(0, None, api.name, request if isinstance(request, dict) else None, response,
                     [CallInput(c.index, c.id, c.name, c.arguments_raw, c.arguments, c.arguments_error) for c in raw])
    decoding = decode_session([turn], known_uids=mcp_servers)
    calls = [Call(tool_key(c.name, decoding.call(0, c.index).get("decoded")), c.arguments, c.name) for c in raw]
    for t in decoding.turn(0).get("text_tool_calls") or []:  # Cline's XML tool calls in the text
        calls.append(Call(tool_key(t.get("name") or "", t.get("decoded")), t.get("arguments"), t.get("name") or ""))
    return calls


def assert_calls(expected: Iterable[Call], actual: Iterable[Call], *, order: str = "strict",
                 args: str = "exact", ignore: Iterable[str] = (), per_tool: dict | None = None,
                 label: str = "") -> None:
    """Fail, naming the tool, the argument path and both values, unless `actual` matches
    `expected` under the modes of `proxy.replay.compare` (order strict|unordered|subset|
    superset, args exact|subset|superset|ignore, ignored argument paths like task_progress)."""
    __tracebackhide__ = True  # pytest shows the caller's line, not this function
    expected, actual = list(expected), list(actual)
    rules = Rules(order=order, args=args, per_tool=dict(per_tool or {}), ignore=tuple(ignore))
    mismatches = compare_calls(expected, actual, rules)
    if mismatches:
        lines = [f"{label + ': ' if label else ''}tool calls differ from the recording ({len(mismatches)}):"]
        lines += [f"  {m.reason}" for m in mismatches]
        lines.append(f"  recorded: {_listing(expected)}")
        lines.append(f"  replayed: {_listing(actual)}")
        raise AssertionError("\n".join(lines))


def _listing(calls: list[Call]) -> str:
    return ", ".join(c.tool for c in calls) or "no tool calls"
