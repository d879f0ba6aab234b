"""Per-run set-up of a reused runtime: what depends only on the chain is computed once per spec
object (its dump, its JSON, a new run's budget plan), chain roots are resolved once, and a run's
first stretch starts in the caller's turn (bench/runtime_reuse.py)."""

from __future__ import annotations

import asyncio
import gc
import json
import os
from pathlib import Path
from typing import Any

import pytest

import chainrt
from chainrt import Runtime
from chainrt._progress import Progress
from chainrt._records import RunRecord
from chainrt._run import plan_for, step_budget
from chainrt.budget import _steps as budget
from chainrt.errors import InputError, RecordTooLarge
from chainrt.spec import ChainSpec, _dump, _roots, spec_from_dict
from chainrt.spec._dump import spec_dump, spec_json
from chainrt.store._codec import encode

CHAINS = Path(__file__).parent / "data" / "chains"


def _spec(name: str = "cached") -> ChainSpec:
    return spec_from_dict({"name": name, "budget": "1s", "steps": [{"id": "a", "tool": "t.py:f"}]})


def test_spec_dump_is_the_model_dump_computed_once() -> None:
    spec = _spec()
    first = spec_dump(spec)
    assert first == spec.model_dump(mode="json", by_alias=True)
    assert spec_dump(spec) is first
    other = _spec("other")
    assert spec_dump(other)["name"] == "other"


def test_spec_dump_entry_goes_with_its_spec() -> None:
    spec = _spec("short-lived")
    spec_dump(spec)
    key = id(spec)
    assert key in _dump._dumps._values
    del spec
    gc.collect()
    assert key not in _dump._dumps._values


def test_absolute_chain_root_is_resolved_once(tmp_path: Path) -> None:
    real = tmp_path / "real"
    real.mkdir()
    link = tmp_path / "link"
    link.symlink_to(real)
    _roots.add_chain_root(link)
    assert real.resolve() in _roots.chain_roots()
    assert os.fspath(link) in _roots._given
    _roots.add_chain_root(link)  # the cached path: still one root, not two
    assert _roots.chain_roots().count(real.resolve()) == 1


def test_relative_chain_root_is_resolved_each_time(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    (tmp_path / "rel").mkdir()
    monkeypatch.chdir(tmp_path)
    _roots.add_chain_root("rel")
    assert "rel" not in _roots._given  # depends on the working directory: never cached
    assert (tmp_path / "rel").resolve() in _roots.chain_roots()


# -- the spec's JSON serialised once ------------------------------------------------------------


def _record(spec: ChainSpec, **fields: Any) -> RunRecord:
    return RunRecord(
        run_id="r1",
        chain=spec.name,
        spec=spec_dump(spec),
        source="/chains/é",
        input={"text": "ünïcode \u2028 and a lone \\ backslash", "n": 1e21, "f": 0.1},
        budget_total_ms=1234.5,
        created_at=1.5,
        updated_at=2.5,
        **fields,
    )


def _rich_spec() -> ChainSpec:
    return spec_from_dict(
        {
            "name": "rich",
            "description": 'quotes " and \\ and 日本語',
            "budget": "1.5s",
            "inputs": {"text": "str"},
            "steps": [
                {"id": "a", "tool": "t.py:f", "weight": 2.5, "args": {"x": 1e-7, "y": [1, None]}},
                {"id": "b", "tool": "t.py:g", "optional": True, "min": "10ms"},
            ],
        }
    )


def test_a_record_with_its_spec_json_attached_encodes_to_the_same_bytes() -> None:
    limit = 10_000_000
    spec = _rich_spec()
    plain = _record(spec)
    attached = _record(spec)
    attached.attach_spec_json(spec_json(spec))
    assert attached.spec_json() is not None
    assert encode(attached, limit=limit, what="run") == encode(plain, limit=limit, what="run")
    assert spec_json(spec) is spec_json(spec)  # serialised once per spec object


def test_a_copy_given_another_spec_is_serialised_afresh() -> None:
    spec, other = _rich_spec(), _spec("other")
    record = _record(spec)
    record.attach_spec_json(spec_json(spec))
    signed = record.model_copy(update={"mac": "hmac-sha256:00"})  # same spec: still attached
    assert signed.spec_json() == spec_json(spec)
    moved = record.model_copy(update={"spec": spec_dump(other), "chain": "other"})
    assert moved.spec_json() is None
    data = encode(moved, limit=10_000_000, what="run")
    assert json.loads(data)["spec"]["name"] == "other"


def test_the_size_limit_counts_the_attached_spec() -> None:
    spec = _rich_spec()
    record = _record(spec)
    record.attach_spec_json(spec_json(spec))
    size = len(encode(record, limit=10_000_000, what="run"))
    with pytest.raises(RecordTooLarge):
        encode(record, limit=size - 1, what="run")


# -- a new run's budget plan kept per spec --------------------------------------------------------


def test_a_new_runs_plan_is_built_once_per_spec_and_a_resumes_is_its_own() -> None:
    spec = _rich_spec()
    plan = plan_for(spec, list(spec.steps))
    assert plan_for(spec, list(spec.steps)) is plan
    fresh = budget.Plan([step_budget(s) for s in spec.steps])
    for index in range(len(spec.steps)):
        for remaining in (0.0, 5.0, 700.0, 1500.0):
            assert plan.decide(index, remaining) == fresh.decide(index, remaining)
    rest = [spec.steps[1]]  # a resume: the first step is recorded
    partial = plan_for(spec, rest)
    assert partial is not plan
    assert partial.steps == (step_budget(spec.steps[1]),)


# -- a reused runtime's run starts in its own task, in the caller's turn -------------------------


class _Seen(Progress):
    def __init__(self, runtime: Runtime) -> None:
        self.runtime = runtime
        self.task: asyncio.Task[Any] | None = None
        self.active: list[str] = []

    def run_started(self, record: RunRecord, *, resumed: bool) -> None:
        self.task = asyncio.current_task()
        self.active = self.runtime.active()


async def test_a_run_is_registered_and_runs_as_its_own_task_from_its_first_stretch(
    tmp_path: Path,
) -> None:
    chain = chainrt.load(CHAINS / "noop.yaml")
    async with Runtime(store=f"sqlite:///{tmp_path / 'runs.db'}") as rt:
        seen = _Seen(rt)
        result = await rt.run(chain, {}, run_id="eager-1", progress=seen)
        assert result.status == "completed"
        assert len(result.steps) == 10
        assert seen.active == ["eager-1"]  # cancellable from its very first checkpoint
        assert seen.task is not None
        assert seen.task is not asyncio.current_task()
        assert rt.active() == []
        with pytest.raises(InputError):  # raised in the first stretch: nothing stays active
            await rt.run(chain, {}, run_id="bad id")
        assert rt.active() == []
