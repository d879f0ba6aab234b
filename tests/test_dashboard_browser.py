"""The dashboard (``/ui/``) in a real headless Chromium, against a real ``chainrt serve`` on Redis
and a real worker (the in-process local model) answering for the fallback model.

Runs made once for the module: completed (``steps``), partial with a fallback (``agent``: its
primary model's endpoint refuses connections, its budget ends in the second step), running
(``solo`` holding the key ``solo`` for minutes, its input carrying ``<script>``) and rejected
(a second ``solo`` run that cannot get the key in its 300 ms). Tests that change a run (cancel,
resume), watch the list live or watch an LLM step stream (``talk``) make their own.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import httpx
import pytest
from browser_fixtures import (
    BROWSER_TEST,
    Page,
    checked_page,
    chromium,
    submit,
    wait_status,
)
from worker_fixtures import WorkerProcess, free_port

from chainrt.testing.redis_server import RedisServer
from chainrt.testing.serve_process import ServeProcess

CHAINS = Path(__file__).parent / "data" / "dashboard"
XSS = '<script>window.__pwned = 1</script><img src=x onerror="window.__pwned = 2">'

pytestmark = BROWSER_TEST
sync_api = pytest.importorskip(
    "playwright.sync_api", reason="playwright is not installed (the dev extra has it)"
)
expect = sync_api.expect


@pytest.fixture(scope="module")
def server(
    redis_server: RedisServer, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[ServeProcess]:
    import redis

    client = redis.Redis.from_url(redis_server.url)
    client.flushall()
    client.close()
    worker = WorkerProcess(
        "--engine", "local",
        "--served-model-name", "smol",
        "--health-interval", "300",
        "--log-level", "warning",
    ).start()  # fmt: skip
    try:
        pool = tmp_path_factory.mktemp("dashboard") / "pool.yaml"
        nobody = f"http://127.0.0.1:{free_port()}"  # nothing listens: connections are refused
        pool.write_text(
            "models:\n"
            f"  primary: {{served_model: smol, endpoints: [{{url: '{nobody}'}}]}}\n"
            f"  backup: {{served_model: smol, endpoints: [{{url: '{worker.base}'}}]}}\n"
        )
        env = {"CHAINRT_POOL": str(pool)}
        with ServeProcess(store=redis_server.url, chains=CHAINS, drain="1s", env=env) as runner:
            yield runner
    finally:
        worker.stop()


@pytest.fixture(scope="module")
def runs(server: ServeProcess) -> dict[str, str]:
    submit(server, "steps", "done-1", {"a": 0.1, "b": 0.4, "c": 0.2})
    wait_status(server, "done-1", {"completed"})
    submit(server, "agent", "partial-1", {"q": "Say OK", "seconds": 1.0}, budget="2s")
    wait_status(server, "partial-1", {"partial"})
    submit(server, "solo", "running-1", {"seconds": 600.0, "label": XSS})
    wait_status(server, "running-1", {"running"})
    time.sleep(0.3)  # the holder takes the key as its run starts
    submit(server, "solo", "rejected-1", {"seconds": 0.0, "label": "late"}, budget="300ms")
    wait_status(server, "rejected-1", {"rejected"})
    return {
        "completed": "done-1",
        "partial": "partial-1",
        "running": "running-1",
        "rejected": "rejected-1",
    }


@pytest.fixture(scope="module")
def browser() -> Iterator[Any]:
    with chromium() as launched:
        yield launched


@pytest.fixture
def page(browser: Any, server: ServeProcess) -> Iterator[Page]:
    with checked_page(browser, server.url) as opened:
        yield opened


def row_ids(page: Any) -> list[str]:
    return list(
        page.locator("#runs tbody tr").evaluate_all("rows => rows.map(r => r.dataset.runId)")
    )


def test_list_shows_runs_newest_first_and_filters(page: Page, runs: dict[str, str]) -> None:
    p = page.goto("/ui/")
    p.wait_for_selector("#runs tbody tr[data-run-id='rejected-1']")
    ours = [run_id for run_id in row_ids(p) if run_id in runs.values()]  # other tests add runs
    assert ours == ["rejected-1", "running-1", "partial-1", "done-1"]  # newest first
    for status, run_id in runs.items():
        badge = p.locator(f"tr[data-run-id='{run_id}'] .status")
        assert badge.inner_text() == status
    page.shot("dashboard-list.png")

    p.select_option("#status", "partial")
    expect(p.locator("#runs tbody tr")).to_have_count(1)
    assert row_ids(p) == ["partial-1"]
    assert "status=partial" in p.url  # the filter is in the address, so it can be shared

    p.select_option("#status", "")
    p.select_option("#chain", "solo")
    expect(p.locator("#runs tbody tr")).to_have_count(2)
    assert row_ids(p) == ["rejected-1", "running-1"]

    p.select_option("#chain", "")
    p.fill("#search", "done-1")
    expect(p.locator("#runs tbody tr")).to_have_count(1)
    assert row_ids(p) == ["done-1"]
    p.fill("#search", "no-such-run")
    expect(p.locator("#message")).to_have_text("No run no-such-run.")
    assert row_ids(p) == []

    p.fill("#search", "")
    p.click("tr[data-run-id='partial-1'] a")
    p.wait_for_url("**/ui/runs/partial-1")
    p.wait_for_selector("li.step[data-step='ask']")


def test_older_runs_follows_the_cursor(page: Page, runs: dict[str, str]) -> None:
    p = page.goto("/ui/?limit=2")
    expect(p.locator("#runs tbody tr")).to_have_count(2)
    first_page = row_ids(p)
    p.click("#older")
    expect(p.locator("#runs tbody tr")).to_have_count(4)
    rows = row_ids(p)
    assert rows[:2] == first_page
    assert len(set(rows)) == 4  # the next page, not the first again


def list_reads(p: Any) -> list[str]:
    """Every request the page makes to the list endpoint from now on (the list is mutated)."""
    seen: list[str] = []
    p.on("request", lambda r: seen.append(r.url) if urlsplit(r.url).path == "/v1/runs" else None)
    return seen


def test_list_is_live_through_the_stream(
    page: Page, server: ServeProcess, runs: dict[str, str]
) -> None:
    p = page.goto("/ui/")
    p.wait_for_selector("body[data-live='stream']")  # the stream is open, the list read once
    p.wait_for_selector("#runs tbody tr[data-run-id='done-1']")
    assert p.locator("#live").inner_text() == "live"
    reads = list_reads(p)
    # Submitted after the page loaded: it appears at the top and its status changes in place.
    # Its first step takes 2.5 s: longer than the 2 s between the reads of a polling page.
    submit(server, "steps", "live-1", {"a": 2.5, "b": 0.0, "c": 0.0})
    p.wait_for_selector("#runs tbody tr[data-run-id='live-1'][data-status='running']")
    assert row_ids(p)[0] == "live-1"
    p.wait_for_selector("#runs tbody tr[data-run-id='live-1'][data-status='completed']")
    assert p.locator("tr[data-run-id='live-1'] .status").inner_text() == "completed"
    assert row_ids(p)[0] == "live-1"
    assert reads == []  # no polling: the stream told it all
    assert p.locator("tr[data-run-id='live-1']").count() == 1


def test_live_list_respects_the_filters(
    page: Page, server: ServeProcess, runs: dict[str, str]
) -> None:
    p = page.goto("/ui/?status=running&chain=steps")
    p.wait_for_selector("body[data-live='stream']")
    reads = list_reads(p)
    # Another chain, and not `solo`: the list test's `solo` filter expects exactly its own runs.
    submit(server, "keyed", "other-chain", {"seconds": 0.0})
    submit(server, "steps", "live-2", {"a": 2.5, "b": 0.0, "c": 0.0})
    # It enters the "running" view when it starts and leaves it when it ends.
    p.wait_for_selector("#runs tbody tr[data-run-id='live-2'][data-status='running']")
    wait_status(server, "other-chain", {"completed", "rejected"})
    p.wait_for_selector("#runs tbody tr[data-run-id='live-2']", state="detached")
    assert wait_status(server, "live-2", {"completed"})["status"] == "completed"
    assert "other-chain" not in row_ids(p)  # another chain: never shown
    assert reads == []


def test_waterfall_bars_are_proportional_to_elapsed(
    page: Page, server: ServeProcess, runs: dict[str, str]
) -> None:
    p = page.goto("/ui/runs/done-1")
    p.wait_for_selector("body[data-stream='ended']")  # the last redraw is done
    bars = p.locator(".bar-elapsed").evaluate_all(
        "bars => bars.map(b => [b.closest('li').dataset.step, Number(b.dataset.elapsedMs),"
        " b.getBoundingClientRect().width, b.getBoundingClientRect().left])"
    )
    by_step = {step: (elapsed, width, left) for step, elapsed, width, left in bars}
    assert set(by_step) == {"first", "second", "third"}  # one bar per step that ran
    # Widths in pixels over elapsed ms: one scale for every bar (a pixel of rounding each way).
    scale = by_step["second"][1] / by_step["second"][0]
    for elapsed, width, _ in by_step.values():
        assert abs(width - elapsed * scale) <= 1.5
    # One time axis: each bar starts at its step's recorded start, on the same scale.
    records = server.get("/v1/runs/done-1/record").json()["records"]
    origin = records["first"]["started_at"]
    for step in ("second", "third"):
        offset_ms = (records[step]["started_at"] - origin) * 1000
        assert abs(by_step[step][2] - by_step["first"][2] - offset_ms * scale) <= 1.5
    assert by_step["first"][2] < by_step["second"][2] < by_step["third"][2]
    skipped = p.locator("li.step[data-step='extra']")
    assert skipped.get_attribute("data-status") == "skipped"
    assert skipped.locator(".bar-elapsed").count() == 0
    assert "optional" in skipped.inner_text()
    assert p.locator("#status").inner_text() == "completed"
    page.shot("dashboard-run.png")


def test_attempts_mark_the_fallback_and_errors_show(page: Page, runs: dict[str, str]) -> None:
    p = page.goto("/ui/runs/partial-1")
    p.wait_for_selector("body[data-stream='ended']")
    ask = p.locator("li.step[data-step='ask']")
    attempts = ask.locator(".attempt")
    assert attempts.count() == 2
    first, second = attempts.nth(0).inner_text(), attempts.nth(1).inner_text()
    assert "primary" in first
    assert "connect" in first
    assert "backup" in second
    assert "fallback" in second
    assert "ok" in second
    assert attempts.nth(1).get_attribute("data-marks") == "fallback"
    assert "answered by fallback backup" in ask.inner_text()
    think = p.locator("li.step[data-step='think']")
    assert think.get_attribute("data-status") == "timed_out"
    assert "timed out" in p.locator("#error").inner_text()
    assert p.locator("li.step[data-step='answer']").get_attribute("data-status") == "pending"
    assert not p.locator("#resume-box").is_hidden()
    assert p.locator("#cancel").is_hidden()
    page.shot("dashboard-run-fallback.png")


def test_a_long_value_is_folded_and_opens(page: Page, server: ServeProcess) -> None:
    label = "long " * 100  # 500 characters: over the 200 at which values are folded
    submit(server, "retry", "long-1", {"q": label})
    wait_status(server, "long-1", {"completed"})
    p = page.goto("/ui/runs/long-1")
    p.wait_for_selector("body[data-stream='ended']")
    folded = p.locator("#input details.fold")
    expect(folded).to_have_count(1)
    assert "characters)" in folded.locator("summary").inner_text()
    full = folded.locator("pre.value")
    assert not full.is_visible()  # folded until clicked
    folded.locator("summary").click()
    expect(full).to_be_visible()
    assert label.strip() in full.inner_text()


def test_concurrency_wait_is_drawn(page: Page, server: ServeProcess, runs: dict[str, str]) -> None:
    submit(server, "keyed", "holder", {"seconds": 1.0})
    wait_status(server, "holder", {"running"})
    time.sleep(0.2)  # the holder's step takes the key as it starts
    submit(server, "keyed", "waiter", {"seconds": 0.0})
    waiter = wait_status(server, "waiter", {"completed"})
    assert waiter["steps"][0]["status"] == "completed"
    p = page.goto("/ui/runs/waiter")
    p.wait_for_selector("body[data-stream='ended']")
    step = p.locator("li.step[data-step='work']")
    wait_bar = step.locator(".bar-wait")
    expect(wait_bar).to_have_count(1)
    assert "desk" in (wait_bar.get_attribute("title") or "")
    assert "waited" in step.inner_text()
    # The wait is part of the step's elapsed time: its bar lies inside the elapsed bar.
    wait_box = wait_bar.bounding_box()
    elapsed_box = step.locator(".bar-elapsed").bounding_box()
    assert wait_box is not None
    assert elapsed_box is not None
    assert 0 < wait_box["width"] <= elapsed_box["width"] + 1


def test_script_in_an_input_shows_as_text(page: Page, runs: dict[str, str]) -> None:
    p = page.goto("/ui/runs/running-1")
    p.wait_for_selector("li.step[data-step='nap'][data-status='running']")
    assert "<script>window.__pwned = 1</script>" in p.locator("#input").inner_text()
    assert p.evaluate("window.__pwned === undefined")
    assert p.locator("#input script, #input img").count() == 0


def test_cancel_button_cancels_a_running_run(
    page: Page, server: ServeProcess, runs: dict[str, str]
) -> None:
    submit(server, "steps", "to-cancel", {"a": 600.0, "b": 0.0, "c": 0.0})
    wait_status(server, "to-cancel", {"running"})
    p = page.goto("/ui/runs/to-cancel")
    p.wait_for_selector("li.step[data-step='first'][data-status='running']")
    dialogs: list[str] = []

    def accept(dialog: Any) -> None:
        dialogs.append(dialog.message)
        dialog.accept()

    p.on("dialog", accept)
    p.click("#cancel")
    p.wait_for_selector("#status.s-cancelled")
    assert dialogs == ["Cancel run to-cancel?"]
    assert server.get("/v1/runs/to-cancel").json()["status"] == "cancelled"
    assert p.locator("#cancel").is_hidden()


def test_dismissed_confirmation_does_nothing(
    page: Page, server: ServeProcess, runs: dict[str, str]
) -> None:
    p = page.goto("/ui/runs/running-1")
    p.wait_for_selector("#cancel:not([hidden])")
    p.on("dialog", lambda dialog: dialog.dismiss())
    p.click("#cancel")
    p.wait_for_timeout(300)  # a cancel would be answered in well under this on the loopback
    assert server.get("/v1/runs/running-1").json()["status"] == "running"


def test_resume_button_finishes_a_partial_run(
    page: Page, server: ServeProcess, runs: dict[str, str]
) -> None:
    submit(server, "agent", "to-resume", {"q": "Say OK", "seconds": 1.0}, budget="2s")
    wait_status(server, "to-resume", {"partial"})
    p = page.goto("/ui/runs/to-resume")
    p.wait_for_selector("#resume-box:not([hidden])")
    p.on("dialog", lambda dialog: dialog.accept())
    p.fill("#resume-budget", "30s")
    p.click("#resume")
    p.wait_for_selector("#status.s-completed", timeout=60_000)
    final = server.get("/v1/runs/to-resume").json()
    assert final["status"] == "completed"
    assert final["budget"]["total_ms"] > 1000  # it was given the 30 s more
    statuses = p.locator("li.step").evaluate_all("s => s.map(x => x.dataset.status)")
    assert statuses == ["completed", "completed", "completed"]


@pytest.mark.parametrize("path", ["/ui/", "/ui/runs/partial-1"])
def test_phone_width_has_no_sideways_scroll(
    browser: Any, server: ServeProcess, runs: dict[str, str], path: str
) -> None:
    phone = Page(browser, server.url, width=390)
    p = phone.goto(path)
    p.wait_for_selector("#runs tbody tr, li.step")
    assert p.evaluate("document.documentElement.scrollWidth <= window.innerWidth")
    if path != "/ui/":
        phone.shot("dashboard-run-phone.png")
    p.close()
    assert phone.errors == []


def test_assets_are_served_from_the_package_only(server: ServeProcess) -> None:
    page = httpx.get(f"{server.url}/ui/", timeout=10)
    assert page.status_code == 200
    assert "default-src 'self'" in page.headers["content-security-policy"]
    assert "://" not in page.text  # nothing from another origin
    assert httpx.get(f"{server.url}/ui/static/../_app.py", timeout=10).status_code == 404
    assert httpx.get(f"{server.url}/ui/static/nope.js", timeout=10).status_code == 404


def test_run_page_shows_tokens_while_the_step_streams(
    page: Page, server: ServeProcess, runs: dict[str, str]
) -> None:
    # The page opens during the first step (a 3 s nap), so its stream is open when the LLM
    # step starts: tokens arrive only live (a step's record keeps its text, not its tokens).
    submit(server, "talk", "talk-1", {"seconds": 3.0})
    wait_status(server, "talk-1", {"running"})
    p = page.goto("/ui/runs/talk-1")
    p.wait_for_selector("li.step[data-step='wait'][data-status='running']")
    # Tokens shown while the step is still running (drawn from token events, not a record).
    shown = p.wait_for_function(
        """() => {
            const step = document.querySelector("li.step[data-step='say']");
            const tokens = step && step.querySelector("pre.tokens");
            const ok = tokens && tokens.textContent.length >= 8 && step.dataset.status === "running";
            return ok ? tokens.textContent : null;
        }""",
        timeout=60_000,
    ).json_value()
    final = wait_status(server, "talk-1", {"completed", "partial", "failed"}, within_s=110)
    assert final["status"] == "completed", server.get("/v1/runs/talk-1/record").json()
    output = final["output"]
    assert output.startswith(shown)  # the streamed text is the answer's beginning ...
    assert len(shown) < len(output)  # ... shown before the whole answer was there
    p.wait_for_selector("li.step[data-step='say'][data-status='completed']")
    page.shot("dashboard-run-tokens.png")
