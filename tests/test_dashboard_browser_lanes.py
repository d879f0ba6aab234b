"""The run page draws a group's parallel branches and map items as lanes under the group, in a
real headless Chromium against a real ``chainrt serve`` (SQLite store).

``lanes`` has a ``parallel`` group with ``join: any`` (``quick`` ends in 20 ms, ``slow`` would
take 3 s and is cancelled) followed by a ``map`` of three items of two steps each.
"""

from __future__ import annotations

import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from browser_fixtures import (
    BROWSER_TEST,
    Page,
    checked_page,
    chromium,
    submit,
    wait_status,
)

from chainrt.testing.serve_process import ServeProcess

pytestmark = BROWSER_TEST
sync_api = pytest.importorskip(
    "playwright.sync_api", reason="playwright is not installed (the dev extra has it)"
)

TOOLS = Path(__file__).parent / "data" / "chains" / "flow" / "tools.py"
CHAIN = """\
name: lanes
budget: 10s
inputs: {items: list}
steps:
  - id: race
    parallel:
      quick: [{id: quick, tool: tools.py:step, args: {name: quick, ms: 20}}]
      slow: [{id: slow, tool: tools.py:step, args: {name: slow, ms: 3000}}]
    join: any
  - id: per_item
    map: "{{ input.items }}"
    max_concurrency: 3
    steps:
      - {id: fetch, tool: tools.py:step, args: {name: fetch, ms: 30}}
      - {id: label, tool: tools.py:step, args: {name: label, value: "{{ index }}:{{ item }}"}}
"""


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServeProcess]:
    folder = tmp_path_factory.mktemp("dashboard-lanes")
    chains = folder / "chains"
    chains.mkdir()
    shutil.copy(TOOLS, chains / "tools.py")
    (chains / "lanes.yaml").write_text(CHAIN)
    with ServeProcess(store=f"sqlite:///{folder / 'runs.db'}", chains=chains, drain="1s") as runner:
        yield runner


@pytest.fixture(scope="module")
def browser() -> Iterator[Any]:
    with chromium() as launched:
        yield launched


@pytest.fixture
def page(browser: Any, server: ServeProcess) -> Iterator[Page]:
    with checked_page(browser, server.url) as opened:
        yield opened


def test_branches_and_items_are_lanes_under_their_group(page: Page, server: ServeProcess) -> None:
    submit(server, "lanes", "lanes-1", {"items": ["a", "b", "c"]})
    wait_status(server, "lanes-1", {"completed"})
    p = page.goto("/ui/runs/lanes-1")
    p.wait_for_selector("body[data-stream='ended']")
    race = p.locator("li.step[data-step='race']")
    assert race.locator(".kind").inner_text() == "parallel"
    lanes = race.locator("ul.lanes[data-group='race'] > li.lane")
    assert [lanes.nth(i).get_attribute("data-lane") for i in range(lanes.count())] == [
        "race.quick",
        "race.slow",
    ]
    quick = race.locator("li.lane[data-lane='race.quick'] .bar-elapsed")
    assert quick.get_attribute("data-path") == "race.quick.quick"
    assert quick.get_attribute("data-status") == "completed"
    # The loser of join: any is drawn cancelled, its bar cut where the group ended.
    slow = race.locator("li.lane[data-lane='race.slow']")
    assert slow.get_attribute("data-status") == "cancelled"
    assert slow.locator(".bar-elapsed").get_attribute("data-status") == "cancelled"
    assert "cancelled" in (slow.locator(".bar-elapsed").get_attribute("title") or "")

    items = p.locator("li.step[data-step='per_item'] ul.lanes > li.lane")
    assert [items.nth(i).get_attribute("data-lane") for i in range(items.count())] == [
        "per_item[0]",
        "per_item[1]",
        "per_item[2]",
    ]
    assert items.nth(1).locator(".lane-name").inner_text() == "item 1"
    bars = items.nth(1).locator(".bar-elapsed")
    assert [bars.nth(i).get_attribute("data-path") for i in range(bars.count())] == [
        "per_item[1].fetch",
        "per_item[1].label",
    ]
    # Lanes share the run's axis (a bar's left is its start on it): the map's items started
    # after the parallel group's quick branch.
    lefts = [
        float(items.nth(i).locator(".bar-elapsed").first.evaluate("e => e.offsetLeft"))
        for i in range(3)
    ]
    race_left = float(quick.evaluate("e => e.offsetLeft"))
    assert min(lefts) > race_left
    page.shot("lanes.png")
