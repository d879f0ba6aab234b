"""Helpers shared by the dashboard's browser tests (``tests/test_dashboard_browser*.py``):
the Chromium path, a page that records console errors, and run submission and waiting."""

from __future__ import annotations

import os
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest

from chainrt.testing.serve_process import ServeProcess

__all__ = ["BROWSER_TEST", "CHROMIUM", "Page", "checked_page", "chromium", "submit", "wait_status"]

CHROMIUM = "/usr/bin/chromium"
"""Debian's Chromium (scripts/setup installs it); Playwright drives it via executable_path."""

BROWSER_TEST = [
    pytest.mark.slow,
    pytest.mark.browser,
    pytest.mark.skipif(
        not Path(CHROMIUM).exists(),
        reason=f"no Chromium at {CHROMIUM} (scripts/setup installs Debian's chromium)",
    ),
]
"""The marks of a browser test module (``pytestmark = BROWSER_TEST``): slow tier, skipped
without Chromium."""


def wait_status(server: ServeProcess, run_id: str, wanted: set[str], within_s: float = 60) -> Any:
    """Poll the API until the run has one of ``wanted`` statuses (a generous wait, not a timing)."""
    deadline = time.monotonic() + within_s
    while True:
        run = server.get(f"/v1/runs/{run_id}").json()
        if run["status"] in wanted:
            return run
        assert time.monotonic() < deadline, f"{run_id} still {run['status']}, wanted {wanted}"
        time.sleep(0.05)


def submit(
    server: ServeProcess, chain: str, run_id: str, inputs: dict[str, Any], **kw: Any
) -> None:
    """Submit a run of ``chain`` under ``run_id``; it must be accepted."""
    body = {"chain": chain, "input": inputs, "run_id": run_id, **kw}
    answer = server.post("/v1/runs", json=body)
    assert answer.status_code == 202, answer.text


class Page:
    """A browser page that records console errors and uncaught exceptions."""

    def __init__(self, browser: Any, base: str, width: int = 1280) -> None:
        self.base = base
        self.errors: list[str] = []
        self.page = browser.new_page(viewport={"width": width, "height": 900})
        self.page.on("console", lambda m: self.errors.append(m.text) if m.type == "error" else None)
        self.page.on("pageerror", lambda e: self.errors.append(str(e)))
        self.page.set_default_timeout(20_000)

    def goto(self, path: str) -> Any:
        """Open ``path`` on the server; returns the Playwright page."""
        self.page.goto(self.base + path)
        return self.page

    def shot(self, name: str) -> None:
        """Save a screenshot under $CHAINRT_DASHBOARD_SHOTS (docs/img is made this way)."""
        folder = os.environ.get("CHAINRT_DASHBOARD_SHOTS")
        if folder:
            self.page.screenshot(path=str(Path(folder) / name), full_page=True)


@contextmanager
def chromium() -> Iterator[Any]:
    """A headless Debian Chromium driven by Playwright (the module's ``browser`` fixture)."""
    from playwright import sync_api

    with sync_api.sync_playwright() as playwright:
        launched = playwright.chromium.launch(executable_path=CHROMIUM)
        yield launched
        launched.close()


@contextmanager
def checked_page(browser: Any, base: str) -> Iterator[Page]:
    """A :class:`Page` on ``base`` that fails the test if the page logged console errors."""
    opened = Page(browser, base)
    yield opened
    errors = list(opened.errors)
    opened.page.close()
    assert errors == [], f"console errors: {errors}"
