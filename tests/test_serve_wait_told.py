"""``?wait=`` for a run this server executes answers with the result the run's ``run_finished``
carries (sent after its final write) instead of reading the record and the steps back
(chainrt/serve/_watch.py ``wait_final``): the same answer the store's records give, for a
completed, a partial (out of budget) and a cancelled run."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path
from typing import Any

import pytest

from chainrt._result import RunResult
from chainrt.serve import ServeConfig, Service, SubmitRequest

CHAINS = Path(__file__).parent / "data" / "serve"


async def _from_store(service: Service, run_id: str) -> dict[str, Any]:
    store = service.runtime.store
    record, steps = await store.get_run(run_id), await store.get_steps(run_id)
    return RunResult.from_records(record, steps).model_dump(mode="json")


def _count_step_reads(service: Service, monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """The run ids whose steps are read from the store from now on (until ``undo``)."""
    store = service.runtime.store
    read: list[str] = []
    real = store.get_steps

    async def counted(run_id: str) -> Any:
        read.append(run_id)
        return await real(run_id)

    monkeypatch.setattr(store, "get_steps", counted)
    return read


@pytest.fixture
async def service(redis_url: str) -> Any:
    served = Service(ServeConfig(chains=str(CHAINS), store=redis_url))
    await served.start()
    yield served
    await asyncio.wait_for(served.stop(drain_s=1), 30)


async def test_the_told_result_is_the_stored_one(
    service: Service, monkeypatch: pytest.MonkeyPatch
) -> None:
    read = _count_step_reads(service, monkeypatch)
    await service.submit(SubmitRequest(chain="five", input={}, run_id="ok"))
    await service.submit(
        SubmitRequest(chain="ten", input={"seconds": 0.05}, run_id="late", budget="120ms")
    )
    await service.submit(
        SubmitRequest(chain="nap", input={"seconds": 30, "label": "x"}, run_id="stopped")
    )
    waited = [asyncio.ensure_future(service.result(run_id, 30)) for run_id in ("ok", "late")]
    stopped = asyncio.ensure_future(service.result("stopped", 30))
    deadline = time.monotonic() + 10
    while (await service.runtime.store.get_run("stopped")).status != "running":
        assert time.monotonic() < deadline
        await asyncio.sleep(0.02)
    await service.cancel("stopped")
    results = [*(await asyncio.gather(*waited)), await stopped]
    assert [r.status for r in results] == ["completed", "partial", "cancelled"]
    assert results[0].output == 1
    assert results[1].error  # out of budget (steps left undone): says why
    # Neither run that ended by itself had its steps read back: each was told by its end.
    assert "ok" not in read
    assert "late" not in read
    monkeypatch.undo()
    for result in results:
        assert result.model_dump(mode="json") == await _from_store(service, result.run_id)


async def test_the_told_json_is_handed_on_and_is_the_stored_one(
    service: Service, monkeypatch: pytest.MonkeyPatch
) -> None:
    read = _count_step_reads(service, monkeypatch)
    await service.submit(SubmitRequest(chain="ten", input={"seconds": 0.05}, run_id="j1"))
    body = await service.result_json("j1", 30)
    assert read == []  # told by its end: nothing read back
    monkeypatch.undo()
    assert body["status"] == "completed"
    assert body["output"] == 45
    assert body == await _from_store(service, "j1")
    assert await service.result_json("j1") == body  # read from the store: the same
