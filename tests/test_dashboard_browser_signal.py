"""The run page's signal form, in a real headless Chromium against a real ``chainrt serve``: a
waiting run shows what it waits for and a payload to start from; a payload the wait's schema
refuses is answered on the page and the run keeps waiting; a good one continues the run."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from browser_fixtures import BROWSER_TEST, Page, checked_page, chromium, submit, wait_status

from chainrt.testing.serve_process import ServeProcess

pytestmark = BROWSER_TEST
sync_api = pytest.importorskip(
    "playwright.sync_api", reason="playwright is not installed (the dev extra has it)"
)

TOOLS = """
def act(amount: int, decision: dict) -> dict:
    return {"refunded": amount if decision["approved"] else 0, "note": decision.get("note")}
"""

CHAIN = """
name: approval
budget: 30s
inputs: {amount: int}
steps:
  - id: approve
    wait:
      signal: manager_ok
      schema: {approved: bool, "note?": str}
      timeout: 1h
  - id: act
    tool: formtools.py:act
    args: {amount: "{{ input.amount }}", decision: "{{ steps.approve.output }}"}
"""


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServeProcess]:
    folder = tmp_path_factory.mktemp("signal-form")
    chains = folder / "chains"
    chains.mkdir()
    (chains / "formtools.py").write_text(TOOLS)
    (chains / "approval.yaml").write_text(CHAIN)
    with ServeProcess(store=f"sqlite:///{folder / 'runs.db'}", chains=chains) as running:
        yield running


@pytest.fixture(scope="module")
def browser() -> Iterator[Any]:
    with chromium() as launched:
        yield launched


def test_the_signal_form_refuses_a_bad_payload_and_sends_a_good_one(
    server: ServeProcess, browser: Any, tmp_path: Path
) -> None:
    submit(server, "approval", "form-1", {"amount": 25})
    wait_status(server, "form-1", {"waiting"})
    page = Page(browser, server.url)
    try:
        p = page.goto("/ui/runs/form-1")
        form = p.locator("#signal-box")
        form.wait_for(state="visible")
        assert p.locator("#signal-name").text_content() == "manager_ok"
        assert p.locator("#signal-step").text_content() == "approve"
        assert "then fail" in (p.locator("#signal-until").text_content() or "")
        box = p.locator("#signal-payload")
        assert (
            sync_api.expect(box).to_have_value('{\n  "approved": true,\n  "note": "..."\n}') is None
        )
        assert p.locator("#status").text_content() == "waiting"

        box.fill("{not json")
        p.locator("#signal-send").click()
        sync_api.expect(p.locator("#message")).to_contain_text("The payload is not JSON")

        box.fill('{"approved": "yes"}')
        p.locator("#signal-send").click()
        sync_api.expect(p.locator("#message")).to_contain_text("Signal refused")
        sync_api.expect(p.locator("#message")).to_contain_text("does not match the wait's schema")
        assert server.get("/v1/runs/form-1").json()["status"] == "waiting"

        box.fill('{"approved": true, "note": "ok by Ann"}')
        p.locator("#signal-send").click()
        sync_api.expect(p.locator("#message")).to_contain_text("Signal manager_ok sent")
        sync_api.expect(p.locator("#status")).to_have_text("completed", timeout=60_000)
        sync_api.expect(form).to_be_hidden()
        page.shot("run-signal.png")
    finally:
        page.page.close()
    # The refused signal's answer is the one error the browser logs (its 422); nothing else.
    assert len(page.errors) == 1, page.errors
    assert "422" in page.errors[0]
    done = wait_status(server, "form-1", {"completed"})
    assert done["output"] == {"refunded": 25, "note": "ok by Ann"}


def test_the_runs_list_filters_waiting_runs(server: ServeProcess, browser: Any) -> None:
    submit(server, "approval", "form-2", {"amount": 1})
    wait_status(server, "form-2", {"waiting"})
    with checked_page(browser, server.url) as page:
        p = page.goto("/ui/?status=waiting")
        sync_api.expect(p.locator("text=form-2")).to_be_visible()
        assert p.locator("select#status").input_value() == "waiting"
