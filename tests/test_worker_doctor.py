"""``chainrt-worker doctor``: each known-bad row is caught from faked facts; the real probe runs."""

from __future__ import annotations

import importlib.metadata
import io
import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from workers.doctor import Facts, Gpu, check, load_table, run

ROOT = Path(__file__).resolve().parent.parent
TABLE = load_table()
H200 = Gpu(index=0, name="NVIDIA H200", capability="9.0", free_mib=140000, total_mib=143771)


def facts(**change: object) -> Facts:
    """A healthy CUDA 13 machine with an H200, changed by ``change``."""
    base: dict[str, object] = {
        "python": "3.12.3",
        "driver": "580.159.04",
        "cuda_runtime": "13.0",
        "torch_arch_list": ("sm_80", "sm_90", "sm_100"),
        "packages": {"torch": "2.11.0", "vllm": "0.11.0", "transformers": "5.17.0"},
        "requires": {},
        "gpus": (H200,),
    }
    base.update(change)
    return Facts(**base)  # type: ignore[arg-type]


def errors(f: Facts) -> list[str]:
    return [x.check for x in check(f, TABLE) if x.level == "error"]


def test_a_healthy_machine_has_no_error() -> None:
    findings = check(facts(), TABLE)
    assert [f.level for f in findings] == ["ok"] * len(findings)
    assert {f.check for f in findings} >= {"driver", "architecture", "requirements"}


@pytest.mark.parametrize("row", TABLE["driver_minimums"], ids=lambda r: f"cuda{r['cuda_major']}")
def test_each_driver_row_refuses_an_older_driver_and_accepts_its_minimum(
    row: dict[str, Any],
) -> None:
    cuda = f"{row['cuda_major']}.0"
    major, *rest = row["min_driver"].split(".")
    older = ".".join([str(int(major) - 1), *rest])
    found = check(facts(cuda_runtime=cuda, driver=older), TABLE)[0]
    assert found.level == "error"
    assert found.check == "driver"
    assert row["min_driver"] in found.message
    assert older in found.message
    assert found.source == row["source"]
    assert found.fix == row["fix"]
    assert "driver" not in errors(facts(cuda_runtime=cuda, driver=row["min_driver"]))


@pytest.mark.parametrize("row", TABLE["arch_minimum_cuda"], ids=lambda r: r["capability"])
def test_each_architecture_row_refuses_an_older_cuda_build(row: dict[str, Any]) -> None:
    gpu = Gpu(index=0, name=row["name"], capability=row["capability"], free_mib=1, total_mib=2)
    major, minor = row["min_cuda"].split(".")
    older = f"{major}.{int(minor) - 1}" if int(minor) > 0 else f"{int(major) - 1}.8"
    found = [f for f in check(facts(cuda_runtime=older, gpus=(gpu,)), TABLE) if f.level == "error"]
    assert [f.check for f in found if f.check == "architecture"] == ["architecture"]
    assert any(f.source == row["source"] for f in found)
    assert "architecture" not in errors(facts(cuda_runtime=row["min_cuda"], gpus=(gpu,)))


def test_every_table_row_names_a_source_and_a_fix() -> None:
    rows = [*TABLE["driver_minimums"], *TABLE["arch_minimum_cuda"]]
    assert rows
    for row in rows:
        assert row["source"].strip()
        assert row["fix"].strip()


def test_a_gpu_torch_has_no_code_for_is_a_warning() -> None:
    found = check(facts(torch_arch_list=("sm_80",)), TABLE)
    arch = [f for f in found if f.check == "architecture"]
    assert [f.level for f in arch] == ["warning"]
    assert "sm_90" in arch[0].message


def test_a_package_pinning_another_version_is_an_error_named_after_its_metadata() -> None:
    pinned = facts(
        packages={"torch": "2.11.0+cu130", "vllm": "0.32.0"},
        requires={"vllm": ("torch==2.13.0", 'torchaudio; platform_machine != "s390x"')},
    )
    found = [f for f in check(pinned, TABLE) if f.check == "requirements"]
    assert [f.level for f in found] == ["error"]
    assert "vllm 0.32.0 requires torch==2.13.0; 2.11.0+cu130 is installed" in found[0].message
    assert found[0].source == "vllm's package metadata (Requires-Dist)"
    # A local build tag (+cpu, +cu130) satisfies a pin without one, as pip sees it.
    fine = facts(packages={"torch": "2.13.0+cpu", "vllm": "0.32.0"},
                 requires={"vllm": ("torch==2.13.0",)})  # fmt: skip
    assert "requirements" not in errors(fine)


def test_a_requirement_whose_marker_does_not_apply_is_ignored() -> None:
    darwin_only = facts(
        packages={"torch": "2.11.0", "vllm": "0.32.0"},
        requires={"vllm": ('torch==2.13.0; platform_system == "Darwin"',)},
    )
    assert "requirements" not in errors(darwin_only)


def test_a_gpu_mostly_taken_by_another_process_is_a_warning() -> None:
    busy = Gpu(index=0, name="NVIDIA H200", capability="9.0", free_mib=1000, total_mib=143771)
    found = [f for f in check(facts(gpus=(busy,)), TABLE) if f.check == "memory"]
    assert [f.level for f in found] == ["warning"]


def test_run_exits_1_on_a_known_bad_combination_and_says_what_to_change() -> None:
    out = io.StringIO()
    assert run(as_json=False, out=out, facts=facts(driver="570.10")) == 1
    text = out.getvalue()
    assert "ERROR   driver:" in text
    assert "fix: upgrade the NVIDIA driver to 580.65.06" in text
    assert "known-bad combination found" in text
    out = io.StringIO()
    assert run(as_json=True, out=out, facts=facts(driver="570.10")) == 1
    body = json.loads(out.getvalue())
    assert body["ok"] is False
    assert body["findings"][0]["level"] == "error"
    assert run(as_json=True, out=io.StringIO(), facts=facts()) == 0


def test_the_real_probe_reports_this_machines_versions() -> None:
    done = subprocess.run(
        [sys.executable, "-m", "workers.cli", "doctor", "--json"],
        cwd=ROOT, capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    body = json.loads(done.stdout)
    assert done.returncode == (0 if body["ok"] else 1), done.stderr
    for name, version in body["facts"]["packages"].items():
        try:
            expected: str | None = importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            expected = None
        assert version == expected, name
    assert body["facts"]["python"] == ".".join(map(str, sys.version_info[:3]))
