"""A passed trust check is reused for a short while (chainrt/runs/_trust.py): a burst of one
chain's runs does not resolve its folder and tool paths for every run, and a change that
should refuse the next runs does so once the memo's time is up."""

from __future__ import annotations

import time
from collections.abc import Sequence
from pathlib import Path

import pytest

from chainrt import UntrustedRecord
from chainrt._records import RunRecord
from chainrt.runs import _trust
from chainrt.runs._trust import RecordTrust
from chainrt.spec import ChainSpec, spec_from_dict
from chainrt.spec._imports import reference_problem


def _record(
    folder: Path, run_id: str = "r1", tool: str = "tools.py:echo"
) -> tuple[RunRecord, ChainSpec]:
    spec = spec_from_dict(
        {"name": "c", "budget": "5s", "steps": [{"id": "s", "tool": tool, "args": {}}]}
    )
    record = RunRecord(
        run_id=run_id,
        chain="c",
        spec=spec.model_dump(mode="json", by_alias=True),
        source=str(folder),
        input={},
        budget_total_ms=5000,
    )
    return record, spec


@pytest.fixture
def chains(tmp_path: Path) -> Path:
    folder = tmp_path / "chains"
    folder.mkdir()
    (folder / "tools.py").write_text("def echo():\n    return 1\n")
    return folder


def test_a_passed_check_is_reused_then_checked_again(
    chains: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    trust = RecordTrust(roots=(chains,))
    now = [1000.0]
    monkeypatch.setattr(time, "monotonic", lambda: now[0])
    resolved: list[str] = []
    real = reference_problem

    def counted(ref: str, chain_dir: Path, allowed: Sequence[str]) -> str | None:
        resolved.append(ref)
        return real(ref, chain_dir, allowed)

    monkeypatch.setattr(_trust, "reference_problem", counted)
    record, spec = _record(chains)
    assert trust.check(record, spec) == chains.resolve()
    other, _ = _record(chains, run_id="r2")
    assert trust.check(other, spec) == chains.resolve()
    assert resolved == ["tools.py:echo"]  # the second run of the same folder and tools: reused

    (chains / "tools.py").unlink()  # removed: refused once the memo's time is up
    now[0] += _trust._PASSED_FOR_S + 0.01
    with pytest.raises(UntrustedRecord, match=r"no file 'tools\.py'"):
        trust.check(other, spec)
    with pytest.raises(UntrustedRecord):  # a refusal is never kept as a pass
        trust.check(other, spec)
    assert len(resolved) == 3


def test_other_references_or_folders_are_checked_on_their_own(chains: Path, tmp_path: Path) -> None:
    trust = RecordTrust(roots=(chains,))
    record, spec = _record(chains)
    trust.check(record, spec)
    # Same folder, another tool: not covered by the pass of the first.
    bad, bad_spec = _record(chains, tool="../escape.py:run")
    with pytest.raises(UntrustedRecord, match="outside the chain's directory"):
        trust.check(bad, bad_spec)
    # Same tool, a folder outside the roots.
    outside = tmp_path / "elsewhere"
    outside.mkdir()
    (outside / "tools.py").write_text("def echo():\n    return 1\n")
    moved, _ = _record(outside)
    with pytest.raises(UntrustedRecord, match="outside this runner's chain roots"):
        trust.check(moved, spec)
