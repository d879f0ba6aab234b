"""The runs list shows each row's ``reason`` (issue 36), in a real headless Chromium against
real ``chainrt serve`` processes on Redis: a queued run that no live runner serves says so in its
row; a completed run's reason cell stays empty."""

from __future__ import annotations

import shutil
import time
from pathlib import Path

import pytest
from browser_fixtures import BROWSER_TEST, checked_page, chromium, submit, wait_status

from chainrt.testing.serve_process import ServeProcess

CHAINS = Path(__file__).parent / "data" / "serve"

pytestmark = [*BROWSER_TEST, pytest.mark.redis]
sync_api = pytest.importorskip("playwright.sync_api", reason="playwright is not installed")
expect = sync_api.expect


def only_b(tmp_path: Path) -> Path:
    """A chains folder with one chain that the shared test folder does not have."""
    folder = tmp_path / "mychains"
    folder.mkdir()
    shutil.copy(CHAINS / "tools.py", folder / "tools.py")
    text = (CHAINS / "nap.yaml").read_text().replace("name: nap", "name: only_b")
    (folder / "only_b.yaml").write_text(text)
    return folder


def test_the_runs_list_shows_why_a_queued_run_waits(redis_url: str, tmp_path: Path) -> None:
    with ServeProcess(store=redis_url, chains=CHAINS) as a:
        b = ServeProcess(store=redis_url, chains=only_b(tmp_path), max_runs=1).start()
        try:
            submit(b, "only_b", "long", {"seconds": 60, "label": "long"})
            wait_status(b, "long", {"running"})
            submit(b, "only_b", "stuck", {"seconds": 0.01, "label": "stuck"})
        finally:
            b.kill()  # kill -9: its announcement of the chains it serves expires
        submit(a, "nap", "fine", {"seconds": 0.01, "label": "fine"})
        wait_status(a, "fine", {"completed"})
        reason = "no live runner serves chain 'only_b'"
        deadline = time.monotonic() + 30
        while a.get("/v1/runs/stuck").json().get("reason") != reason:
            assert time.monotonic() < deadline, a.get("/v1/runs/stuck").text
            time.sleep(0.5)
        with chromium() as browser, checked_page(browser, a.url) as opened:
            page = opened.goto("/ui/")
            expect(page.locator("#runs thead")).to_contain_text("reason")
            stuck = page.locator('tr[data-run-id="stuck"] td.reason')
            expect(stuck).to_have_text(reason)
            expect(stuck).to_have_attribute("title", reason)
            expect(page.locator('tr[data-run-id="fine"] td.reason')).to_have_text("")
            # A run created meanwhile comes in through the live stream; the rows read before
            # keep their reasons.
            submit(a, "nap", "later", {"seconds": 0.01, "label": "later"})
            expect(page.locator('tr[data-run-id="later"]')).to_contain_text("completed")
            expect(stuck).to_have_text(reason)
            opened.shot("runs-reason.png")
