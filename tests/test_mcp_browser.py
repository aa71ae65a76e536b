"""The MCP chain in a real browser: the cline-weather session through tooltap, its MCP
call through `tooltap mcp` around the SDK weather server; the session page shows what the
model asked, what the server got and answered, what the model was told."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from urllib.parse import parse_qs, urlsplit

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
