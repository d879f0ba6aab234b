"""The dashboard's fleet page (``/ui/fleet``) in a real headless Chromium against a real
``chainrt serve`` on Redis: the runner's loops, a dead letter (its fields written as text, never
as HTML) and its Drop button."""

from __future__ import annotations

import time
from pathlib import Path

import pytest
import redis
from browser_fixtures import CHROMIUM, checked_page, chromium

from chainrt.serve._queue import stream_key
from chainrt.testing.serve_process import ServeProcess

CHAINS = Path(__file__).parent / "data" / "serve"
XSS = "<img src=x onerror=window.__pwned=1>"

pytestmark = [
    pytest.mark.slow,
    pytest.mark.browser,
    pytest.mark.redis,
    pytest.mark.skipif(not Path(CHROMIUM).exists(), reason=f"no Chromium at {CHROMIUM}"),
]
sync_api = pytest.importorskip("playwright.sync_api", reason="playwright is not installed")
expect = sync_api.expect


def test_the_fleet_page_shows_loops_and_dead_letters_and_drops_one(redis_url: str) -> None:
    with ServeProcess(store=redis_url, chains=CHAINS) as server:
        client = redis.Redis.from_url(redis_url)
        client.xadd(stream_key("critical", chain="nap"), {"op": XSS})  # no run_id: poison
        client.close()
        deadline = time.monotonic() + 60
        while not server.get("/v1/dlq").json():
            assert time.monotonic() < deadline, server.log()
            time.sleep(0.2)
        with chromium() as browser, checked_page(browser, server.url) as opened:
            page = opened.goto("/ui/fleet")
            expect(page.locator("#loops tbody")).to_contain_text("take")
            expect(page.locator("#loops tbody")).to_contain_text("up")
            dead = page.locator("#dead tbody")
            expect(dead).to_contain_text("PoisonEntry")
            expect(dead).to_contain_text(XSS[:20])  # shown as text
            assert page.evaluate("window.__pwned") is None
            page.on("dialog", lambda dialog: dialog.accept())
            dead.locator("button.drop").first.click()
            expect(dead).to_contain_text("no dead letters")
        assert server.get("/v1/dlq").json() == []
