"""Runs that wait for a signal: parking, early signals, bad payloads, timeouts, keys released."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

import pytest

import chainrt
from chainrt import Runtime
from chainrt.errors import SignalRefused

TOOLS = """
import time


def lookup(order_id: str) -> dict:
    return {"order_id": order_id, "amount": 120}


def slow_lookup(order_id: str) -> dict:
    time.sleep(0.6)
    return {"order_id": order_id, "amount": 120}


def refund(order: dict, decision: object) -> dict:
    approved = isinstance(decision, dict) and decision.get("approved") is True
    return {"refunded": order["amount"] if approved else 0, "decision": decision}
"""

CHAIN = """
name: refund
budget: 20s
inputs: {order_id: str}
concurrency:
  - {key: "order:{{ input.order_id }}", limit: 1}
steps:
  - id: order
    tool: tools.py:%(lookup)s
    args: {order_id: "{{ input.order_id }}"}
  - id: approve
    weight: 0.1
    wait:
      signal: manager_ok
      schema: {approved: bool, "note?": str}
%(extra)s
  - id: act
    tool: tools.py:refund
    args: {order: "{{ steps.order.output }}", decision: "{{ steps.approve.output }}"}
"""


def chain_file(tmp_path: Path, *, lookup: str = "lookup", extra: str = "") -> Path:
    (tmp_path / "tools.py").write_text(TOOLS)
    path = tmp_path / "refund.yaml"
    path.write_text(CHAIN % {"lookup": lookup, "extra": extra})
    return path


async def test_a_run_parks_then_the_signal_continues_it(store_url: str, tmp_path: Path) -> None:
    chain = chainrt.load(chain_file(tmp_path))
    async with Runtime(store=store_url) as rt:
        parked = await rt.run(chain, {"order_id": "o1"}, run_id="w-park")
        assert (parked.status, parked.stopped_at) == ("waiting", "approve")
        assert parked.error is not None
        assert "manager_ok" in parked.error
        record = await rt.store.get_run("w-park")
        assert (record.status, record.owner) == ("waiting", None)
        used_at_park = record.budget_used_ms
        t0 = time.perf_counter()
        await asyncio.sleep(0.5)
        done = await rt.signal("w-park", "manager_ok", {"approved": True})
        waited_ms = (time.perf_counter() - t0) * 1000
        assert done.status == "completed"
        assert done.output == {"refunded": 120, "decision": {"approved": True}}
        record = await rt.store.get_run("w-park")
        recorded_wait = record.waits_ms["wait:approve"]
        # The time parked is recorded apart from the budget: it is at least the sleep, and the
        # budget grew by less than that (only the second execution's own time).
        assert 500 <= recorded_wait <= waited_ms + 50
        assert record.budget_used_ms - used_at_park < recorded_wait
        steps = await rt.store.get_steps("w-park")
        assert steps["approve"].status == "completed"
        assert steps["approve"].output == {"approved": True}


async def test_an_early_signal_is_not_lost(store_url: str, tmp_path: Path) -> None:
    chain = chainrt.load(chain_file(tmp_path, lookup="slow_lookup"))
    async with Runtime(store=store_url) as rt:
        task = asyncio.ensure_future(rt.run(chain, {"order_id": "o2"}, run_id="w-early"))
        for _ in range(200):  # the run record exists once the first step runs
            try:
                await rt.store.get_run("w-early")
                break
            except chainrt.RunNotFound:
                await asyncio.sleep(0.01)
        sent = await rt.signal("w-early", "manager_ok", {"approved": False, "note": "no"})
        assert sent.status == "running"  # not parked: nothing to continue
        result = await task
        assert result.status == "completed"
        assert result.output["decision"] == {"approved": False, "note": "no"}
        assert (await rt.store.get_run("w-early")).waits_ms["wait:approve"] == 0.0


async def test_a_bad_payload_or_name_is_refused_and_the_run_keeps_waiting(
    store_url: str, tmp_path: Path
) -> None:
    chain = chainrt.load(chain_file(tmp_path))
    async with Runtime(store=store_url) as rt:
        await rt.run(chain, {"order_id": "o3"}, run_id="w-bad")
        with pytest.raises(SignalRefused, match="does not match the wait's schema") as bad:
            await rt.signal("w-bad", "manager_ok", {"approved": "yes"})
        assert not bad.value.conflict
        with pytest.raises(SignalRefused, match="has no wait for signal 'other'") as unknown:
            await rt.signal("w-bad", "other", {})
        assert unknown.value.conflict
        assert await rt.store.get_signal("w-bad", "manager_ok") is None
        assert (await rt.store.get_run("w-bad")).status == "waiting"
        assert (await rt.signal("w-bad", "manager_ok", {"approved": True})).status == "completed"
        with pytest.raises(SignalRefused, match="has ended"):
            await rt.signal("w-bad", "manager_ok", {"approved": True})


async def test_a_parked_run_holds_no_concurrency_key(store_url: str, tmp_path: Path) -> None:
    # The chain's key allows one run per order at a time: a second run of the same order can
    # only start because the first one gave its key back when it parked.
    chain = chainrt.load(chain_file(tmp_path))
    async with Runtime(store=store_url) as rt:
        first = await rt.run(chain, {"order_id": "o4"}, run_id="w-k1")
        second = await rt.run(chain, {"order_id": "o4"}, run_id="w-k2", budget="3s")
        assert (first.status, second.status) == ("waiting", "waiting")
        for run_id in ("w-k1", "w-k2"):
            done = await rt.signal(run_id, "manager_ok", {"approved": True})
            assert done.status == "completed"


@pytest.mark.parametrize(
    ("on_timeout", "status", "output"),
    [("fail", "failed", None), ("continue", "completed", {"refunded": 0, "decision": None})],
)
async def test_a_wait_past_its_timeout(
    tmp_path: Path, on_timeout: str, status: str, output: object
) -> None:
    extra = f"      timeout: 200ms\n      on_timeout: {on_timeout}"
    chain = chainrt.load(chain_file(tmp_path, extra=extra))
    async with Runtime(store=f"sqlite:///{tmp_path / 'runs.db'}") as rt:
        assert (await rt.run(chain, {"order_id": "o5"}, run_id="w-t")).status == "waiting"
        await asyncio.sleep(0.3)
        result = await rt.resume("w-t")
        assert (result.status, result.output) == (status, output)
        if on_timeout == "fail":
            assert result.error is not None
            assert "no signal 'manager_ok' came within" in result.error
        waited = (await rt.store.get_run("w-t")).waits_ms["wait:approve"]
        assert waited == pytest.approx(200.0)


async def test_a_resume_without_the_signal_parks_again(tmp_path: Path) -> None:
    chain = chainrt.load(chain_file(tmp_path))
    async with Runtime(store=f"sqlite:///{tmp_path / 'runs.db'}") as rt:
        await rt.run(chain, {"order_id": "o6"}, run_id="w-again")
        since = (await rt.store.get_steps("w-again"))["approve"].output["since"]
        again = await rt.resume("w-again")
        assert again.status == "waiting"
        # The wait still counts from when the run first reached it.
        assert (await rt.store.get_steps("w-again"))["approve"].output["since"] == since


async def test_a_wait_inside_a_switch_branch(tmp_path: Path) -> None:
    (tmp_path / "tools.py").write_text(TOOLS)
    path = tmp_path / "route.yaml"
    path.write_text(
        """
name: route
budget: 10s
inputs: {kind: str}
steps:
  - id: route
    switch: "{{ input.kind }}"
    cases:
      refund:
        - {id: approve, wait: {signal: ok, schema: {approved: bool}}}
        - {id: after, tool: "tools.py:lookup", args: {order_id: "x"}}
    default:
      - {id: other, tool: "tools.py:lookup", args: {order_id: "y"}}
"""
    )
    chain = chainrt.load(path)
    async with Runtime(store=f"sqlite:///{tmp_path / 'runs.db'}") as rt:
        parked = await rt.run(chain, {"kind": "refund"}, run_id="w-sw")
        # Stopped at the group, as any stop inside a group; the error names the inner step.
        assert (parked.status, parked.stopped_at) == ("waiting", "route")
        assert parked.error is not None
        assert "route.refund.approve" in parked.error
        done = await rt.signal("w-sw", "ok", {"approved": True})
        assert done.status == "completed"
        assert done.output == {"order_id": "x", "amount": 120}


async def test_a_signal_kept_as_the_run_parks_is_not_lost(tmp_path: Path) -> None:
    # The crossing: the runner found no signal and parked; the signal was kept between the
    # two, and its sender saw the run still running (so it continues nothing). The runner
    # looks again after parking and continues the run itself.
    from chainrt.runs._signals import continue_parked
    from chainrt.store._signals import SignalRecord

    chain = chainrt.load(chain_file(tmp_path))
    async with Runtime(store=f"sqlite:///{tmp_path / 'runs.db'}") as rt:
        parked = await rt.run(chain, {"order_id": "o7"}, run_id="w-cross")
        assert parked.status == "waiting"
        await rt.store.put_signal(
            "w-cross", SignalRecord(name="manager_ok", payload={"approved": True})
        )
        done = await continue_parked(rt.store, parked, lambda run_id: rt.resume(run_id, wait=False))
        assert done.status == "completed"
        assert done.output["refunded"] == 120


EXAMPLE = Path(__file__).resolve().parent.parent / "chains" / "approval_example.yaml"


async def test_the_approval_example(tmp_path: Path) -> None:
    chain = chainrt.load(EXAMPLE)
    async with Runtime(store=f"sqlite:///{tmp_path / 'runs.db'}") as rt:
        small = await rt.run(chain, {"order_id": "1077"})
        assert (small.status, small.output) == (
            "completed",
            {"refunded": True, "cents": 3550, "currency": "EUR"},
        )
        large = await rt.run(chain, {"order_id": "1001"}, run_id="ex-large")
        assert (large.status, large.stopped_at) == ("waiting", "approve")
        no = await rt.signal("ex-large", "refund_ok", {"approved": False, "note": "too late"})
        assert (no.status, no.output) == ("completed", {"refunded": False, "why": "too late"})


async def test_a_runnable_of_a_waiting_chain_raises_then_continues(tmp_path: Path) -> None:
    from langchain_core.runnables import RunnableConfig

    from chainrt.langchain import RunIncomplete

    store = f"sqlite:///{tmp_path / 'runs.db'}"
    runnable = chainrt.load(chain_file(tmp_path)).as_runnable(store=store)
    config = RunnableConfig(configurable={"run_id": "w-lc"})
    with pytest.raises(RunIncomplete, match="is waiting at step approve") as info:
        await runnable.ainvoke({"order_id": "o8"}, config=config)
    assert info.value.result.status == "waiting"
    assert "send the signal, then resume it" in info.value.message
    async with Runtime(store=store) as rt:
        kept = await rt.signal("w-lc", "manager_ok", {"approved": True}, resume=False)
        assert kept.status == "waiting"
    output = await runnable.ainvoke({"order_id": "o8"}, config=config)
    assert output == {"refunded": 120, "decision": {"approved": True}}


async def test_a_waiting_run_can_be_cancelled_and_then_refuses_signals(
    store_url: str, tmp_path: Path
) -> None:
    chain = chainrt.load(chain_file(tmp_path))
    async with Runtime(store=store_url) as rt:
        await rt.run(chain, {"order_id": "o9"}, run_id="w-cancel")
        cancelled = await rt.cancel("w-cancel")
        assert (cancelled.status, cancelled.stopped_at) == ("cancelled", "approve")
        with pytest.raises(SignalRefused, match="has ended \\(cancelled\\)"):
            await rt.signal("w-cancel", "manager_ok", {"approved": True})


async def test_signals_racing_the_park_are_never_lost(store_url: str, tmp_path: Path) -> None:
    # 40 runs, each signalled at a random moment around the time it reaches its wait: before
    # (kept early), while it parks (the crossing), or after (continues it). Every run must end
    # completed with its own payload, none left waiting.
    import random

    chain = chainrt.load(chain_file(tmp_path))
    rng = random.Random(38)
    async with Runtime(store=store_url) as rt:

        async def signal_soon(run_id: str, n: int) -> None:
            await asyncio.sleep(rng.uniform(0, 0.05))
            while True:
                try:
                    await rt.signal(run_id, "manager_ok", {"approved": True, "note": str(n)})
                    return
                except chainrt.RunNotFound:
                    await asyncio.sleep(0.001)

        ids = [f"w-race-{n}" for n in range(40)]
        runs = [rt.run(chain, {"order_id": f"r{n}"}, run_id=ids[n]) for n in range(40)]
        signals = [signal_soon(ids[n], n) for n in range(40)]
        await asyncio.gather(*runs, *signals, return_exceptions=False)
        for n, run_id in enumerate(ids):
            for _ in range(200):  # a continuation started by a signal may still be finishing
                record = await rt.store.get_run(run_id)
                if record.status == "completed":
                    break
                await asyncio.sleep(0.02)
            assert record.status == "completed", (run_id, record.status, record.error)
            assert record.output["decision"] == {"approved": True, "note": str(n)}
