"""The inspector's pages and queries over real HTTP: content, headers, search, filters,
pagination at 10,000 sessions, the UI token."""

from __future__ import annotations

import json
import re
import sqlite3
import time

import httpx
import pytest
from sqlalchemy import insert, text
from sqlmodel import Session as DB

from inspector_ui.queries import Filters, Queries
from proxy.store.db import make_engine, migrate
from proxy.store.models import Session
from proxy.scripted import Reply
from proxy.store.read import Reader
from tests.test_proxy_e2e import play_cline


def get(tooltap, path, **kw):
    tooltap.flush()
    return httpx.get(tooltap.url + path, timeout=10, **kw)


@pytest.fixture
def cline(tooltap, upstream):
    play_cline(tooltap, upstream)
    tooltap.flush()
    return tooltap.api("/sessions")["sessions"][0]["id"]


def test_every_inspector_response_has_csp_and_nosniff(tooltap, cline):
    for path in ["/_tooltap/", f"/_tooltap/sessions/{cline}", "/_tooltap/turns/1", "/_tooltap/api/sessions",
                 "/_tooltap/api/turns/1/raw", "/_tooltap/static/app.js", "/_tooltap/nope",
                 "/_tooltap/sessions/nope"]:
        r = get(tooltap, path)
        csp = r.headers["content-security-policy"]
        assert "default-src 'self'" in csp and "script-src 'self'" in csp and "unsafe-inline" not in csp, path
        assert r.headers["x-content-type-options"] == "nosniff", path


def test_session_page_shows_the_decoded_transcript(tooltap, cline):
    html = get(tooltap, f"/_tooltap/sessions/{cline}").text
    assert "weather › get_forecast" in html
    assert "cIya4J0mcp0get_forecast" in html  # the raw name beside the decoded one
    assert "2/4" in html and "checked now" in html
    assert "华盛顿明天天气如何？" in html
    assert "[read_file for &#39;/Users/zhongziqiang/code/weather/weather.py&#39;] Result" in html
    assert html.count("tool message: “result missing”") == 3
    assert "undeclared_parameter" in html  # task_progress leaked into the MCP call
    assert html.count('class="seg-title">task<') == 1
    assert html.count("system prompt") == 1  # shown once: it never changes in this session
    # Cline's OpenAI-compatible path keeps its 11 KB prompt as the leading system message.
    assert "system prompt · 11,220 chars" in html and "You are Cline, a highly skilled" in html
    assert "<svg" in html and "polyline" in html


def test_turn_page_tools_page_download_and_curl(tooltap, cline):
    html = get(tooltap, "/_tooltap/turns/3").text
    assert "call_00_k1cxcyyiAm1wUwdnNTmPjs3q" in html
    assert "Bearer $API_KEY" in html and "sk-cline-secret" not in html
    assert "Bearer …cdef#" in html  # the header's fingerprint
    assert "written out from the stored values" in html  # a JSON body is not the bytes sent
    assert re.search(r"\d+ chunks? over", html)
    r = get(tooltap, "/_tooltap/turns/3/download")
    assert "attachment" in r.headers["content-disposition"]
    assert r.json()["tool_calls"][0]["name"] == "cIya4J0mcp0get_forecast"
    tools = get(tooltap, f"/_tooltap/sessions/{cline}/tools").text
    assert "cIya4J0mcp0get_forecast" in tools and "weather › get_forecast" in tools
    assert "weather › get_alerts" in tools  # offered, never called: decoded from its description
    decoded = dict(re.findall(r"<code>(\w+)</code></a>.*?</td>\s*<td>(.*?)</td>", tools, re.S))
    assert decoded["cIya4J0mcp0get_forecast"] == "weather › get_forecast"  # called
    assert decoded["cIya4J0mcp0get_alerts"] == "weather › get_alerts"  # never called
    assert decoded["list_files"] == decoded["write_to_file"] == ""  # a built-in, called or not
    assert "parameters schema" in tools


def test_tools_page_decodes_an_mcp_tool_offered_but_never_called(tooltap, upstream):
    """Claude Code's `mcp__<server>__<tool>` names: the decoded column is the same whether
    the model called the tool or not."""
    call = {"id": "call_1", "type": "function", "function": {"name": "mcp__github__create_issue", "arguments": "{}"}}
    upstream.routes["/chat/completions"] = Reply.json({"id": "c", "object": "chat.completion", "choices": [{
        "index": 0, "finish_reason": "tool_calls", "message": {"role": "assistant", "tool_calls": [call]}}]})
    tools = [{"type": "function", "function": {"name": n, "parameters": {"type": "object"}}}
             for n in ("mcp__github__create_issue", "mcp__github__list_issues", "Bash")]
    httpx.post(tooltap.url + "/chat/completions",
               json={"model": "m", "messages": [{"role": "user", "content": "file it"}], "tools": tools})
    (s,) = tooltap.api("/sessions")["sessions"]
    html = get(tooltap, f"/_tooltap/sessions/{s['id']}/tools").text
    decoded = dict(re.findall(r"<code>(\w+)</code></a>.*?</td>\s*<td>(.*?)</td>", html, re.S))
    assert decoded == {"mcp__github__create_issue": "github › create_issue",  # called
                       "mcp__github__list_issues": "github › list_issues", "Bash": ""}


def test_search_and_filters(tooltap, cline):
    def titles(query):
        return [s["title"] for s in get(tooltap, "/_tooltap/api/search", params=query).json()["sessions"]]

    assert titles({"q": "38.9072"}) == ["华盛顿明天天气如何？"]  # a tool argument
    assert titles({"q": "Patchy fog"}) == ["华盛顿明天天气如何？"]  # a tool result
    assert titles({"q": "VISUAL STUDIO CODE"}) == ["华盛顿明天天气如何？"]  # messages, any case
    assert titles({"q": "no such words anywhere"}) == []
    assert titles({"server": "weather"}) == ["华盛顿明天天气如何？"]
    assert titles({"server": "other"}) == []
    assert titles({"tool": "get_forecast", "model": "deepseek-chat"}) == ["华盛顿明天天气如何？"]
    assert titles({"model": "gpt-5"}) == []
    assert titles({"status": "errors"}) == []
    assert titles({"since": "2000-01-01"}) == ["华盛顿明天天气如何？"]
    assert titles({"until": "2000-01-01"}) == []
    html = get(tooltap, "/_tooltap/", params={"q": "38.9072"}).text
    assert "matched in tool arguments" in html
    assert '<span data-testid="matching">1 matching</span>' in html  # beside the count stored
    assert "matching" not in get(tooltap, "/_tooltap/").text  # no filter, nothing to count


def test_live_endpoint_streams_hub_events(tooltap, upstream):
    from proxy.scripted import Reply

    upstream.routes["/chat/completions"] = Reply.sse(
        b'data: {"id":"x","object":"chat.completion.chunk","model":"m","choices":[{"index":0,'
        b'"delta":{"content":"hello"},"finish_reason":"stop"}]}\n\ndata: [DONE]\n\n')
    seen = []
    with httpx.stream("GET", tooltap.url + "/_tooltap/api/live", timeout=10) as r:
        assert r.headers["content-type"].startswith("text/event-stream")
        assert r.headers["content-security-policy"]
        lines = r.iter_lines()
        assert next(lines) == "event: hello"
        httpx.post(tooltap.url + "/chat/completions", json={"model": "m", "stream": True,
                                                            "messages": [{"role": "user", "content": "hi"}]})
        for line in lines:
            if line.startswith("event: "):
                seen.append(line[7:])
            if line.startswith("data: ") and seen and seen[-1] == "turn_stored":
                assert json.loads(line[6:])["session_id"]
                break
    assert seen[0] == "turn_started" and seen[-1] == "turn_stored" and "turn_finished" in seen


def test_token_refuses_page_api_live_and_static(make_tooltap, upstream):
    tt = make_tooltap(upstream.url, ui_token="s3cret-token")
    for path in ["/_tooltap/", "/_tooltap/api/sessions", "/_tooltap/api/live", "/_tooltap/static/app.js",
                 "/_tooltap/turns/1"]:
        r = httpx.get(tt.url + path, timeout=5)
        assert r.status_code == 401, path
        assert r.headers["content-security-policy"]
        assert r.text == ("tooltap: this inspector needs its UI token: open a page once with ?token=..., "
                          "or send Authorization: Bearer ...\n")
        r = httpx.get(tt.url + path, headers={"authorization": "Bearer wrong"}, timeout=5)
        assert r.status_code == 401, path
    assert httpx.get(tt.url + "/_tooltap/api/sessions", headers={"authorization": "Bearer s3cret-token"}).status_code == 200
    # ?token= trades itself for a cookie and leaves the address bar.
    with httpx.Client(base_url=tt.url, timeout=5) as c:
        r = c.get("/_tooltap/?token=s3cret-token&q=x")
        assert r.status_code == 303 and r.headers["location"] == "/_tooltap/?q=x"
        assert "HttpOnly" in r.headers["set-cookie"] and "SameSite=Strict" in r.headers["set-cookie"]
        assert c.get("/_tooltap/").status_code == 200
        assert c.get("/_tooltap/api/sessions").status_code == 200


def test_the_empty_mcp_page_gives_the_wrapper_command_for_this_database(tooltap):
    """Copied as is into an agent's MCP settings, the command records into this database."""
    html = get(tooltap, "/_tooltap/mcp").text
    assert "No MCP traffic recorded yet" in html
    assert f"<code>tooltap mcp --db {tooltap.db_path.resolve()} --</code>" in html


def test_head_answers_every_inspector_get_with_its_head_only(tooltap, cline, upstream):
    """Link checkers, monitors and `curl -I` ask HEAD: the status and headers GET gets,
    no body. On one kept-alive connection: a stray body would garble the next answer."""
    paths = ["/_tooltap/", "/_tooltap/?q=38.9072", f"/_tooltap/sessions/{cline}", f"/_tooltap/sessions/{cline}/tools",
             "/_tooltap/turns/3", "/_tooltap/turns/3/download", "/_tooltap/schemas", "/_tooltap/mcp",
             "/_tooltap/api/sessions", "/_tooltap/api/turns/3", "/_tooltap/api/turns/3/raw", "/_tooltap/api/stats",
             "/_tooltap/api/health", "/_tooltap/api/openapi.json", "/_tooltap/static/app.js",
             "/_tooltap/turns/999", "/_tooltap/turns/abc", "/_tooltap/nope"]
    with httpx.Client(base_url=tooltap.url, timeout=10) as c:
        for path in paths:
            for accept in ("text/html", "*/*"):  # errors answer a page or JSON
                g = c.get(path, headers={"accept": accept})
                h = c.head(path, headers={"accept": accept})
                assert h.status_code == g.status_code != 405, (path, accept)
                assert h.headers.multi_items() == g.headers.multi_items(), (path, accept)
                assert h.content == b"", path
        # The live stream, endless as a GET, answers its head at once...
        h = c.head("/_tooltap/api/live", timeout=5)
        assert h.status_code == 200 and h.headers["content-type"].startswith("text/event-stream")
        assert h.headers["content-security-policy"] and h.content == b""
        assert c.get("/_tooltap/api/health").status_code == 200  # the connection is still sound
    # ... and leaves nobody watching: the forwarded path does no live work for it.
    deadline = time.monotonic() + 5
    while tooltap.app.live.watched and time.monotonic() < deadline:
        time.sleep(0.02)
    assert not tooltap.app.live.watched
    # A HEAD outside /_tooltap/ is the upstream's, forwarded as it came.
    upstream.routes["/v1/models"] = Reply.json({"object": "list", "data": []})
    r = httpx.head(tooltap.url + "/v1/models", timeout=10)
    assert r.status_code == 200 and r.content == b""
    assert upstream.received[-1].method == "HEAD" and upstream.received[-1].path == "/v1/models"


def live_starts(tooltap, send, turns: int) -> list[dict]:
    """The `turn_started` events the live view gets while `send()` makes `turns` turns."""
    starts, stored, event = [], 0, None
    with httpx.stream("GET", tooltap.url + "/_tooltap/api/live", timeout=10) as r:
        lines = r.iter_lines()
        assert next(lines) == "event: hello"
        send()
        for line in lines:
            if line.startswith("event: "):
                event = line[7:]
            elif line.startswith("data: ") and event == "turn_started":
                starts.append(json.loads(line[6:]))
            elif line.startswith("data: ") and event == "turn_stored":
                stored += 1
                if stored == turns:
                    break
    return starts


def test_the_live_view_names_the_model_of_a_json_answer_from_its_request(tooltap, upstream):
    """A stream names its model as it comes (turn_growing); a JSON answer has no such
    events, so its start names the model its request does: the body's `model` (last in
    the body, as the OpenAI SDK sends it), or Gemini's path."""
    upstream.routes["/chat/completions"] = Reply.json({"id": "c", "object": "chat.completion", "choices": [{
        "index": 0, "finish_reason": "stop", "message": {"role": "assistant", "content": "hi"}}]})
    gemini = "/v1beta/models/gemini-2.5-flash:generateContent"
    upstream.routes[gemini] = Reply.json({"candidates": [{"content": {"role": "model", "parts": [{"text": "hi"}]}}]})

    def send():
        httpx.post(tooltap.url + "/chat/completions", timeout=10,
                   json={"messages": [{"role": "user", "content": "model?"}], "model": "json-model"})
        httpx.post(tooltap.url + gemini + "?key=k", timeout=10,
                   json={"contents": [{"role": "user", "parts": [{"text": "model?"}]}]})

    starts = live_starts(tooltap, send, 2)
    assert [(s["stream"], s["model"]) for s in starts] == [(False, "json-model"), (False, "gemini-2.5-flash")]


# -- 10,000 sessions ------------------------------------------------------------------------

@pytest.fixture(scope="module")
def many(tmp_path_factory):
    url = f"sqlite:///{tmp_path_factory.mktemp('many')}/many.db"
    engine = make_engine(url)
    migrate(engine)
    rows = [{"id": f"s{i:05d}", "title": f"session {i}", "agent": "generic", "started_at": 1_700_000_000 + i,
             "last_at": 1_700_000_000 + i // 2,  # pairs share last_at: the cursor must break ties
             "turns": 1, "tool_calls": 0, "input_tokens": 0, "output_tokens": 0, "errors": i % 7 == 0,
             "models": ["m-a" if i % 2 else "m-b"]} for i in range(10_000)]
    with engine.begin() as conn:
        conn.execute(insert(Session.__table__), rows)
    return Queries(Reader(engine))


def test_keyset_pages_walk_10k_sessions_exactly_once(many):
    seen, cursor, pages = [], None, 0
    while True:
        page = many.sessions_page(Filters(), cursor, limit=500)
        seen += [s["id"] for s in page.sessions]
        pages += 1
        if not page.next_cursor:
            break
        cursor = page.next_cursor
    assert len(seen) == 10_000 == len(set(seen)) and pages == 20
    assert seen[0] == "s09998" and seen[1] == "s09999"  # newest first, ties by id


def test_deep_page_is_as_fast_as_the_first(many):
    first = many.sessions_page(Filters(), None)
    deep_cursor = None
    for _ in range(3):
        deep_cursor = many.sessions_page(Filters(), deep_cursor, limit=3000).next_cursor
    timings = {}
    for name, cursor in (("first", None), ("deep", deep_cursor)):
        start = time.perf_counter()
        for _ in range(20):
            page = many.sessions_page(Filters(), cursor)
        timings[name] = (time.perf_counter() - start) / 20
        assert len(page.sessions) == 50
    print(f"\nsessions page at 10,000 sessions: first {timings['first'] * 1000:.2f} ms, "
          f"after 9,000 rows {timings['deep'] * 1000:.2f} ms")
    assert timings["deep"] < 0.25  # generous: it is ~1 ms on a laptop
    assert first.sessions[0]["id"] == "s09998"


def test_page_query_uses_the_last_at_index(many):
    stmt = many.page_statement(Filters(), "1700004000.0~s08000", 51)
    sql = str(stmt.compile(many.engine, compile_kwargs={"literal_binds": True}))
    with DB(many.engine) as db:
        plan = " ".join(str(row[-1]) for row in db.exec(text("EXPLAIN QUERY PLAN " + sql)))
    assert "ix_sessions_last_at" in plan, plan


def test_filters_on_many(many):
    page = many.sessions_page(Filters(status="errors", model="m-a"), None, limit=10_000)
    ids = [int(s["id"][1:]) for s in page.sessions]
    assert ids and all(i % 7 == 0 and i % 2 == 1 for i in ids)
    assert len(ids) == len([i for i in range(10_000) if i % 7 == 0 and i % 2 == 1])


def test_the_model_filter_matches_a_whole_name_however_it_was_stored(tmp_path):
    """Non-ASCII names are stored as they are by the writer (orjson) and escaped in older
    rows (json.dumps): both match. A name matches whole and in its case: gpt-4 is neither
    gpt-4o nor GPT-4."""
    engine = make_engine(f"sqlite:///{tmp_path / 'models.db'}")
    migrate(engine)
    base = {"title": "t", "agent": "generic", "started_at": 1.0, "last_at": 1.0, "turns": 1, "tool_calls": 0,
            "input_tokens": 0, "output_tokens": 0, "errors": 0}
    with engine.begin() as conn:
        conn.execute(insert(Session.__table__), [{**base, "id": "new", "models": ["modèle-ü"]},
                                                 {**base, "id": "4o", "models": ["gpt-4o"]},
                                                 {**base, "id": "4", "models": ["gpt-4", "other"]},
                                                 {**base, "id": "G4", "models": ["GPT-4"]}])
        conn.execute(text("INSERT INTO sessions (id, title, agent, started_at, last_at, turns, tool_calls, "
                          "input_tokens, output_tokens, errors, models) VALUES ('old', 't', 'generic', 1, 1, 1, 0, "
                          "0, 0, 0, :m)"), {"m": json.dumps(["modèle-ü"])})
    queries = Queries(Reader(engine))

    def ids(model):
        return sorted(s["id"] for s in queries.sessions_page(Filters(model=model), None).sessions)

    assert ids("modèle-ü") == ["new", "old"]
    assert ids("gpt-4") == ["4"] and ids("gpt-4o") == ["4o"] and ids("GPT-4") == ["G4"]  # as on Postgres


def test_schemas_page_compares_two_stored_tool_sets(tooltap, cline):
    html = get(tooltap, "/_tooltap/schemas", params={"a": "turn:1", "b": "turn:3"}).text
    assert "0 breaking</b> of 0 changes" in html and "15 unchanged" in html
    assert "cIya4J0mcp0get_forecast" in html and "gemini" in html
    assert "weather › get_forecast" in html  # decoded beside the raw name
    label = re.search(r'<option value="turn:1"[^>]*>([^<]+)</option>', html).group(1)
    assert re.fullmatch(r"turn #1 · deepseek-chat · 15 tools · session \w+ · \d{4}-\d\d-\d\d \d\d:\d\d:\d\d\.\d+",
                        label), label  # times as every page writes them
    assert get(tooltap, "/_tooltap/schemas", params={"a": "turn:1", "b": "turn:99"}).status_code == 200


def selected(html, name):
    """(value, label) of the chosen options of the schemas page's select `name`."""
    select = re.search(rf'<select name="{name}">(.*?)</select>', html, re.S).group(1)
    return re.findall(r'<option value="([^"]*)" selected>([^<]*)</option>', select)


def test_schemas_page_selects_what_its_address_compares(tooltap, cline):
    """A source the lists do not hold (a missing turn, a session's offer) is still the one
    selected: "compare" must not fall back to the first turn silently."""
    html = get(tooltap, "/_tooltap/schemas", params={"a": "turn:999", "b": "turn:3"}).text
    assert "turn:999: not found" in html
    assert selected(html, "a") == [("turn:999", "turn:999")]
    assert [v for v, _ in selected(html, "b")] == ["turn:3"]
    html = get(tooltap, "/_tooltap/schemas", params={"a": "turn:1", "b": f"session:<b>{cline}"}).text
    assert [v for v, _ in selected(html, "a")] == ["turn:1"]
    assert selected(html, "b") == [(f"session:&lt;b&gt;{cline}", f"session:&lt;b&gt;{cline}")]  # escaped


def test_schemas_page_labels_a_source_it_does_not_list_as_it_labels_its_own(tooltap, cline):
    """A later turn of a tool set, a session's newest tools, a session's offer of an MCP
    server's tools: selected by the value the address gave, named in the lists' words."""
    ids = [t["id"] for t in tooltap.api(f"/sessions/{cline}")["turns"]]
    when = r"\d{4}-\d\d-\d\d \d\d:\d\d:\d\d\.\d+"
    html = get(tooltap, "/_tooltap/schemas", params={"a": f"turn:{ids[1]}", "b": f"mcp:weather@session:{cline}"}).text
    assert 'data-testid="diff-summary"' in html  # both found, compared
    listed = re.findall(r'<option value="([^"]*)"', "".join(re.findall(r"<optgroup.*?</optgroup>", html, re.S)))
    ((value, label),) = selected(html, "a")
    assert value == f"turn:{ids[1]}" and value not in listed
    assert re.fullmatch(rf"turn #{ids[1]} · deepseek-chat · 15 tools · session {cline} · {when}", label), label
    assert selected(html, "b") == [(f"mcp:weather@session:{cline}",
                                    f"MCP weather · as offered in session {cline} · 2 tools")]
    html = get(tooltap, "/_tooltap/schemas", params={"a": f"session:{cline}", "b": "mcp:weather"}).text
    ((_, label),) = selected(html, "a")
    assert re.fullmatch(rf"the session&#39;s newest: turn #{ids[-1]} · deepseek-chat · 15 tools · "
                        rf"session {cline} · {when}", label), label
    # No tools/list of weather recorded: named as given (and the page says why it compares nothing).
    assert selected(html, "b") == [("mcp:weather", "mcp:weather")] and "no tools/list answer" in html


def test_inspector_refuses_foreign_host_names_without_a_token(tooltap, upstream):
    """DNS rebinding: a page whose own name resolves to 127.0.0.1 must not read turns."""
    ok = httpx.get(f"{tooltap.url}/_tooltap/api/turns")
    assert ok.status_code == 200
    r = httpx.get(f"{tooltap.url}/_tooltap/api/turns", headers={"host": "attacker.example"})
    assert r.status_code == 421
    page = httpx.get(f"{tooltap.url}/_tooltap/", headers={"host": "attacker.example:8000"})
    assert page.status_code == 421


REBINDING_HOSTS = [
    "127.0.0.1.attacker.example", "127.0.0.1.attacker.example:8000", "127.attacker.example",
    "127.0.0.1.nip.io", "localhost.attacker.example", "localhost.attacker.example:8000",
    "attacker-localhost", "xlocalhost", "127.0.0.1:8000@attacker.example",
    "127.0.0.1:8000.attacker.example", "127.0.0.1:80:81", "[::1].attacker.example",
    "[::1]x", "[fe80::1]", "[::ffff:10.0.0.1]", "0.0.0.0", "10.0.0.1", "192.168.1.10",
    "2130706433", "0x7f000001", "127.1", "", "evil.com", "LOCALHOST.evil.com",
]
LOOPBACK_HOSTS = ["127.0.0.1", "127.0.0.1:8000", "127.9.8.7:1", "localhost", "LocalHost:8000",
                  "[::1]", "[::1]:8000", "[::ffff:127.0.0.1]:8000"]


def test_only_exact_loopback_hosts_reach_an_untokened_inspector(tooltap, cline):
    for host in REBINDING_HOSTS:
        r = httpx.get(f"{tooltap.url}/_tooltap/api/turns", headers={"host": host})
        assert r.status_code == 421 and "华盛顿" not in r.text, host
    for host in LOOPBACK_HOSTS:
        r = httpx.get(f"{tooltap.url}/_tooltap/api/turns", headers={"host": host})
        assert r.status_code == 200 and r.json()["turns"], host


def test_captured_html_is_served_as_text_and_curl_is_inert(tooltap, upstream):
    import shlex
    import subprocess

    upstream.routes["/page"] = Reply(200, [("content-type", "text/html")], [b"<script>alert(1)</script>"])
    httpx.post(f"{tooltap.url}/page", content=b"hi\nTOOLTAP_EOF\ntouch /tmp/tooltap-pwned\n",
               headers={"content-type": "text/plain"})
    turn_id = tooltap.api("/turns")["turns"][0]["id"]
    raw = httpx.get(f"{tooltap.url}/_tooltap/api/turns/{turn_id}/raw")
    assert raw.headers["content-type"].startswith("text/plain")
    assert raw.headers["x-tooltap-content-type"] == "text/html"
    from inspector_ui.curl import as_curl

    command = as_curl(tooltap.api(f"/turns/{turn_id}"), tooltap.url)
    assert command.startswith(f"curl -sS -X POST {tooltap.url}/page")
    # The shell sees one quoted argument: parsing it runs nothing.
    words = shlex.split(command.replace("\\\n", " "))
    assert words[-1] == "hi\nTOOLTAP_EOF\ntouch /tmp/tooltap-pwned\n" and words[-2] == "--data-binary"
    assert "written out from the stored values" not in get(tooltap, f"/_tooltap/turns/{turn_id}").text  # as sent
    subprocess.run(["bash", "-n", "-c", command], check=True)


def test_system_prompt_text_in_every_api_form():
    from inspector_ui.transcript import system_text

    assert system_text([{"role": "system", "content": "be brief"},
                        {"role": "developer", "content": [{"type": "text", "text": "use tools"}]}]) == \
        "be brief\n\nuse tools"  # OpenAI chat: the leading system/developer messages
    assert system_text({"parts": [{"text": "be brief"}]}) == "be brief"  # Gemini systemInstruction
    assert system_text([{"type": "text", "text": "be brief"}]) == "be brief"  # Anthropic blocks
    assert system_text("be brief") == "be brief"


def test_upstream_errors_show_their_message_and_the_list_shows_the_status(tooltap, upstream):
    upstream.routes["/chat/completions"] = Reply.json(
        {"error": {"message": "Rate limit reached for <deepseek-chat>", "type": "rate_limit"}}, status=429)
    r = httpx.post(tooltap.url + "/chat/completions",
                   json={"model": "m", "messages": [{"role": "user", "content": "hi"}]})
    assert r.status_code == 429
    turn = tooltap.api("/turns")["turns"][0]
    html = get(tooltap, f"/_tooltap/sessions/{turn['session_id']}").text
    assert html.count("Rate limit reached for &lt;deepseek-chat&gt;") == 1  # its box, not the notes' too
    head = html.split('id="session-head"')[1].split("</section>")[0]
    assert "no usage reported" in head and "out tokens" not in head  # not "0 in / 0 out"
    assert "429 from the upstream: Rate limit reached for &lt;deepseek-chat&gt;" in html
    # where a query for what went wrong looks: the API's turn and the SQL view
    stored = tooltap.api(f"/turns/{turn['id']}")
    assert stored["error"] == "429 from the upstream: Rate limit reached for <deepseek-chat>"
    with sqlite3.connect(tooltap.db_path) as db:
        assert db.execute("select error from turns_v where id = ?", (turn["id"],)).fetchone() == (stored["error"],)
    row = get(tooltap, "/_tooltap/").text.split(f'data-session="{turn["session_id"]}"')[1].split("</tr>")[0]
    assert "st-upstream_error" in row

    def found(status):
        r = get(tooltap, "/_tooltap/api/search", params={"status": status}).json()
        return [x["id"] for x in r["sessions"]], r["note"]

    assert found("upstream_error") == ([turn["session_id"]], None)  # a session with a turn of it
    assert found("client_aborted") == ([], None)
    ids, note = found("failed")  # not a status: said, and not applied
    assert ids == [turn["session_id"]] and note.startswith("no status 'failed' (not applied): use ok, errors,")
    assert "no status &#39;failed&#39;" in get(tooltap, "/_tooltap/", params={"status": "failed"}).text


def test_a_first_request_sent_again_is_marked_as_starting_over(tooltap, upstream):
    upstream.routes["/chat/completions"] = Reply.json(
        {"id": "c", "object": "chat.completion", "created": 1, "model": "m",
         "choices": [{"index": 0, "message": {"role": "assistant", "content": "hello"}, "finish_reason": "stop"}]})
    for _ in range(3):
        httpx.post(tooltap.url + "/chat/completions", json={"model": "m", "messages": [
            {"role": "user", "content": "the same question, asked three times"}]}).raise_for_status()
    turns = tooltap.api("/turns")["turns"]
    assert len({t["session_id"] for t in turns}) == 1 and {t["parent_id"] for t in turns} == {None}
    html = get(tooltap, f"/_tooltap/sessions/{turns[0]['session_id']}").text
    cards = html.split('class="turn-no"')[1:]
    assert ["starts over" in card.split("</header>")[0] for card in cards] == [False, True, True]


def test_a_tool_call_whose_turn_no_later_turn_continues_says_its_result_will_not_come(tooltap, upstream):
    upstream.routes["/chat/completions"] = Reply.json(
        {"id": "c", "object": "chat.completion", "created": 1, "model": "m",
         "choices": [{"index": 0, "finish_reason": "tool_calls", "message": {"role": "assistant", "tool_calls": [
             {"id": "call_1", "type": "function", "function": {"name": "ls", "arguments": "{}"}}]}}]})
    for _ in range(2):  # the same first request again: the second starts over
        httpx.post(tooltap.url + "/chat/completions", json={"model": "m", "messages": [
            {"role": "user", "content": "list the files"}]}).raise_for_status()
    first, second = sorted(t["id"] for t in tooltap.api("/turns")["turns"])
    session = tooltap.api(f"/turns/{first}")["session_id"]
    cards = get(tooltap, f"/_tooltap/sessions/{session}").text.split('class="turn-no"')[1:]
    assert "no result: no later turn continues this one" in cards[0]
    assert "no result (yet): it comes with the turn that continues this one" in cards[1]  # the last: it may
    fragment = get(tooltap, f"/_tooltap/fragments/turn/{first}").text
    assert "no later turn continues this one" in fragment


def test_a_one_turn_session_charts_dots_and_every_page_writes_its_times_alike(tooltap, upstream):
    upstream.routes["/chat/completions"] = Reply.json(
        {"id": "c", "object": "chat.completion", "created": 1, "model": "m",
         "choices": [{"index": 0, "message": {"role": "assistant", "content": "hello"}, "finish_reason": "stop"}],
         "usage": {"prompt_tokens": 5, "completion_tokens": 1, "total_tokens": 6}})
    httpx.post(tooltap.url + "/chat/completions", json={"model": "m", "messages": [{"role": "user", "content": "hi"}]})
    turn = tooltap.api("/turns")["turns"][0]
    session = get(tooltap, f"/_tooltap/sessions/{turn['session_id']}").text
    chart = session.split("<figure")[1].split("</figure>")[0]
    # One point makes no line: a dot, and the key says so.
    assert "<polyline" not in chart and 'class="dot-total"' in chart
    assert '<span class="key k-total">●</span> total latency' in chart
    assert "<b>1</b> turn</span>" in session and "<b>0</b> errors</span>" in session
    pages = [session, get(tooltap, "/_tooltap/").text, get(tooltap, f"/_tooltap/turns/{turn['id']}").text]
    assert "<code>prompt_tokens 5 · completion_tokens 1 · total_tokens 6</code>" in pages[2]  # not raw JSON
    times = [re.findall(r'<time datetime="([^"]+)"[^>]*>([^<]+)</time>', html) for html in pages]
    assert all(times), times
    for stamp, shown in sum(times, []):
        assert stamp == turn["started_at"] and shown == stamp.replace("T", " ").removesuffix("Z"), (stamp, shown)


def test_the_schemas_page_without_tool_sets_says_how_to_get_some(tooltap):
    html = get(tooltap, "/_tooltap/schemas").text
    assert "No tool sets stored yet" in html and "tooltap schemas diff" in html
    assert "<select" not in html  # no choice to offer


def test_the_schemas_page_with_one_tool_set_says_what_it_waits_for(tooltap, upstream):
    upstream.routes["/chat/completions"] = Reply.json({"id": "c", "object": "chat.completion", "choices": []})
    tool = {"type": "function", "function": {"name": "ls", "parameters": {"type": "object"}}}
    httpx.post(tooltap.url + "/chat/completions",
               json={"model": "m", "messages": [{"role": "user", "content": "hi"}], "tools": [tool]})
    html = get(tooltap, "/_tooltap/schemas").text
    turn = tooltap.api("/turns")["turns"][0]["id"]
    assert "One tool set stored so far" in html and f"tooltap schemas diff turn:{turn} after.json" in html


def test_a_long_sessions_chart_draws_a_bar_per_run_of_turns():
    from inspector_ui.transcript import MAX_BARS, chart

    views = [{"id": 1000 + i, "n": 1 + i, "tokens_in": 100 + i, "tokens_out": 10, "ttft_ms": 5.0,
              "duration_ms": 50.0 + i} for i in range(3 * MAX_BARS + 7)]
    c = chart(views)
    assert 0 < len(c["bars"]) <= MAX_BARS
    # Named by their places in the session; the bar links to the first by its id.
    assert c["bars"][0]["id"] == 1000 and c["bars"][0]["tip"].startswith("turns 1-4 (mean): 102 in, 10 out")
    last_run = views[len(views) // 4 * 4:]  # runs of 4: the last one has the 3 turns left
    assert c["max_tok"] == round(sum(v["tokens_in"] for v in last_run) / len(last_run)) + 10
    assert len(chart(views[:MAX_BARS])["bars"]) == MAX_BARS  # short sessions: one bar a turn


def test_usage_reads_as_one_line_with_nested_counts_by_their_path():
    from inspector_ui.pages import usage_line

    usage = {"input_tokens": 1200, "output_tokens": 9, "cache_read_input_tokens": None,
             "prompt_tokens_details": {"cached_tokens": 1024}, "service_tier": "<b>standard</b>"}
    assert usage_line(usage) == ("input_tokens 1,200 · output_tokens 9 · prompt_tokens_details.cached_tokens 1,024"
                                 " · service_tier <b>standard</b>")  # escaped by the template, as all text
    assert usage_line([1, 2]) == "[1, 2]"


def test_a_chart_without_token_counts_draws_no_token_axis():
    from inspector_ui.transcript import chart

    views = [{"id": 7 + i, "n": 1 + i, "tokens_in": None, "tokens_out": None, "ttft_ms": 5.0,
              "duration_ms": 50.0} for i in range(3)]
    c = chart(views)
    assert c["max_tok"] is None and "no token counts" in c["bars"][0]["tip"]  # was an axis of "1 tok"
    views[1]["tokens_out"] = 12
    assert chart(views)["max_tok"] == 12


def test_the_filter_choices_refresh_without_holding_a_page(many, monkeypatch):
    """Working the choices out reads every turn and tool call (seconds at a million
    turns): once known, a stale list is served at once and refreshed on a thread."""
    import inspector_ui.queries as queries

    lists = iter([{"models": ["m-old"], "servers": [], "tools": []},
                  {"models": ["m-old", "m-new"], "servers": [], "tools": []}])

    def slow():
        time.sleep(0.5)
        return next(lists)

    q = Queries(many.reader)
    monkeypatch.setattr(q, "_facets_now", slow)
    assert q.facets()["models"] == ["m-old"]  # the first time there is nothing to show instead
    monkeypatch.setattr(queries, "FACETS_SECONDS", 0.0)
    started = time.perf_counter()
    assert q.facets()["models"] == ["m-old"] and q.facets()["models"] == ["m-old"]
    assert time.perf_counter() - started < 0.25  # neither call waited for the refresh
    deadline = time.monotonic() + 5
    while q.facets()["models"] != ["m-old", "m-new"] and time.monotonic() < deadline:
        time.sleep(0.05)
    assert q.facets()["models"] == ["m-old", "m-new"]


def test_a_cut_off_tool_result_and_arguments_link_to_the_whole(tooltap, upstream):
    """A card shows the start of a long result (it came in the next turn's request) and of
    long arguments, each with a link to the whole of it."""
    result = "".join(f"line {i}: {'r' * 70}\n" for i in range(50_000)) + "the end of the result <b>"
    path = "p" * 70_000 + "/end-of-the-path"
    args = json.dumps({"path": path})
    call = {"id": "call_big", "type": "function", "function": {"name": "read_file", "arguments": args}}
    upstream.routes["/chat/completions"] = [
        Reply.json({"id": "c1", "object": "chat.completion", "created": 1, "model": "m", "choices": [
            {"index": 0, "finish_reason": "tool_calls", "message": {"role": "assistant", "tool_calls": [call]}}]}),
        Reply.json({"id": "c2", "object": "chat.completion", "created": 1, "model": "m", "choices": [
            {"index": 0, "finish_reason": "stop", "message": {"role": "assistant", "content": "read it"}}]})]
    first = [{"role": "user", "content": "read the big file"}]
    second = first + [{"role": "assistant", "content": None, "tool_calls": [call]},
                      {"role": "tool", "tool_call_id": "call_big", "content": result}]
    for messages in (first, second):
        httpx.post(tooltap.url + "/chat/completions", json={"model": "m", "messages": messages},
                   timeout=30).raise_for_status()
        tooltap.flush()
    turn = min(t["id"] for t in tooltap.api("/turns")["turns"])
    session = tooltap.api(f"/turns/{turn}")["session_id"]
    link = f'href="/_tooltap/turns/{turn}/calls/0/result"'
    for page in (f"/_tooltap/sessions/{session}", f"/_tooltap/turns/{turn}"):
        html = get(tooltap, page).text
        card = html.split('data-testid="tool-call"')[1]
        shown = card.split('class="result-text">')[1].split("</pre>")[0]
        assert "more characters not shown" in shown and link in shown, page
        shown = card.split('data-testid="arguments">')[1].split("</pre>")[0]
        assert f'href="/_tooltap/turns/{turn}/download"' in shown, page
    whole = get(tooltap, f"/_tooltap/turns/{turn}/calls/0/result")
    assert whole.status_code == 200 and whole.headers["content-type"] == "text/plain; charset=utf-8"
    assert whole.text == result  # exactly the result, its end included, as text
    download = get(tooltap, f"/_tooltap/turns/{turn}/download").json()
    assert download["tool_calls"][0]["arguments"]["path"].endswith("/end-of-the-path")
    for index in (1, -1, 2**64):
        assert get(tooltap, f"/_tooltap/turns/{turn}/calls/{index}/result").status_code == 404, index
    assert get(tooltap, f"/_tooltap/turns/{2**64}/calls/0/result").status_code == 404


def test_a_date_that_does_not_parse_is_named_and_not_applied(tooltap, upstream):
    upstream.routes["/chat/completions"] = Reply.json({"id": "c", "object": "chat.completion", "choices": []})
    httpx.post(tooltap.url + "/chat/completions", json={"model": "m", "messages": [{"role": "user", "content": "hi"}]})
    sid = tooltap.api("/sessions")["sessions"][0]["id"]
    html = get(tooltap, "/_tooltap/", params={"since": "abc"}).text
    assert "no date since=&#39;abc&#39; (not applied): use YYYY-MM-DD" in html and f'data-session="{sid}"' in html
    assert '<input type="date" name="since" value="">' in html  # a date input cannot hold it
    assert '<input type="date" name="until" value="">' in get(tooltap, "/_tooltap/", params={"until": "2026-13-45"}).text
    assert '<input type="date" name="since" value="2026-01-31">' in get(
        tooltap, "/_tooltap/", params={"since": "2026-01-31"}).text
    r = get(tooltap, "/_tooltap/api/search", params={"until": "2026-13-45", "status": "bogus"}).json()
    assert [s["id"] for s in r["sessions"]] == [sid]
    assert r["note"].startswith("no status 'bogus' (not applied)")
    assert "; no date until='2026-13-45' (not applied): use YYYY-MM-DD" in r["note"]
    r = get(tooltap, "/_tooltap/api/search", params={"since": "2000-01-01", "until": "2000-01-02"}).json()
    assert r["sessions"] == [] and r["note"] is None  # dates that parse: applied, nothing said


def test_an_offset_too_large_says_what_an_offset_may_be(tooltap):
    r = get(tooltap, "/_tooltap/api/sessions", params={"offset": 10**20})
    assert r.status_code == 400
    assert r.json()["detail"] == f"offset={10**20}: an offset is how many sessions to skip, 0 to 2^63-1"
    assert get(tooltap, "/_tooltap/api/sessions", params={"offset": 2**63 - 1}).json() == {"sessions": []}


def test_links_to_a_session_whose_name_holds_url_characters_lead_to_it(tooltap, upstream):
    """A session named by the client (X-Tooltap-Session) may hold '#', '?', '%' or spaces:
    every link to it is encoded, or it would lead to another session or to none."""
    name = "team/a#b?c=1 50%"
    upstream.routes["/chat/completions"] = Reply.json({"id": "c", "object": "chat.completion", "choices": [{
        "index": 0, "finish_reason": "stop", "message": {"role": "assistant", "content": "ok"}}]})
    httpx.post(tooltap.url + "/chat/completions", headers={"x-tooltap-session": name},
               json={"model": "m", "messages": [{"role": "user", "content": "hi"}]})
    turn_id = tooltap.api("/turns")["turns"][0]["id"]
    to_session = r'<a href="(/_tooltap/sessions/[^"#]*)'  # the first link to a session page
    tools = f"/_tooltap/sessions/{name.replace('#', '%23').replace('?', '%3F')}/tools"
    for page in ("/_tooltap/", f"/_tooltap/turns/{turn_id}", tools):
        href = re.search(to_session, get(tooltap, page).text).group(1)
        assert "#" not in href and "?" not in href, (page, href)
        answer = get(tooltap, href.replace("&amp;", "&"))
        assert answer.status_code == 200 and f"<code>{name}</code>" in answer.text.replace("&#39;", "'"), (page, href)


def test_links_of_a_session_named_with_dot_segments_stay_in_the_inspector(tooltap, upstream):
    """A browser collapses `..` segments in a link's path: a session named `../../escape`
    had its replay button post to /_tooltap/escape/replays and its tools link leave the
    inspector (forwarded upstream, stored as a turn)."""
    from urllib.parse import urljoin, urlsplit

    name = "../../escape"
    upstream.routes["/chat/completions"] = Reply.json({"id": "c", "object": "chat.completion", "choices": [{
        "index": 0, "finish_reason": "stop", "message": {"role": "assistant", "content": "ok"}}]})
    httpx.post(tooltap.url + "/chat/completions", headers={"x-tooltap-session": name},
               json={"model": "m", "messages": [{"role": "user", "content": "hi"}]})
    tooltap.flush()
    page_url = f"{tooltap.url}/_tooltap/sessions/..%2F..%2Fescape"
    page = httpx.get(page_url)
    assert page.status_code == 200 and f"<code>{name}</code>" in page.text
    links = re.findall(r'(?:href|data-replay)="(/[^"]*)"', page.text)
    assert any("/replays" in link for link in links) and any(link.endswith("/tools") for link in links)
    for link in links:  # as a browser resolves them
        path = urlsplit(urljoin(page_url, link.replace("&amp;", "&"))).path
        assert path.startswith("/_tooltap/"), (link, path)
        if "%2Fescape" in link and "/replays" not in link:
            assert httpx.get(tooltap.url + link).status_code == 200, link
    assert len(tooltap.api("/turns")["turns"]) == 1  # nothing forwarded by following them


def test_a_session_named_like_a_subpage_is_its_own_page(tooltap, upstream):
    """'team/tools' and 'team/replays' are sessions a client may name: their links lead to
    them, not to the tools page or the runs of a session 'team'."""
    upstream.routes["/chat/completions"] = Reply.json({"id": "c", "object": "chat.completion", "choices": [{
        "index": 0, "finish_reason": "stop", "message": {"role": "assistant", "content": "ok"}}]})
    for name in ("team", "team/tools", "team/replays"):
        httpx.post(tooltap.url + "/chat/completions", headers={"x-tooltap-session": name},
                   json={"model": "m", "messages": [{"role": "user", "content": f"in {name}"}]})
    page = get(tooltap, "/_tooltap/sessions/team/tools")
    assert page.status_code == 200 and "<code>team/tools</code>" in page.text and "in team/tools" in page.text
    assert get(tooltap, "/_tooltap/api/sessions/team/replays").json()["id"] == "team/replays"
    assert get(tooltap, "/_tooltap/api/sessions/team/tools").json()["id"] == "team/tools"
    assert get(tooltap, "/_tooltap/api/sessions/team/tools/replays").json() == {"runs": []}
    assert "<code>team</code>" in get(tooltap, "/_tooltap/sessions/team").text


def test_the_readme_read_api_table_says_what_the_api_answers(tooltap, cline):
    """The README's Read API rows for a turn's timeline and the MCP messages list, against
    what a running tooltap answers: the timeline comes wrapped, and a list item carries its
    message once (`json`), not twice: `raw` is on the one-message address."""
    from pathlib import Path

    from proxy.mcp.store import Connection, Recorder, new_id

    readme = (Path(__file__).parent.parent / "README.md").read_text(encoding="utf-8")
    rows = {m.group(1): m.group(2) for m in re.finditer(r"^\| `GET ([^`]+)` \| (.*) \|$", readme, re.M)}
    turn = tooltap.api(f"/sessions/{cline}")["turns"][-1]["id"]
    timeline = tooltap.api(f"/turns/{turn}/timeline")
    assert list(timeline) == ["timeline"] and timeline["timeline"]
    assert all(list(point) == ["offset", "ms"] for point in timeline["timeline"])
    assert rows["/turns/{id}/timeline"] == 'when each chunk arrived: `{"timeline": [{offset, ms}]}`'

    recorder = Recorder(f"sqlite:///{tooltap.db_path}", tooltap.db_path.parent / "mcp-spool")
    recorder.start()
    conn = Connection(new_id(), "stdio", name="weather")
    radar = "x" * 419_000  # the tester's 419 KB tool result
    recorder.record(conn, "to_server", b'{"jsonrpc": "2.0", "id": 1, "method": "tools/call", '
                                       b'"params": {"name": "get_radar", "arguments": {}}}')
    recorder.record(conn, "from_server", json.dumps(
        {"jsonrpc": "2.0", "id": 1, "result": {"content": [{"type": "text", "text": radar}]}}).encode())
    recorder.record(conn, "from_server", b"a line that is not JSON")
    recorder.close()
    listed = get(tooltap, "/_tooltap/api/mcp/messages?server=weather")
    items = listed.json()["messages"]
    documented = re.search(r"\[\{([^}]+)\}\]", rows["/mcp/messages?server=&limit=&before="]).group(1)
    keys = [k.split(" ")[0] for k in documented.split(", ")]
    assert [list(m) for m in items[1:]] == [keys, keys]  # newest first: the line that is not JSON leads
    assert list(items[0]) == [*keys, "raw"] and items[0]["raw"] == "a line that is not JSON"
    assert items[1]["json"]["result"]["content"][0]["text"] == radar
    assert len(radar) < len(listed.content) < 1.2 * len(radar)  # once, not twice
    one = tooltap.api(f"/mcp/messages/{items[1]['id']}")
    assert json.loads(one["raw"]) == one["json"] == items[1]["json"]
