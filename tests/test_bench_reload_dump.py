"""``bench/reload.py --from-dump``: the report printed again from dumps, episodes of several runs
pooled, each run's requests kept to its own episodes (their clocks are different machines')."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from bench_loader import REPO, load_module


def reload_bench() -> Any:
    return load_module("bench_reload", REPO / "bench" / "reload.py")


def dump(path: Path, after_s: float) -> Path:
    """One reload episode on a clock starting at 100 s: 19 requests of 100 ms before the ask,
    19 of ``after_s`` after the swap, the latter answered by ``v2``."""
    before = [(100.0 + 0.5 * i, 100.1 + 0.5 * i, "v1") for i in range(19)]
    after = [(111.1 + 0.5 * i, 111.1 + 0.5 * i + after_s, "v2") for i in range(19)]
    episode = {
        "kind": "reload",
        "opened": 100.0,
        "asked": 110.0,
        "swapped": 111.0,
        "closed": 121.0,
        "name": "v2",
        "status": 200,
        "answer": json.dumps({"seconds": 1.0, "draining": 0, "handed_over": 1}),
    }
    path.write_text(json.dumps({"args": {}, "answers": before + after, "episodes": [episode]}))
    return path


def test_dumps_of_two_runs_are_pooled_without_mixing_their_requests(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    slower = dump(tmp_path / "a.json", 0.2)
    same = dump(tmp_path / "b.json", 0.1)
    assert reload_bench().from_dumps([slower, same], 2.0) is True
    printed = capsys.readouterr().out
    # The two files share clock values: were they not moved apart, each episode would hold 38.
    assert (
        "episode 1 (reload): before n=19, p50=100 ms, p99=100 ms; after n=19, p50=200 ms" in printed
    )
    assert (
        "episode 2 (reload): before n=19, p50=100 ms, p99=100 ms; after n=19, p50=100 ms" in printed
    )
    assert "p99 +100.0 %" in printed
    assert "reload episodes pooled: before n=38" in printed
    assert "answered after by v2" in printed


def test_a_reload_answered_by_the_old_model_fails_the_report(tmp_path: Path) -> None:
    path = dump(tmp_path / "a.json", 0.1)
    record = json.loads(path.read_text())
    record["episodes"][0]["name"] = "v3"  # the requests after the swap say v2
    path.write_text(json.dumps(record))
    assert reload_bench().from_dumps([path], 2.0) is False
