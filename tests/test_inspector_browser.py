"""The inspector in a real headless browser (Debian's chromium, Playwright): the
cline-weather session, hostile captured text, live turns, search, the UI token."""

from __future__ import annotations

import json
from urllib.parse import quote
import re
import threading

import httpx
from playwright.sync_api import expect

from proxy.demo import chat_sse, words
from proxy.scripted import Reply
from tests.conftest import cline_turn
from tests.test_proxy_e2e import FINAL_SSE

XSS_IMG = '<img src=x onerror="window.__xss=1;alert(1)">'
XSS_SCRIPT = "<script>window.__xss=2;alert(2)</script>"


def send(url: str, body: dict | bytes, path: str = "/chat/completions") -> httpx.Response:
    content = body if isinstance(body, bytes) else json.dumps(body).encode()
    return httpx.post(url + path, content=content, timeout=30,
                      headers={"content-type": "application/json", "authorization": "Bearer sk-test-0123456789"})


def play_cline_turns(tooltap, upstream, n: int) -> None:
    turns = [cline_turn(i) for i in (1, 2, 3)]
    upstream.routes["/chat/completions"] = [Reply.sse(t["sse"]) for t in turns]
    for t in turns[:n]:
        assert send(tooltap.url, t["request"]).status_code == 200
    tooltap.flush()


def wait_live(page) -> None:
    page.wait_for_selector("body[data-live=on]")


def test_cline_weather_session_renders(tooltap, upstream, page):
    play_cline_turns(tooltap, upstream, 3)
    page.goto(tooltap.url + "/_tooltap/")
    page.click("text=华盛顿明天天气如何？")
    mcp = page.locator("[data-testid=tool-call]", has_text="weather › get_forecast")
    assert mcp.count() == 1
    assert mcp.locator("[data-testid=call-name]").inner_text() == "weather › get_forecast"
    assert "cIya4J0mcp0get_forecast" in mcp.inner_text()
    assert mcp.locator(".cl-count").inner_text() == "2/4"
    assert mcp.locator(".checklist li.changed").inner_text().startswith("☑ 确定华盛顿的地理位置坐标")
    assert mcp.locator("[data-testid=violations]").is_visible()
    # Turn 3's call is answered by the MCP result that arrives in turn 4 (not played):
    assert "no result (yet)" in mcp.locator("[data-testid=result]").inner_text()
    first = page.locator("[data-testid=tool-call]", has_text="list_files")
    assert first.locator(".cl-count").inner_text() == "0/4"
    result = first.locator("[data-testid=result]")
    assert "weather.py" in result.inner_text()
    assert result.locator("[data-testid=placeholder]").inner_text() == "tool message: “result missing”"
    # Keyboard: j selects the first turn, j again the second.
    page.keyboard.press("j")
    page.keyboard.press("j")
    assert page.locator("article.turn.selected").get_attribute("id") == "turn-2"


def test_on_a_phone_wide_window_the_sessions_table_scrolls_not_the_page(tooltap, upstream, page):
    play_cline_turns(tooltap, upstream, 2)
    page.set_viewport_size({"width": 420, "height": 800})
    page.goto(tooltap.url + "/_tooltap/")
    table = page.locator("table.grid").first
    expect(table).to_contain_text("华盛顿明天天气如何？")
    assert page.evaluate("document.documentElement.scrollWidth") <= 420
    assert table.evaluate("t => t.scrollWidth > t.clientWidth")  # its columns are all there, scrolled to
    head, first = table.locator("thead th").first.bounding_box(), table.locator("tbody tr").first.bounding_box()
    assert first["y"] >= head["y"] + head["height"] - 1  # the heading sits above the rows, not on them


def test_hostile_text_renders_as_text_and_runs_nothing(tooltap, upstream, page):
    args = json.dumps({"path": XSS_IMG, "content": XSS_SCRIPT})
    upstream.routes["/chat/completions"] = [
        Reply.sse(chat_sse("m", [{"content": "see " + XSS_SCRIPT}, {"tool_calls": [{
            "index": 0, "id": "call_x", "type": "function",
            "function": {"name": "write_to_file", "arguments": args}}]}], finish="tool_calls")),
        Reply.sse(chat_sse("m", words("done " + XSS_IMG))),
    ]
    tools = [{"type": "function", "function": {"name": "write_to_file", "description": XSS_IMG,
                                               "parameters": {"type": "object"}}}]
    first = {"model": "m", "stream": True, "tools": tools,
             "messages": [{"role": "user", "content": "title " + XSS_SCRIPT}]}
    second = {**first, "messages": first["messages"] + [
        {"role": "assistant", "content": "see " + XSS_SCRIPT, "tool_calls": [
            {"id": "call_x", "type": "function", "function": {"name": "write_to_file", "arguments": args}}]},
        {"role": "tool", "tool_call_id": "call_x", "content": "result " + XSS_IMG}]}
    send(tooltap.url, first)
    tooltap.flush()
    sid = tooltap.api("/sessions")["sessions"][0]["id"]

    # The second turn arrives while the session page is open: the live path too.
    page.goto(f"{tooltap.url}/_tooltap/sessions/{sid}")
    wait_live(page)
    send(tooltap.url, second)
    page.wait_for_selector("article.turn >> nth=1")

    for url in [f"/_tooltap/sessions/{sid}", "/_tooltap/", "/_tooltap/turns/1", "/_tooltap/turns/2",
                f"/_tooltap/sessions/{sid}/tools", "/_tooltap/?q=onerror"]:
        page.goto(tooltap.url + url)
        body = page.locator("main").inner_text()
        assert "<img src=x onerror=" in body or "<script>window.__xss=2" in body, url
        assert page.locator("main img").count() == 0 and page.locator("main script").count() == 0, url
        assert page.evaluate("window.__xss") is None, url
    page.goto(f"{tooltap.url}/_tooltap/sessions/{sid}")
    text = page.locator("main").inner_text()
    assert XSS_IMG in text and XSS_SCRIPT in text
    assert page.locator("main img").count() == 0 and page.locator("main script").count() == 0
    assert page.evaluate("window.__xss") is None
    assert page.dialogs == []


def test_a_streaming_turn_appears_live_on_the_list_and_grows(tooltap, upstream, page):
    upstream.routes["/chat/completions"] = Reply.sse(
        chat_sse("slow-model", [{"content": f"word{i} "} for i in range(12)]), delay=0.2)
    page.goto(tooltap.url + "/_tooltap/")
    wait_live(page)
    assert page.locator("#sessions-total").inner_text() == "0"
    sender = threading.Thread(target=send, args=(tooltap.url, {
        "model": "slow-model", "stream": True, "messages": [{"role": "user", "content": "count slowly"}]}))
    sender.start()
    live = page.locator("[data-testid=live-turn]")
    live.wait_for()
    expect(live.locator(".live-head > b")).to_have_text("streaming")
    live.locator(".live-text", has_text="word2").wait_for()  # (wait_for_function would need eval: CSP says no)
    partial = live.locator(".live-text").inner_text()
    assert "word11" not in partial  # seen while still streaming
    page.locator("tr[data-session]", has_text="count slowly").wait_for()
    sender.join()
    assert live.count() == 0  # the in-flight box gives way to the stored row
    assert page.locator("#sessions-total").inner_text() == "1"  # the header counts it too


def test_bidirectional_controls_are_shown_not_obeyed(tooltap, upstream, page):
    """A right-to-left override in model output would make what follows it read backwards
    (a path, a command): the inspector shows each such control as a mark, live and stored."""
    rlo = "\u202e"
    args = json.dumps({"command": f"echo safe {rlo}fr- mr", "requires_approval": False})
    upstream.routes["/chat/completions"] = Reply.sse(chat_sse("m", [
        {"content": f"part{i} {rlo}"} for i in range(8)] + [{"tool_calls": [{
            "index": 0, "id": "call_b", "type": "function",
            "function": {"name": "execute_command", "arguments": args}}]}], finish="tool_calls"), delay=0.2)
    page.goto(tooltap.url + "/_tooltap/")
    wait_live(page)
    sender = threading.Thread(target=send, args=(tooltap.url, {
        "model": "m", "stream": True, "messages": [{"role": "user", "content": f"bidi {rlo}test"}]}))
    sender.start()
    live = page.locator("[data-testid=live-turn] .live-text", has_text="part2")
    live.wait_for()
    assert "⟨U+202E⟩" in live.inner_text() and rlo not in live.inner_text()
    sender.join()
    tooltap.flush()
    sid = tooltap.api("/sessions")["sessions"][0]["id"]
    for url in ["/_tooltap/", f"/_tooltap/sessions/{sid}", "/_tooltap/turns/1"]:
        page.goto(tooltap.url + url)
        text = page.locator("main").inner_text()
        assert "⟨U+202E⟩" in text and rlo not in text, url
    assert "echo safe ⟨U+202E⟩fr- mr" in text
    assert tooltap.api("/turns/1")["tool_calls"][0]["arguments"]["command"] == f"echo safe {rlo}fr- mr"  # stored as sent
    # What goes back to tooltap is not marked: copy as curl sends the same JSON (the
    # control as its escape), and the search box and the model list submit what they hold.
    curl = page.locator("#curl").inner_text()
    assert "bidi \\u202etest" in curl and "⟨" not in curl, curl
    page.goto(f"{tooltap.url}/_tooltap/?q=" + quote(f"bidi {rlo}test"))
    assert page.locator("#search").input_value() == f"bidi {rlo}test"
    page.click("text=filter")
    page.locator("tr[data-session]").first.wait_for()
    assert page.locator("tr[data-session]").count() == 1 and "bidi" in page.url


def test_two_quick_turns_of_a_new_session_add_one_row_live(tooltap, upstream, page):
    """Both turns land in one writer batch: their two `turn_stored` events arrive together,
    each fetching the new session's row. One row, counted once."""
    upstream.routes["/chat/completions"] = Reply.sse(chat_sse("other", words("hi")))
    send(tooltap.url, {"model": "other", "stream": True, "messages": [{"role": "user", "content": "unrelated"}]})
    tooltap.flush()
    page.goto(tooltap.url + "/_tooltap/")
    wait_live(page)
    assert page.locator("#sessions-total").inner_text() == "1"
    play_cline_turns(tooltap, upstream, 2)  # no flush between the two: one batch
    page.locator("tr[data-session]", has_text="华盛顿明天天气如何？").first.wait_for()
    expect(page.locator("[data-testid=live-turn]")).to_have_count(0)  # both events handled
    rows = page.locator("tr[data-session]")
    expect(rows).to_have_count(2)
    assert len(tooltap.api("/sessions")["sessions"]) == 2
    assert page.locator("#sessions-total").inner_text() == "2"
    assert rows.first.locator("td.num").first.inner_text() == "2"  # the row as it stands after both turns


def test_a_new_turn_appears_live_on_its_session_page(tooltap, upstream, page):
    play_cline_turns(tooltap, upstream, 3)
    sid = tooltap.api("/sessions")["sessions"][0]["id"]
    page.goto(f"{tooltap.url}/_tooltap/sessions/{sid}")
    wait_live(page)
    assert page.locator("article.turn").count() == 3
    upstream.routes["/chat/completions"] = Reply.sse(FINAL_SSE.replace(
        b'"content":"Sunny, 21\\u00b0C."', b'"content":"Sunny, 21\\u00b0C. Enjoy."'), split=40, delay=0.2)
    sender = threading.Thread(target=send, args=(tooltap.url, cline_turn(4)["request"]))
    sender.start()
    page.locator("#in-flight [data-testid=live-turn]").wait_for()
    card = page.locator("article.turn >> nth=3")
    card.wait_for()
    sender.join()
    assert "Sunny, 21°C. Enjoy." in card.inner_text()
    # Turn 4 carries turn 3's MCP result: the live card is new, turn 3's result shows on reload.
    page.reload()
    mcp = page.locator("[data-testid=tool-call]", has_text="weather › get_forecast")
    assert "Patchy fog" in mcp.locator("[data-testid=result]").inner_text()


def test_search_finds_a_tool_argument(tooltap, upstream, page):
    play_cline_turns(tooltap, upstream, 3)
    upstream.routes["/chat/completions"] = Reply.sse(chat_sse("other", words("hi")))
    send(tooltap.url, {"model": "other", "stream": True, "messages": [{"role": "user", "content": "unrelated"}]})
    tooltap.flush()
    page.goto(tooltap.url + "/_tooltap/")
    assert page.locator("tr[data-session]").count() == 2
    page.keyboard.press("/")
    page.keyboard.type("-77.0369")
    page.keyboard.press("Enter")
    page.wait_for_url("**q=-77.0369**")
    rows = page.locator("tr[data-session]")
    assert rows.count() == 1
    assert "华盛顿明天天气如何？" in rows.inner_text() and "tool arguments" in rows.inner_text()
    # From a page without the search box, "/" goes to it.
    rows.locator("a").first.click()
    page.wait_for_url("**/_tooltap/sessions/**")
    page.keyboard.press("/")
    page.wait_for_url("**/_tooltap/#search")
    page.keyboard.type("unrelated")
    page.keyboard.press("Enter")
    page.wait_for_url("**q=unrelated**")
    assert page.locator("tr[data-session]").count() == 1


def test_a_page_that_is_not_there_is_a_page_and_records_nothing(tooltap, upstream, page):
    """A stale link in the browser gets an error page (escaped, with the way back) rather
    than JSON; and no request for /favicon.ico follows it to the upstream as a turn."""
    page.goto(tooltap.url + "/_tooltap/")
    r = page.goto(tooltap.url + "/_tooltap/sessions/%3Cb%3Egone%3C%2Fb%3E")
    assert r.status == 404 and r.headers["content-type"].startswith("text/html")
    assert page.locator("h1").inner_text() == "404 Not Found"
    assert "no session <b>gone</b>" in page.locator("main").inner_text()  # shown as text
    assert page.locator("main b").count() == 0
    page.locator("main a", has_text="all sessions").click()
    page.wait_for_url(tooltap.url + "/_tooltap/")
    tooltap.flush()
    assert tooltap.api("/sessions")["sessions"] == []  # not even a favicon, forwarded
    assert httpx.get(tooltap.url + "/_tooltap/api/sessions/gone", headers={"accept": "text/html"}).json() == {
        "detail": "no session gone"}  # the API answers JSON whoever asks
    r = page.goto(tooltap.url + "/_tooltap/turns/<b>abc")  # not a turn id at all
    assert r.status == 422 and r.headers["content-type"].startswith("text/html")
    assert "turn_id='<b>abc'" in page.locator("main").inner_text() and page.locator("main b").count() == 0
    assert httpx.get(tooltap.url + "/_tooltap/api/turns/abc").json()["detail"][0]["type"] == "int_parsing"


def test_ui_token_refuses_page_api_and_live_without_it(make_tooltap, upstream, page):
    tt = make_tooltap(upstream.url, ui_token="tok-123")
    for path in ["/_tooltap/", "/_tooltap/api/sessions", "/_tooltap/api/live"]:
        r = page.goto(tt.url + path)
        assert r.status == 401, path
        assert "UI token" in page.locator("body").inner_text()
    page.goto(tt.url + "/_tooltap/?token=tok-123")
    assert page.url == tt.url + "/_tooltap/"  # the token left the address bar
    wait_live(page)  # the event stream got through with the cookie
    assert page.request.get(tt.url + "/_tooltap/api/sessions").status == 200


def test_a_20_mb_request_gives_pages_a_browser_loads(tooltap, upstream, page):
    """Long content is cut on pages, with a link to the whole; the curl command reads the
    body from a file the page offers."""
    big = "x" * (20 * 1024 * 1024)
    body = {"model": "m", "messages": [{"role": "user", "content": big}], "stream": True}
    upstream.routes["/chat/completions"] = Reply.sse(chat_sse("m", words("a short answer")))
    assert send(tooltap.url, body).status_code == 200
    tooltap.flush()
    turn = tooltap.api("/turns")["turns"][0]
    session_url = f"{tooltap.url}/_tooltap/sessions/{turn['session_id']}"
    turn_url = f"{tooltap.url}/_tooltap/turns/{turn['id']}"
    for url in (session_url, turn_url):
        html = httpx.get(url, timeout=30).text
        assert len(html.encode()) < 1024 * 1024, (url, len(html))
        assert "more characters not shown" in html
    whole = httpx.get(f"{turn_url}/request", timeout=30)
    assert json.loads(whole.content)["messages"][0]["content"] == big
    page.goto(turn_url, timeout=20_000)
    assert "more characters not shown" in page.inner_text("main")
    curl = page.inner_text("#curl")
    assert curl.rstrip().endswith(f"--data-binary @tooltap-turn-{turn['id']}-request.json")
    page.goto(session_url, timeout=20_000)
    assert page.locator(".clip-note").count() >= 1


def test_a_long_session_arrives_window_by_window(tooltap, upstream, page):
    """Two windows and a bit: the page draws the first window of turns and fetches the
    next ones as the reader scrolls, or at once up to the turn its address names."""
    from inspector_ui.transcript import PAGE_TURNS

    upstream.routes["/chat/completions"] = Reply.sse(chat_sse("m", words("Done, next step.")))
    total = 2 * PAGE_TURNS + 30
    messages = [{"role": "system", "content": "You are terse."}, {"role": "user", "content": "Count."}]
    with httpx.Client(timeout=30) as client:
        for n in range(total):
            body = {"model": "m", "stream": True, "messages": messages}
            assert client.post(tooltap.url + "/chat/completions", json=body).status_code == 200
            messages = messages + [{"role": "assistant", "content": "Done, next step."},
                                   {"role": "user", "content": f"step {n + 1}"}]
    (s,) = tooltap.api("/sessions")["sessions"]
    ids = [t["id"] for t in tooltap.api(f"/sessions/{s['id']}")["turns"]]
    assert len(ids) == total

    page.goto(f"{tooltap.url}/_tooltap/sessions/{s['id']}")
    cards = page.locator("article.turn")
    assert cards.count() == PAGE_TURNS and page.locator("[data-testid=more-turns]").count() == 1
    assert "step 1" in page.locator(f"#turn-{ids[1]}").inner_text()
    for expected in (2 * PAGE_TURNS, total):  # each time the marker comes into view, one more window
        page.locator("[data-testid=more-turns]").scroll_into_view_if_needed()
        expect(cards).to_have_count(expected)
    assert page.locator("[data-testid=more-turns]").count() == 0
    drawn = [int(cards.nth(i).get_attribute("id").split("-")[1]) for i in range(cards.count())]
    assert drawn == ids  # every turn once, in order
    assert f"step {total - 1}" in page.locator(f"#turn-{ids[-1]}").inner_text()

    # An address naming a turn of the third window: fetched and scrolled to at once.
    far = 2 * PAGE_TURNS + 15
    page.goto(f"{tooltap.url}/_tooltap/sessions/{s['id']}#turn-{ids[far]}")
    target = page.locator(f"#turn-{ids[far]}")
    target.wait_for()
    expect(target).to_be_in_viewport()
    assert f"step {far}" in target.inner_text()

    # Without a script: the marker's link is a page of its own, from the next turn on.
    k = PAGE_TURNS
    html = httpx.get(f"{tooltap.url}/_tooltap/sessions/{s['id']}?after={ids[k - 1]}").text
    assert f'id="turn-{ids[k]}"' in html and f'id="turn-{ids[k - 1]}"' not in html
    assert f"From turn {k + 1} of {total}" in re.sub(r"<[^>]+>", "", html)  # as the page reads


def test_the_session_header_follows_new_turns_live(tooltap, upstream, page):
    """Turn count, tokens, the time range and the chart follow each stored turn of the
    session, as its cards do, without a reload."""
    upstream.routes["/chat/completions"] = [
        Reply.sse(chat_sse("m", words(f"step {n} done"), usage={
            "prompt_tokens": 1000 * n, "completion_tokens": 10 * n, "total_tokens": 1010 * n})) for n in (1, 2, 3)]
    messages = [{"role": "user", "content": "count with me"}]
    send(tooltap.url, {"model": "m", "stream": True, "messages": messages})
    sid = tooltap.api("/sessions")["sessions"][0]["id"]
    page.goto(f"{tooltap.url}/_tooltap/sessions/{sid}")
    wait_live(page)
    head = page.locator("section.session-head")
    assert "1 turn" in head.inner_text() and "1,000 in / 10 out tokens" in head.inner_text()
    started, last = (head.locator("time").nth(i).get_attribute("datetime") for i in (0, 1))
    page.evaluate("window.__not_reloaded = true")
    for n in (2, 3):
        messages = messages + [{"role": "assistant", "content": f"step {n - 1} done"},
                               {"role": "user", "content": f"step {n}"}]
        assert send(tooltap.url, {"model": "m", "stream": True, "messages": messages}).status_code == 200
    expect(page.locator("article.turn")).to_have_count(3)
    expect(head).to_contain_text("3 turns")
    expect(head).to_contain_text("6,000 in / 60 out tokens")  # 1,000 + 2,000 + 3,000 in
    expect(head.locator("rect.bar-in")).to_have_count(3)  # the chart too
    assert head.locator("time").nth(0).get_attribute("datetime") == started
    assert head.locator("time").nth(1).get_attribute("datetime") > last
    assert page.evaluate("window.__not_reloaded")


# -- what a streaming turn says of itself, and a session page that follows its new turns -----

def console_errors(page) -> list[str]:
    """Errors the page's scripts log or throw from now on."""
    errors: list[str] = []
    page.on("console", lambda m: errors.append(m.text) if m.type == "error" else None)
    page.on("pageerror", lambda e: errors.append(str(e)))
    return errors


def send_in(url: str, body: dict, session: str | None = None) -> httpx.Response:
    headers = {"content-type": "application/json"}
    if session:
        headers["x-tooltap-session"] = session
    return httpx.post(url + "/chat/completions", json=body, headers=headers, timeout=30)


def test_a_streaming_turn_names_its_session_and_model_on_the_list(tooltap, upstream, page):
    """Two turns stream at once: one of a session the client names (a row already on the
    list: linked by its title), one the writer will thread (no session named yet).
    The model is the one the stream names. Captured names are text, never markup."""
    model = "slow-" + XSS_IMG
    upstream.routes["/chat/completions"] = Reply.sse(chat_sse("quick", words("hi")))
    first = {"model": "quick", "stream": True, "messages": [{"role": "user", "content": "plan " + XSS_SCRIPT}]}
    assert send_in(tooltap.url, first, session="team/alice").status_code == 200
    tooltap.flush()
    errors = console_errors(page)
    page.goto(tooltap.url + "/_tooltap/")
    wait_live(page)
    upstream.routes["/chat/completions"] = Reply.sse(
        chat_sse(model, [{"content": f"word{i} "} for i in range(12)]), delay=0.2)
    second = {**first, "messages": first["messages"] + [
        {"role": "assistant", "content": "hi"}, {"role": "user", "content": "go on"}]}
    other = {"model": "slow", "stream": True, "messages": [{"role": "user", "content": "unthreaded yet"}]}
    senders = [threading.Thread(target=send_in, args=(tooltap.url, second, "team/alice")),
               threading.Thread(target=send_in, args=(tooltap.url, other))]
    for s in senders:
        s.start()
    live = page.locator("[data-testid=live-turn]")
    expect(live).to_have_count(2)
    named = live.filter(has=page.locator("[data-testid=live-session] a"))
    link = named.locator("[data-testid=live-session] a")
    expect(link).to_have_text("plan " + XSS_SCRIPT)  # the row's title, as text
    expect(named.locator("[data-testid=live-session]")).to_have_text("in session plan " + XSS_SCRIPT)
    assert link.get_attribute("href") == "/_tooltap/sessions/team%2Falice"
    unnamed = live.filter(has_not=page.locator("[data-testid=live-session] a"))
    expect(unnamed.locator("[data-testid=live-session]")).to_have_text("")
    for box in (named, unnamed):
        expect(box.locator("[data-testid=live-model]")).to_have_text("model " + model + " · ")
        expect(box.locator(".live-text")).to_contain_text("word1")
    assert "word11" not in named.locator(".live-text").inner_text()  # seen while still streaming
    assert page.locator("main img").count() == 0 and page.evaluate("window.__xss") is None
    for s in senders:
        s.join()
    expect(live).to_have_count(0)
    assert errors == []
    page.goto(tooltap.url + "/_tooltap/sessions/team%2Falice")  # where the link led
    expect(page.locator("section.session-head")).to_contain_text("2 turns")


def test_a_streaming_turn_of_the_open_session_says_so(tooltap, upstream, page):
    upstream.routes["/chat/completions"] = Reply.sse(chat_sse("m", words("hi")))
    first = {"model": "m", "stream": True, "messages": [{"role": "user", "content": "mine"}]}
    assert send_in(tooltap.url, first, session="s-1").status_code == 200
    tooltap.flush()
    errors = console_errors(page)
    page.goto(tooltap.url + "/_tooltap/sessions/s-1")
    wait_live(page)
    upstream.routes["/chat/completions"] = Reply.sse(chat_sse("m2", words("more words, slowly")), delay=0.2)
    second = {**first, "messages": first["messages"] + [
        {"role": "assistant", "content": "hi"}, {"role": "user", "content": "again"}]}
    others = {"model": "m2", "stream": True, "messages": [{"role": "user", "content": "not mine"}]}
    senders = [threading.Thread(target=send_in, args=(tooltap.url, second, "s-1")),
               threading.Thread(target=send_in, args=(tooltap.url, others, "s-2"))]  # another's: not shown here
    for s in senders:
        s.start()
    box = page.locator("#in-flight [data-testid=live-turn]")
    expect(box.locator("[data-testid=live-session]")).to_have_text("in this session ")
    expect(box.locator("[data-testid=live-model]")).to_have_text("model m2 · ")
    expect(box).to_have_count(1)
    for s in senders:
        s.join()
    expect(page.locator("article.turn")).to_have_count(2)
    assert errors == []


def test_the_turns_window_and_title_follow_new_turns_live(tooltap, upstream, page):
    """A page from the second turn on says "From turn 2 of N"; N, and the tab's title,
    follow each stored turn of the session without a reload, as the header does."""
    upstream.routes["/chat/completions"] = Reply.sse(chat_sse("m", words("ok")))
    messages = [{"role": "user", "content": "tally " + XSS_IMG}]

    def one_more_turn() -> None:
        nonlocal messages
        assert send(tooltap.url, {"model": "m", "stream": True, "messages": messages}).status_code == 200
        messages = messages + [{"role": "assistant", "content": "ok"}, {"role": "user", "content": "next"}]

    for _ in range(2):
        one_more_turn()
    (s,) = tooltap.api("/sessions")["sessions"]
    ids = [t["id"] for t in tooltap.api(f"/sessions/{s['id']}")["turns"]]
    errors = console_errors(page)
    page.goto(f"{tooltap.url}/_tooltap/sessions/{s['id']}?after={ids[0]}")
    wait_live(page)
    window = page.locator("[data-testid=turns-from]")
    expect(window).to_contain_text("From turn 2 of 2.")
    expect(page).to_have_title(f"tally {XSS_IMG} · 2 turns · tooltap")
    page.evaluate("window.__not_reloaded = true")
    for _ in range(2):
        one_more_turn()
    expect(page.locator("article.turn")).to_have_count(3)  # turns 2 to 4
    expect(window).to_contain_text("From turn 2 of 4.")
    expect(page).to_have_title(f"tally {XSS_IMG} · 4 turns · tooltap")
    assert page.evaluate("window.__not_reloaded")
    # The page as loaded anew says the same.
    page.reload()
    expect(window).to_contain_text("From turn 2 of 4.")
    expect(page).to_have_title(f"tally {XSS_IMG} · 4 turns · tooltap")
    assert page.locator("main img").count() == 0 and page.evaluate("window.__xss") is None
    assert errors == []


def test_a_long_unbroken_tool_message_wraps_within_the_page(tooltap, upstream, page):
    """A tool result with no spaces (base64, minified JSON) wraps: the page does not
    scroll sideways."""
    upstream.routes["/chat/completions"] = Reply.json({"id": "c", "object": "chat.completion", "choices": [{
        "index": 0, "finish_reason": "stop", "message": {"role": "assistant", "content": "ok"}}]})
    blob = "QUJD" * 1500
    call = {"id": "call_1", "type": "function", "function": {"name": "read_image", "arguments": "{}"}}
    history = [{"role": "user", "content": "look"}, {"role": "assistant", "content": None, "tool_calls": [call]}]
    for messages in (history[:1], [*history, {"role": "tool", "tool_call_id": "call_1", "content": blob}]):
        assert send(tooltap.url, {"model": "m", "messages": messages}).status_code == 200
    tooltap.flush()
    sid = tooltap.api("/sessions")["sessions"][0]["id"]
    page.set_viewport_size({"width": 1200, "height": 800})
    page.goto(f"{tooltap.url}/_tooltap/sessions/{sid}")
    expect(page.locator(".seg.tool-message")).to_contain_text("QUJDQUJD")
    assert page.evaluate("document.documentElement.scrollWidth") <= 1200


def test_a_json_answer_in_flight_is_said_to_be_answering(tooltap, upstream, page):
    """Not every turn in flight streams: a JSON answer still arriving is not called streaming.
    With no growing text to name its model, it names the one its request does, as text."""
    body = json.dumps({"id": "c", "object": "chat.completion", "model": "m", "choices": [{
        "index": 0, "finish_reason": "stop", "message": {"role": "assistant", "content": "done"}}]}).encode()
    upstream.routes["/chat/completions"] = Reply(200, [("content-type", "application/json")],
                                                 [body[:20], body[20:]], delay=1.5)
    page.goto(tooltap.url + "/_tooltap/")
    wait_live(page)
    model = "json-" + XSS_IMG
    sender = threading.Thread(target=send, args=(tooltap.url, {"messages": [
        {"role": "user", "content": "no stream"}], "model": model}))
    sender.start()
    live = page.locator("[data-testid=live-turn]")
    expect(live.locator(".live-head > b")).to_have_text("answering")
    expect(live.locator("[data-testid=live-model]")).to_have_text("model " + model + " · ")
    assert page.locator("main img").count() == 0 and page.evaluate("window.__xss") is None
    sender.join()
    expect(live).to_have_count(0)
