"""The spec of a stored run is validated once per spec JSON (chainrt/spec/_stored.py): a run
submitted in this process starts from the spec its chain already has, not validated again."""

from __future__ import annotations

from typing import Any

import pytest

from chainrt._records import RunRecord
from chainrt.errors import SpecError
from chainrt.spec import _stored as stored
from chainrt.spec import spec_from_dict
from chainrt.spec._dump import spec_dump, spec_json

CHAIN: dict[str, Any] = {
    "name": "three",
    "budget": "1m",
    "steps": [{"id": f"s{i}", "tool": "tools.py:noop"} for i in range(3)],
}


def record(spec: dict[str, Any], run_id: str = "r1", data: bytes | None = None) -> RunRecord:
    made = RunRecord(run_id=run_id, chain="three", spec=spec, input={}, budget_total_ms=60_000)
    if data is not None:
        made.attach_spec_json(data)
    return made


@pytest.fixture(autouse=True)
def empty() -> None:
    stored._kept.clear()


def test_a_record_with_its_spec_json_is_validated_once() -> None:
    spec = spec_from_dict(CHAIN)
    first = stored.stored_spec(record(spec_dump(spec), "a", spec_json(spec)))
    second = stored.stored_spec(record(spec_dump(spec), "b", spec_json(spec)))
    assert first is second  # one validation served both runs
    assert first == spec  # and it is the chain's spec


def test_a_record_read_back_without_json_is_validated_each_time() -> None:
    spec = spec_from_dict(CHAIN)
    first = stored.stored_spec(record(spec_dump(spec), "a"))
    second = stored.stored_spec(record(spec_dump(spec), "b"))
    assert first == second == spec
    assert first is not second
    assert not stored._kept


def test_another_spec_is_another_entry_and_the_oldest_goes_first() -> None:
    specs = []
    for n in range(stored.MAX_KEPT + 1):
        spec = spec_from_dict({**CHAIN, "name": f"c{n}"})
        specs.append(spec)
        got = stored.stored_spec(record(spec_dump(spec), f"r{n}", spec_json(spec)))
        assert got.name == f"c{n}"
    assert len(stored._kept) == stored.MAX_KEPT
    assert spec_json(specs[0]) not in stored._kept
    assert spec_json(specs[-1]) in stored._kept


def test_a_bad_stored_spec_is_refused_and_not_kept() -> None:
    bad = {**CHAIN, "steps": [{"id": "s0"}]}  # a step of no kind
    with pytest.raises(SpecError, match="stored spec of run r9"):
        stored.stored_spec(record(bad, "r9", b'{"not": "checked"}'))
    assert not stored._kept
