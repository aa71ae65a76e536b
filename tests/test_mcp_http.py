"""`tooltap serve --mcp NAME=URL`: the official SDK's streamable-HTTP server behind a real
tooltap, driven by the SDK's streamable-HTTP client; bytes and headers as the server
sent them; every message recorded under its session."""

from __future__ import annotations

import json
import os
import sqlite3
import time

import anyio
import httpx
import pytest
from click.testing import CliRunner

from proxy.cli import main
from proxy.mcp.http import McpUpstream
from proxy.scripted import Reply, ScriptedUpstream
from tests.conftest import Server, free_port
from tests.mcp_support import TASK_PROGRESS, WASHINGTON
from tests.mcp_weather_server import build


def _talk(url: str):
    """initialize, tools/list, a call with task_progress, a call that fails."""
    from mcp import ClientSession
    from mcp.client.streamable_http import streamable_http_client

    async def main():
        async with streamable_http_client(url) as (r, w):
            async with ClientSession(r, w) as session:
                await session.initialize()
                tools = await session.list_tools()
                ok = await session.call_tool("get_forecast", {**WASHINGTON, "task_progress": TASK_PROGRESS})
                bad = await session.call_tool("get_forecast", {"latitude": 0, "longitude": 0})
                return tools, ok, bad

    return anyio.run(main)


def _messages(tooltap, server):
    deadline = time.monotonic() + 10
    while True:
        tooltap.app.mcp.recorder.flush()
        got = tooltap.api(f"/mcp/messages?server={server}")["messages"][::-1]
        if len(got) >= 8 or time.monotonic() > deadline:
            return got


def test_sdk_server_and_client_through_tooltap(make_tooltap, upstream):
    sse_server, json_server = build().streamable_http_app(), build().streamable_http_app(json_response=True)
    with Server(sse_server) as a, Server(json_server) as b:
        tooltap = make_tooltap(upstream.url, mcp_servers=(McpUpstream("weather", f"{a.url}/mcp"),
                                                          McpUpstream("weather-json", f"{b.url}/mcp")))
        direct = _talk(f"{a.url}/mcp")
        for name in ("weather", "weather-json"):
            tools, ok, bad = _talk(f"{tooltap.url}/_mcp/{name}")
            assert [t.name for t in tools.tools] == [t.name for t in direct[0].tools]
            assert ok.content[0].text == direct[1].content[0].text and ok.is_error is False
            assert bad.is_error is True and bad.content[0].text == direct[2].content[0].text

            msgs = _messages(tooltap, name)
            calls = [m for m in msgs if m["method"] in ("initialize", "tools/list", "tools/call")]
            assert [(m["direction"], m["method"]) for m in calls] == [
                ("to_server", "initialize"), ("from_server", "initialize"),
                ("to_server", "tools/list"), ("from_server", "tools/list"),
                ("to_server", "tools/call"), ("from_server", "tools/call"),
                ("to_server", "tools/call"), ("from_server", "tools/call")]
            assert len({m["connection"] for m in msgs}) == 1  # one Mcp-Session-Id, one connection
            assert calls[4]["json"]["params"]["arguments"]["task_progress"] == TASK_PROGRESS
            assert [calls[5]["is_error"], calls[7]["is_error"]] == [False, True]

        tooltap.app.mcp.recorder.flush()
        page = tooltap.api("/mcp/servers/weather-json")
        forecast_calls = [c for c in page["recent_calls"] if c["tool"] == "get_forecast"]
        assert [c["undeclared_arguments"] for c in forecast_calls] == [[], ["task_progress"]]
        assert [c["is_error"] for c in forecast_calls] == [True, False]
        assert page["tool_sets"][0]["tool_count"] == 4
        (run,) = page["connections"]  # the client's DELETE at the end closed its session
        assert run["transport"] == "http" and run["ended_at"] is not None and run["url"] == f"{b.url}/mcp"
        servers = {s["name"]: s for s in tooltap.api("/mcp/servers")["servers"]}
        assert servers["weather"]["calls"] == 2 and servers["weather"]["errors"] == 1

    out = CliRunner().invoke(main, ["schemas", "show", "mcp:weather", "--format", "json",
                                    "--db", f"sqlite:///{tooltap.db_path}"])
    assert out.exit_code == 0, out.output
    assert {t["name"] for t in json.loads(out.output)["tools"]} == {"get_alerts", "get_forecast", "get_radar", "crash"}


def test_bytes_and_headers_pass_as_sent(make_tooltap, upstream):
    """A scripted MCP server: an SSE answer cut mid-event, a 202, a JSON error."""
    events = (b'event: message\r\nid: 1\r\ndata: {"jsonrpc":"2.0","method":"notifications/progress",'
              b'"params":{"progress":1}}\r\n\r\n: keep-alive\r\n\r\n'
              b'data: {"jsonrpc":"2.0","id":7,"result":{"content":[{"type":"text","text":"\xe2\x98\x83 snow"}]}}\n\n')
    mcp = ScriptedUpstream({"/mcp": [
        Reply(200, [("content-type", "text/event-stream"), ("mcp-session-id", "s-1"), ("x-extra", "kept")],
              [events[i:i + 11] for i in range(0, len(events), 11)]),
        Reply(202, [], []),
        Reply.json({"jsonrpc": "2.0", "id": 8, "error": {"code": -32601, "message": "no such method"}}),
    ]})
    with Server(mcp) as m:
        tooltap = make_tooltap(upstream.url, mcp_servers=(McpUpstream("snow", f"{m.url}/mcp"),))
        call = b'{"jsonrpc":"2.0","id":7,"method":"tools/call","params":{"name":"snow","arguments":{}}}'
        with httpx.Client(base_url=tooltap.url, timeout=10) as c:
            r1 = c.post("/_mcp/snow?trace=1", content=call, headers={
                "content-type": "application/json", "accept": "application/json, text/event-stream",
                "authorization": "Bearer secret-token-for-the-mcp-server"})
            r2 = c.post("/_mcp/snow", content=b'{"jsonrpc":"2.0","method":"notifications/initialized"}',
                        headers={"mcp-session-id": "s-1"})
            r3 = c.post("/_mcp/snow", content=b'{"jsonrpc":"2.0","id":8,"method":"nope"}',
                        headers={"mcp-session-id": "s-1"})
            r4 = c.post("/_mcp/unknown", content=b"{}")
    assert r1.status_code == 200 and r1.content == events
    assert r1.headers["mcp-session-id"] == "s-1" and r1.headers["x-extra"] == "kept"
    assert r2.status_code == 202 and r2.content == b""
    assert r3.json()["error"]["code"] == -32601
    assert r4.status_code == 404 and "no MCP server" in r4.json()["error"]["message"]
    sent = mcp.received[0]
    assert sent.body == call and sent.query == "trace=1" and sent.path == "/mcp"
    assert sent.header("authorization") == "Bearer secret-token-for-the-mcp-server"  # the agent's, untouched

    tooltap.app.mcp.recorder.flush()
    msgs = tooltap.api("/mcp/messages?server=snow")["messages"][::-1]
    assert [(m["direction"], m["kind"], m["method"]) for m in msgs] == [
        ("to_server", "request", "tools/call"), ("from_server", "notification", "notifications/progress"),
        ("from_server", "response", "tools/call"), ("to_server", "notification", "notifications/initialized"),
        ("to_server", "request", "nope"), ("from_server", "response", "nope")]
    assert msgs[2]["json"]["result"]["content"][0]["text"] == "☃ snow"
    assert len({m["connection"] for m in msgs}) == 1 and msgs[5]["is_error"] is True
    assert all("secret-token" not in tooltap.api(f"/mcp/messages/{m['id']}")["raw"] for m in msgs)


def test_compressed_answers_pass_as_sent_and_are_recorded_decoded(make_tooltap, upstream):
    """The SDKs ask for gzip; a server that compresses its JSON answers (or its event
    stream) reaches the agent as sent, and the recorder reads the messages decoded (they
    were stored as gzip bytes, 'not JSON')."""
    import gzip

    listed = b'{"jsonrpc":"2.0","id":1,"result":{"tools":[{"name":"zipped","inputSchema":{"type":"object"}}]}}'
    stream = b'data: {"jsonrpc":"2.0","id":2,"result":{"content":[{"type":"text","text":"unzipped"}]}}\n\n'
    mcp = ScriptedUpstream({"/mcp": [
        Reply(200, [("content-type", "application/json"), ("content-encoding", "gzip")], [gzip.compress(listed)]),
        Reply(200, [("content-type", "text/event-stream"), ("content-encoding", "gzip")], [gzip.compress(stream)]),
    ]})
    with Server(mcp) as m:
        tooltap = make_tooltap(upstream.url, mcp_servers=(McpUpstream("gz", f"{m.url}/mcp"),))
        with httpx.Client(base_url=tooltap.url, timeout=10) as c:
            first = c.post("/_mcp/gz", content=b'{"jsonrpc":"2.0","id":1,"method":"tools/list"}',
                           headers={"content-type": "application/json", "accept-encoding": "gzip"})
            second = c.post("/_mcp/gz", headers={"content-type": "application/json", "accept-encoding": "gzip"},
                            content=b'{"jsonrpc":"2.0","id":2,"method":"tools/call","params":{"name":"zipped"}}')
    assert first.headers["content-encoding"] == "gzip" and first.content == listed  # httpx decodes what came
    assert second.content == stream
    tooltap.app.mcp.recorder.flush()
    msgs = tooltap.api("/mcp/messages?server=gz")["messages"][::-1]
    assert [(m["direction"], m["kind"], m["method"]) for m in msgs] == [
        ("to_server", "request", "tools/list"), ("from_server", "response", "tools/list"),
        ("to_server", "request", "tools/call"), ("from_server", "response", "tools/call")]
    assert msgs[1]["json"]["result"]["tools"][0]["name"] == "zipped"
    assert msgs[3]["json"]["result"]["content"][0]["text"] == "unzipped"


def test_a_server_that_is_down_is_named_to_the_agent(make_tooltap, upstream):
    """The 502 answers a JSON-RPC request with a JSON-RPC error: the official client shows
    its message (it said only "Server returned an error response" to tooltap's own)."""
    from mcp import ClientSession
    from mcp.client.streamable_http import streamable_http_client

    tooltap = make_tooltap(upstream.url, mcp_servers=(McpUpstream("down", f"http://127.0.0.1:{free_port()}/mcp"),))

    async def main():
        async with streamable_http_client(f"{tooltap.url}/_mcp/down") as (r, w):
            async with ClientSession(r, w) as session:
                await session.initialize()

    with pytest.raises(BaseException) as raised:
        anyio.run(main)
    assert "tooltap could not reach the MCP server" in repr(raised.value), repr(raised.value)
    answer = httpx.post(f"{tooltap.url}/_mcp/down", content=b'{"jsonrpc":"2.0","id":9,"method":"ping"}')
    assert answer.status_code == 502 and answer.json()["id"] == 9
    message = answer.json()["error"]["message"]
    assert message.startswith("tooltap could not reach the MCP server: cannot connect to 127.0.0.1:")
    assert "refused" in message and "ssl" not in message  # a plain-HTTP address, said as one
    # a name this tooltap does not serve: the ones it does are named
    missed = httpx.post(f"{tooltap.url}/_mcp/nope", content=b'{"jsonrpc":"2.0","id":1,"method":"ping"}')
    assert missed.status_code == 404
    assert missed.json()["error"]["message"] == "no MCP server is served at /_mcp/nope; this tooltap serves /_mcp/down"


def test_why_a_server_was_not_reached_is_said_plainly():
    """aiohttp's own words name "ssl:default" for a plain-HTTP address; a name lookup's
    errno is negative (no strerror of it); a connect timeout keeps its words."""
    import errno
    import socket
    import types

    import aiohttp

    from proxy.mcp.http import _unreached

    key = types.SimpleNamespace(host="nosuch.invalid", port=80, ssl=True)
    refused = aiohttp.ClientConnectorError(key, ConnectionRefusedError(errno.ECONNREFUSED, "Connect call failed"))
    assert _unreached(refused) == f"cannot connect to nosuch.invalid:80: {os.strerror(errno.ECONNREFUSED)}"
    unknown = aiohttp.ClientConnectorDNSError(key, socket.gaierror(socket.EAI_NONAME, "Name or service not known"))
    assert _unreached(unknown) == "cannot connect to nosuch.invalid:80: Name or service not known"
    slow = aiohttp.ConnectionTimeoutError("Connection timeout to host http://nosuch.invalid/mcp")
    assert _unreached(slow) == "Connection timeout to host http://nosuch.invalid/mcp"


def test_a_redirect_within_the_server_points_through_tooltap(make_tooltap, upstream):
    """Followed as sent it left tooltap (unrecorded), and the official client refuses a
    redirect to another host."""
    mcp = ScriptedUpstream({"/mcp/": Reply(307, [("location", "PLACEHOLDER"), ("content-length", "0")], [])})
    with Server(mcp) as m:
        mcp.routes["/mcp/"] = Reply(307, [("location", f"{m.url}/mcp"), ("content-length", "0")], [])
        mcp.routes["/elsewhere"] = Reply(307, [("location", "https://example.com/mcp"), ("content-length", "0")], [])
        tooltap = make_tooltap(upstream.url, mcp_servers=(McpUpstream("adv", f"{m.url}/mcp"),))
        r = httpx.post(f"{tooltap.url}/_mcp/adv/", content=b'{"jsonrpc":"2.0","id":1,"method":"ping"}')
        assert r.status_code == 307 and r.headers["location"] == "/_mcp/adv"
        tooltap.app.mcp.recorder.flush()  # the agent sends it again where it leads: it is recorded there
        assert tooltap.api("/mcp/messages")["messages"] == []
        tooltap2 = make_tooltap(upstream.url, mcp_servers=(McpUpstream("out", m.url),))
        r = httpx.post(f"{tooltap2.url}/_mcp/out/elsewhere", content=b"{}")
        assert r.headers["location"] == "https://example.com/mcp"  # not the server's: as sent


def test_what_the_server_never_answered_is_still_recorded(make_tooltap, upstream):
    """A message to a server that is down is kept with the error tooltap answered in the
    server's place; a call the agent gives up on while the server thinks is kept too."""
    tooltap = make_tooltap(upstream.url, mcp_servers=(
        McpUpstream("down", f"http://127.0.0.1:{free_port()}/mcp"), McpUpstream("slow", f"{upstream.url}/mcp")))
    httpx.post(f"{tooltap.url}/_mcp/down", content=b'{"jsonrpc":"2.0","id":9,"method":"ping"}',
               headers={"mcp-session-id": "s-down"})
    upstream.routes["/mcp"] = Reply.json({"jsonrpc": "2.0", "id": 1, "result": {}}, wait=5)
    for session in ("s-slow", None):
        with pytest.raises(httpx.ReadTimeout):
            httpx.post(f"{tooltap.url}/_mcp/slow", timeout=0.5,
                       headers={"mcp-session-id": session} if session else {},
                       content=b'{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"think"}}')
    deadline = time.monotonic() + 10
    while True:
        tooltap.app.mcp.recorder.flush()
        got = tooltap.api("/mcp/messages")["messages"][::-1]
        if len(got) >= 4 or time.monotonic() > deadline:
            break
    down = [m for m in got if m["server"] == "down"]
    assert [(m["direction"], m["note"]) for m in down] == [
        ("to_server", None), ("from_server", "tooltap's answer: the server could not be reached")]
    slow = [(m["direction"], m["note"]) for m in got if m["server"] == "slow"]
    assert slow == [("to_server", "the agent hung up before the server answered")] * 2
    # To a server that is down, a batch gets an error for each request in it; a
    # notification has no answer, and its record says why it went nowhere.
    batch = httpx.post(f"{tooltap.url}/_mcp/down", content=b'[{"jsonrpc":"2.0","id":7,"method":"ping"},'
                       b'{"jsonrpc":"2.0","method":"notifications/initialized"},{"jsonrpc":"2.0","id":8,"method":"a"}]')
    assert batch.status_code == 502 and [e["id"] for e in batch.json()] == [7, 8]
    note = httpx.post(f"{tooltap.url}/_mcp/down", content=b'{"jsonrpc":"2.0","method":"notifications/initialized"}')
    assert note.status_code == 502 and note.json()["error"]["type"] == "tooltap_proxy_error"
    tooltap.app.mcp.recorder.flush()
    newest = tooltap.api("/mcp/messages?server=down&limit=3")["messages"]
    assert [(m["direction"], m["kind"], m["note"]) for m in newest] == [
        ("to_server", "notification", "the server could not be reached"),
        ("from_server", "batch", "tooltap's answer: the server could not be reached"),
        ("to_server", "batch", None)]
    # An exchange outside a session is a connection of its own, ended with it (so prune can take it).
    with sqlite3.connect(tooltap.db_path) as db:
        ended = dict(db.execute("SELECT c.id, c.ended_at IS NOT NULL FROM mcp_connections c JOIN mcp_messages m"
                                " ON m.connection = c.id WHERE m.note LIKE 'the agent hung up%'").fetchall())
        assert sorted(ended.values()) == [0, 1]  # the one in a session goes on; the one on its own ended
        ended = db.execute("SELECT count(*) FROM mcp_connections WHERE ended_at IS NOT NULL").fetchone()[0]
        assert ended == 3  # that one, and the batch's and the notification's to the server that is down
