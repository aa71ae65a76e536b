"""The MCP chain in a real browser: the cline-weather session through tooltap, its MCP
call through `tooltap mcp` around the SDK weather server; the session page shows what the
model asked, what the server got and answered, what the model was told."""

from __future__ import annotations

import json
import sqlite3
import time
from concurrent.futures import ThreadPoolExecutor
from urllib.parse import parse_qs, urljoin, urlsplit

import httpx

from tests.test_mcp_correlate import play_cline_with_mcp


def test_session_page_shows_the_mcp_chain(make_tooltap, upstream, page):
    tooltap = make_tooltap(upstream.url)
    # In a thread: it runs an event loop, and Playwright's sync API holds this thread's.
    with ThreadPoolExecutor(1) as pool:
        _, result = pool.submit(play_cline_with_mcp, tooltap, upstream).result()
    forecast = result.content[0].text
    (s,) = tooltap.api("/sessions")["sessions"]

    page.goto(f"{tooltap.url}/_tooltap/sessions/{s['id']}")
    card = page.locator("[data-testid=tool-call]", has_text="weather › get_forecast")
    chain = card.locator("[data-testid=mcp-chain]")
    assert chain.is_visible()
    steps = chain.locator("[data-testid=chain-steps] > li")
    assert [steps.nth(i).get_attribute("data-step") for i in range(steps.count())] == [
        "turn", "call", "request", "result", "agent"]
    text = chain.inner_text()
    for label in ("LLM turn", "model", "dispatch", "MCP request", "MCP result", "tool", "agent delay",
                  "given to the model"):
        assert label in text
    assert chain.locator("[data-testid=undeclared]").inner_text().endswith("task_progress")
    assert chain.locator("[data-testid=mcp-result]").text_content().strip() == forecast.strip()
    assert chain.locator("[data-testid=mcp-result-match]").inner_text() == "result passed on unchanged"
    # Built-in tools have no chain.
    assert page.locator("[data-testid=tool-call]", has_text="list_files").locator(
        "[data-testid=mcp-chain]").count() == 0
    # The link to the next turn names it by its place, and lands on the turn that carried the result.
    carried = tooltap.api(f"/sessions/{s['id']}")["turns"][3]["id"]
    assert chain.locator("[data-step=agent] a").inner_text() == f"turn 4 #{carried}"
    chain.locator("[data-step=agent] a").click()
    assert page.url.endswith(f"#turn-{carried}")

    # The server's page: its tools/list, the call and the turn that asked for it.
    page.goto(f"{tooltap.url}/_tooltap/mcp")
    page.click("text=weather")
    assert "get_forecast" in page.locator("[data-testid=mcp-tool-sets]").inner_text()
    calls = page.locator("[data-testid=mcp-calls]")
    assert "+task_progress" in calls.inner_text()
    page.click("[data-testid=compare-offered]")  # the schemas page: declared against offered
    assert "removed" in page.locator("[data-testid=diff-summary]").inner_text()
    assert "get_radar" in page.locator("main").inner_text()
    # The dropdowns show the two sources compared, so that "compare" compares them again.
    asked = parse_qs(urlsplit(page.url).query)
    assert asked["a"] == ["mcp:weather@1"] and asked["b"] == [f"mcp:weather@session:{s['id']}"]
    assert page.locator("select[name=a]").input_value() == "mcp:weather@1"
    assert page.locator("select[name=b]").input_value() == f"mcp:weather@session:{s['id']}"
    assert page.locator("select[name=a] option:checked").inner_text().startswith("MCP weather · tool set #1")
    assert page.locator("select[name=b] option:checked").inner_text().startswith(
        f"MCP weather · as offered in session {s['id']} · ")  # in the lists' words, not its value
    summary = page.locator("[data-testid=diff-summary]").inner_text()
    page.click("form.filters button[type=submit]")
    page.wait_for_load_state()
    assert parse_qs(urlsplit(page.url).query) == asked
    assert page.locator("[data-testid=diff-summary]").inner_text() == summary
    page.go_back()
    page.go_back()
    calls = page.locator("[data-testid=mcp-calls]")
    calls.locator("a", has_text="turn").first.click()
    assert "#turn-" in page.url and page.locator("[data-testid=mcp-chain]").count() == 1


def _play_long_mcp_texts(tooltap, upstream) -> dict:
    """An agent on the SDKs (tools under the server's own names) whose model asks for alerts
    with a 70,000-character state and for a 100 KB radar; the calls go through `tooltap mcp`
    around the weather server, and the agent gives the model only the start of the radar."""
    from proxy.demo import chat_sse
    from proxy.scripted import Reply
    from tests.mcp_support import WEATHER, sdk_conversation, wrapped
    from tests.test_proxy_e2e import FINAL_SSE

    state = "<b>DC</b><script>alert(1)</script>" + "x" * 70_000 + "<i>the end of the state</i>"
    asked = {"get_alerts": {"state": state}, "get_radar": {"megabytes": 0.1}}
    tools = [{"type": "function", "function": {"name": n, "parameters": {"type": "object"}}} for n in asked]
    opening = {"model": "m", "stream": True, "tools": tools,
               "messages": [{"role": "user", "content": "Alerts and radar for DC?"}]}
    calls = [{"id": f"call_{i}", "type": "function", "function": {"name": n, "arguments": json.dumps(a)}}
             for i, (n, a) in enumerate(asked.items())]
    upstream.routes["/chat/completions"] = [
        Reply.sse(chat_sse("m", [{"tool_calls": [{"index": i, **c}]} for i, c in enumerate(calls)],
                           finish="tool_calls")),
        Reply.sse(FINAL_SSE)]

    async def call_both(session):
        return [(await session.call_tool(n, a)).content[0].text for n, a in asked.items()]

    with httpx.Client(base_url=tooltap.url, timeout=30) as client:
        assert client.post("/chat/completions", json=opening).status_code == 200
        tooltap.flush()
        alerts, radar = sdk_conversation(wrapped(f"sqlite:///{tooltap.db_path}", *WEATHER), call_both)
        given = radar[:70_000] + "\n(radar cut by the agent)"
        follow = {**opening, "messages": [
            *opening["messages"], {"role": "assistant", "content": None, "tool_calls": calls},
            {"role": "tool", "tool_call_id": "call_0", "content": alerts},
            {"role": "tool", "tool_call_id": "call_1", "content": given}]}
        assert client.post("/chat/completions", json=follow).status_code == 200
    tooltap.flush()
    return {"state": state, "radar": radar, "given": given}


def _whole(page, link) -> str:
    """Follow a clipped text's link: its whole, as plain text the browser does not sniff."""
    response = page.goto(urljoin(page.url, link.get_attribute("href")))
    assert response.status == 200
    assert response.headers["content-type"] == "text/plain; charset=utf-8"
    assert response.headers["x-content-type-options"] == "nosniff"
    return response.text()


def test_clipped_mcp_texts_link_to_their_whole(make_tooltap, upstream, page):
    """The MCP chain and the server's page clip long arguments, results and messages; each
    clipped text links to the whole of it, and captured markup stays text all the way."""
    tooltap = make_tooltap(upstream.url)
    with ThreadPoolExecutor(1) as pool:  # see the test above
        played = pool.submit(_play_long_mcp_texts, tooltap, upstream).result()
    (s,) = tooltap.api("/sessions")["sessions"]
    first = tooltap.api(f"/sessions/{s['id']}")["turns"][0]["id"]
    session_page = f"{tooltap.url}/_tooltap/sessions/{s['id']}"

    page.goto(session_page)
    alerts = page.locator("[data-testid=tool-call]", has_text="get_alerts").locator("[data-testid=mcp-chain]")
    shown = alerts.locator("[data-testid=mcp-arguments]")
    assert shown.text_content().startswith('{\n  "state": "<b>DC</b><script>')  # escaped: shown as text
    assert "more characters not shown" in shown.text_content() and shown.locator("b, script").count() == 0
    assert "/arguments?id=" in shown.locator("a.clip-link").get_attribute("href")  # the call, even in a batch
    assert json.loads(_whole(page, shown.locator("a.clip-link"))) == {"state": played["state"]}

    page.goto(session_page)
    radar = page.locator("[data-testid=tool-call]", has_text="get_radar").locator("[data-testid=mcp-chain]")
    assert _whole(page, radar.locator("[data-testid=mcp-result] a.clip-link")) == played["radar"]
    page.goto(session_page)
    link = radar.locator("[data-testid=agent-text] a.clip-link")
    assert link.get_attribute("href") == f"/_tooltap/turns/{first}/calls/1/result"
    assert _whole(page, link) == played["given"]

    # The server's page: the calls' arguments and results, the raw messages.
    server_page = f"{tooltap.url}/_tooltap/mcp/weather"
    page.goto(server_page)
    row = page.locator("[data-testid=mcp-calls] tr", has_text="get_alerts")
    assert json.loads(_whole(page, row.locator("[data-testid=call-arguments] a.clip-link"))) == {
        "state": played["state"]}
    page.goto(server_page)
    cell = page.locator("[data-testid=mcp-calls] tr", has_text="get_radar").locator("[data-testid=call-result]")
    assert cell.text_content().startswith(played["radar"][:300]) and "more characters not shown" in cell.text_content()
    assert _whole(page, cell.locator("a.clip-link")) == played["radar"]
    page.goto(server_page)
    links = page.locator("[data-testid=mcp-messages] a.clip-link")
    assert links.count() == 2  # the long call and the long answer; the rest are whole on the page
    raws = []
    for i in range(2):
        page.goto(server_page)
        raws.append(json.loads(_whole(page, page.locator("[data-testid=mcp-messages] a.clip-link").nth(i))))
    assert raws[0]["result"]["content"][0]["text"] == played["radar"]  # newest first
    assert raws[1]["params"]["arguments"]["state"] == played["state"]
    assert page.dialogs == []  # the captured <script> never ran


def test_an_unknown_mcp_text_is_a_clear_404(make_tooltap, upstream):
    tooltap = make_tooltap(upstream.url)
    with ThreadPoolExecutor(1) as pool:
        pool.submit(_play_long_mcp_texts, tooltap, upstream).result()
    by_method = {(m["method"], m["direction"]): m["id"] for m in tooltap.api("/mcp/messages")["messages"]}
    call, answer = by_method[("tools/call", "to_server")], by_method[("tools/call", "from_server")]
    initialize = by_method[("initialize", "to_server")]

    def get(path, **params):
        return httpx.get(f"{tooltap.url}/_tooltap/mcp/messages/{path}", params=params, timeout=10)

    for path, params, detail in [
            (f"{2**64}/raw", {}, f"no MCP message {2**64}"), ("0/result", {}, "no MCP message 0"),
            (f"{answer + 1000}/arguments", {}, f"no MCP message {answer + 1000}"),
            (f"{initialize}/arguments", {}, f"no tools/call request in MCP message {initialize}"),
            (f"{call}/result", {}, f"no answer in MCP message {call}"),
            (f"{call}/arguments", {"id": "12345"}, f"no tools/call request in MCP message {call} with id 12345"),
            (f"{call}/arguments", {"id": "not json"}, f"no tools/call request in MCP message {call} with id not json")]:
        r = get(path, **params)
        assert r.status_code == 404 and r.json() == {"detail": detail}, (path, params, r.text)
        assert r.headers["x-content-type-options"] == "nosniff"
    recent = tooltap.api("/mcp/servers/weather")["recent_calls"]
    for c in recent:  # the id the page names each call by picks it
        assert get(f"{c['message_id']}/arguments", id=json.dumps(c["jsonrpc_id"])).status_code == 200


def _weather_recorder(tooltap):
    from proxy.mcp.store import Connection, Recorder, new_id

    recorder = Recorder(f"sqlite:///{tooltap.db_path}", tooltap.db_path.parent / "mcp-spool")
    recorder.start()
    return recorder, Connection(new_id(), "stdio", name="weather")


def _send(recorder, conn, message: dict, at: float, direction: str = "to_server") -> None:
    recorder.record(conn, direction, json.dumps(message).encode(), at=at)


def test_a_message_s_raw_text_is_its_very_bytes(make_tooltap, upstream):
    """What crossed the wire, byte for byte: UTF-8 shown as text, anything else saved as
    bytes (it was decoded with U+FFFD in place of what it held)."""
    tooltap = make_tooltap(upstream.url)
    recorder, conn = _weather_recorder(tooltap)
    sent = [b'{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"read","arguments":{"p":"caf\xe9"}}}',
            '{"jsonrpc":"2.0","id":2,"method":"ping","params":{"p":"café"}}'.encode()]
    for raw in sent:
        recorder.record(conn, "to_server", raw, at=time.time())
    recorder.close()
    ids = sorted(m["id"] for m in tooltap.api("/mcp/messages")["messages"])
    bad, good = (httpx.get(f"{tooltap.url}/_tooltap/mcp/messages/{i}/raw", timeout=10) for i in ids)
    assert bad.content == sent[0] and bad.headers["content-type"] == "application/octet-stream"
    assert bad.headers["content-disposition"].startswith("attachment")
    assert good.content == sent[1] and good.headers["content-type"] == "text/plain; charset=utf-8"


def test_a_server_named_with_a_bidirectional_control_is_compared_by_its_name(make_tooltap, upstream, page):
    """The schemas page shows the name marked, and its form sends the name as stored: the
    two tool sets compare (the marks went back once, and no tool set had that name)."""
    from proxy.mcp.store import Connection, Recorder, new_id

    tooltap = make_tooltap(upstream.url)
    recorder = Recorder(f"sqlite:///{tooltap.db_path}", tooltap.db_path.parent / "mcp-spool")
    recorder.start()
    for n, tools in enumerate((["read"], ["read", "write"])):
        conn, at = Connection(new_id(), "stdio", name="files\u202eevil"), time.time() + n
        _send(recorder, conn, {"jsonrpc": "2.0", "id": 1, "method": "tools/list"}, at)
        _send(recorder, conn, {"jsonrpc": "2.0", "id": 1, "result": {"tools": [
            {"name": t, "inputSchema": {"type": "object"}} for t in tools]}}, at + 0.1, "from_server")
    recorder.close()
    page.goto(f"{tooltap.url}/_tooltap/schemas")
    names = page.locator("select[name=a] option").all_inner_texts()
    assert any("files⟨U+202E⟩evil" in n for n in names) and not any("\u202e" in n for n in names), names
    values = [v for v in page.locator("select[name=a] option").evaluate_all("os => os.map(o => o.value)")
              if v.startswith("mcp:")]
    assert sorted(values) == ["mcp:files\u202eevil@1", "mcp:files\u202eevil@2"], values
    r = httpx.get(f"{tooltap.url}/_tooltap/schemas", params={"a": values[0], "b": values[1]})
    assert r.status_code == 200 and "no tool set" not in r.text and "write" in r.text


def test_a_call_matched_by_arguments_must_be_due(make_tooltap, upstream, page):
    """The tester's case: an agent's own get_forecast (one turn, no turn after it) was drawn
    as an MCP call because another client sent the same tools/call 26 s later. With no next
    turn, an MCP call is the model call's only within DISPATCH_SECONDS of the answer's end;
    a call that is due is drawn as MCP, the card keeping the stored decoding's word."""
    from proxy.demo import chat_sse
    from proxy.mcp.correlate import DISPATCH_SECONDS
    from proxy.scripted import Reply

    assert 2 < DISPATCH_SECONDS < 26
    tooltap = make_tooltap(upstream.url)
    tool = {"type": "function", "function": {"name": "get_forecast", "parameters": {"type": "object"}}}
    asked = {"late": {"latitude": 1.5, "longitude": 2}, "due": {"latitude": 3.5, "longitude": 4}}
    upstream.routes["/chat/completions"] = [
        Reply.sse(chat_sse("m", [{"tool_calls": [{"index": 0, "id": f"call_{k}", "type": "function", "function": {
            "name": "get_forecast", "arguments": json.dumps(a)}}]}], finish="tool_calls")) for k, a in asked.items()]
    with httpx.Client(base_url=tooltap.url, timeout=30) as client:
        for session in asked:
            r = client.post("/chat/completions", headers={"x-tooltap-session": session}, json={
                "model": "m", "stream": True, "tools": [tool], "messages": [{"role": "user", "content": session}]})
            assert r.status_code == 200
    tooltap.flush()
    with sqlite3.connect(tooltap.db_path) as db:
        ends = dict(db.execute("SELECT session_id, started_at + duration_ms / 1000.0 FROM turns"))
        kinds = db.execute("SELECT DISTINCT kind FROM tool_calls_v").fetchall()
    assert kinds == [("builtin",)]  # the stored decoding: the name alone
    recorder, conn = _weather_recorder(tooltap)
    for i, (session, after) in enumerate([("late", 26.0), ("due", 2.0)], start=1):
        at = ends[session] + after
        _send(recorder, conn, {"jsonrpc": "2.0", "id": i, "method": "tools/call",
                               "params": {"name": "get_forecast", "arguments": asked[session]}}, at)
        _send(recorder, conn, {"jsonrpc": "2.0", "id": i, "result": {"content": [{"type": "text", "text": "ok"}]}},
              at + 0.1, "from_server")
    recorder.close()

    late = tooltap.api("/sessions/late")["turns"][0]["id"]
    assert [c["mcp"] for c in tooltap.api(f"/turns/{late}")["tool_calls"]] == [None]
    assert asked["late"] in [u["arguments"] for u in tooltap.api("/mcp/sessions/late")["unasked"]]
    page.goto(f"{tooltap.url}/_tooltap/sessions/late")
    card = page.locator("[data-testid=tool-call]")
    assert card.locator("[data-testid=call-name]").inner_text() == "get_forecast"
    assert card.locator(".call-head .tag").all_inner_texts() == ["builtin"]
    assert card.locator("[data-testid=mcp-chain]").count() == 0

    page.goto(f"{tooltap.url}/_tooltap/sessions/due")
    card = page.locator("[data-testid=tool-call]")
    assert card.locator("[data-testid=call-name]").inner_text() == "weather › get_forecast"
    assert card.locator(".call-head .tag").all_inner_texts() == ["builtin", "ran as MCP · matched by arguments"]
    assert card.locator("[data-testid=mcp-chain]").is_visible()

    # The server's page: the late call is nobody's.
    page.goto(f"{tooltap.url}/_tooltap/mcp/weather")
    rows = page.locator("[data-testid=mcp-calls] tbody tr")
    assert rows.count() == 2
    late_row = rows.filter(has_text="1.5")
    assert late_row.locator("[data-testid=unasked]").inner_text() == "no LLM turn asked for it"
    assert rows.filter(has_text="3.5").locator("[data-testid=unasked]").count() == 0


def test_a_server_with_no_answered_call_says_so(make_tooltap, upstream, page):
    """A server whose calls all wait for an answer: its page says there is no latency yet,
    not `median  ms, p95  ms`."""
    tooltap = make_tooltap(upstream.url)
    recorder, conn = _weather_recorder(tooltap)
    _send(recorder, conn, {"jsonrpc": "2.0", "id": 1, "method": "tools/call",
                           "params": {"name": "get_alerts", "arguments": {"state": "DC"}}}, time.time())
    recorder.close()
    page.goto(f"{tooltap.url}/_tooltap/mcp/weather")
    facts = page.locator("[data-testid=mcp-facts]").inner_text()
    assert "latency: no answered calls" in facts and " ms" not in facts, facts
    assert facts.startswith("1 message · 1 tools/call · 0 errors"), facts  # counted in words that agree
    assert page.locator("[data-testid=mcp-calls]").inner_text().count("no answer") == 1
    report = tooltap.api("/mcp/servers/weather")
    assert report["latency"] == {"count": 0, "median_ms": None, "p95_ms": None, "max_ms": None}


def test_mcp_addresses_that_name_nothing_are_error_pages_in_a_browser(make_tooltap, upstream, page):
    """Browser addresses that name nothing get the inspector's error page; the API keeps
    its JSON, and a `before` beyond 2^63-1 is the same readable 400 for MCP messages as
    for turns."""
    tooltap = make_tooltap(upstream.url)
    for path, status, detail in [
            ("/_tooltap/mcp/nonexistent", 404, "no MCP server nonexistent"),
            ("/_tooltap/mcp/messages/abc/raw", 422, "message_id='abc'"),
            ("/_tooltap/mcp/messages/7/raw", 404, "no MCP message 7"),
            ("/_tooltap/sessions/x", 404, "no session x"),
            ("/_tooltap/turns/abc", 422, "turn_id='abc'")]:
        response = page.goto(tooltap.url + path)
        assert response.status == status, path
        assert response.headers["content-type"].startswith("text/html"), path
        assert page.title() == f"{status} · tooltap" and detail in page.locator("main").inner_text(), path
    for path, status in [("/_tooltap/api/mcp/messages/abc", 422), ("/_tooltap/api/mcp/servers/nonexistent", 404)]:
        r = httpx.get(tooltap.url + path, headers={"accept": "text/html"}, timeout=10)
        assert r.status_code == status and r.headers["content-type"] == "application/json", path
    huge = 99999999999999999999
    for what in ("turns", "mcp/messages"):
        r = httpx.get(f"{tooltap.url}/_tooltap/api/{what}", params={"before": huge}, timeout=10)
        assert (r.status_code, r.json()) == (400, {"detail": f"before={huge}: ids stop at 2^63-1"}), what


def test_a_server_named_with_a_slash_has_its_page(make_tooltap, upstream, page):
    """The reference server calls itself `example-servers/everything`: the servers page
    links to its page, which shows it, and the JSON API answers for it (all were 404)."""
    from proxy.mcp.store import Connection, Recorder, new_id

    tooltap = make_tooltap(upstream.url)
    recorder = Recorder(f"sqlite:///{tooltap.db_path}", tooltap.db_path.parent / "mcp-spool")
    recorder.start()
    conn = Connection(new_id(), "stdio", name="example-servers/everything")
    _send(recorder, conn, {"jsonrpc": "2.0", "id": 1, "method": "tools/call",
                           "params": {"name": "echo", "arguments": {"message": "hi"}}}, time.time())
    recorder.close()
    page.goto(f"{tooltap.url}/_tooltap/mcp")
    page.get_by_role("link", name="example-servers/everything").click()
    page.wait_for_load_state()
    assert page.url.endswith("/_tooltap/mcp/example-servers%2Feverything")
    assert "example-servers/everything" in page.locator("h1").inner_text()
    assert page.locator("[data-testid=mcp-calls]").inner_text().count("echo") == 1
    assert tooltap.api("/mcp/servers/example-servers%2Feverything")["name"] == "example-servers/everything"
    with page.expect_response(lambda r: "/api/mcp/servers/" in r.url) as answer:
        page.get_by_role("link", name="JSON", exact=True).click()
    assert answer.value.status == 200
