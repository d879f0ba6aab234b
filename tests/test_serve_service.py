"""``chainrt.serve.Service`` in process on SQLite: what a submit writes, and a clean stop."""

from __future__ import annotations

import asyncio
from pathlib import Path

from chainrt.serve import ServeConfig, Service, SubmitRequest
from chainrt.spec._dump import spec_dump, spec_json

CHAINS = Path(__file__).parent / "data" / "serve"


async def test_submit_reuses_the_spec_json_of_its_chain_and_the_run_completes(
    tmp_path: Path,
) -> None:
    service = Service(ServeConfig(chains=str(CHAINS), store=f"sqlite:///{tmp_path / 'r.db'}"))
    await service.start()
    try:
        spec = service.chain("five").spec
        outcomes = [
            await service.submit(SubmitRequest(chain="five", input={}, run_id=f"r{i}"))
            for i in range(2)
        ]
        for outcome in outcomes:
            assert outcome.kind == "created"
            # The spec is serialised once per spec object, not once per submit: the record
            # carries the cached JSON, which the store writes as it is.
            assert outcome.run.spec == spec_dump(spec)
            assert outcome.run.spec_json() is spec_json(spec)
        for i in range(2):
            result = await service.result(f"r{i}", wait_s=30)
            assert (result.status, result.output) == ("completed", 1)
            stored = await service.runtime.store.get_run(f"r{i}")
            assert stored.spec == spec.model_dump(mode="json", by_alias=True)  # same content
    finally:
        await asyncio.wait_for(service.stop(drain_s=1), 30)
