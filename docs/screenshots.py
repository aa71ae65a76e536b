"""Screenshots of the inspector's main pages, taken with the demo data.

    python3 docs/screenshots.py          # writes docs/inspector-*.png

Runs `tooltap demo`'s servers in this process and drives Debian's chromium with Playwright
(`apt-get install fonts-noto-cjk` first: the demo's Chinese session is shown as boxes without it).
"""

from __future__ import annotations

import sys
from pathlib import Path

from playwright.sync_api import sync_playwright

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from proxy import demo  # noqa: E402

CHROMIUM = "/usr/bin/chromium"
ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
        "--disable-component-update", "--no-first-run"]


def main(out: Path = ROOT / "docs") -> None:
    with demo.running() as d, sync_playwright() as p:
        d.play_all()
        browser = p.chromium.launch(executable_path=CHROMIUM, args=ARGS)
        page = browser.new_page(viewport={"width": 1400, "height": 900})
        page.goto(d.inspector)
        page.screenshot(path=out / "inspector-sessions.png")

        page.click("text=华盛顿明天天气如何？")
        page.wait_for_selector("text=weather › get_forecast")
        page.locator("#turn-3").scroll_into_view_if_needed()
        page.screenshot(path=out / "inspector-session.png")

        page.goto(page.url + "/tools")
        page.screenshot(path=out / "inspector-tools.png")

        page.goto(d.url + "/_tooltap/turns/5")
        page.screenshot(path=out / "inspector-turn.png")
        browser.close()
    print("wrote", ", ".join(sorted(str(f.name) for f in out.glob("inspector-*.png"))))


if __name__ == "__main__":
    main()
