"""The doctor's checks: pure functions of :class:`Facts` and the known-bad table.

Three kinds of check:

* driver minimums — the CUDA runtime torch was built for needs a driver at least this new
  (rows of ``known_bad.json``, each with its source);
* architecture minimums — a GPU generation needs code from at least this CUDA (rows likewise),
  and torch should carry code for each GPU it will run on;
* requirements — what each installed package itself declares about the others (its
  ``Requires-Dist``), e.g. vLLM pinning one torch release: the package's metadata is the source.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from importlib import resources
from typing import Any

from packaging.requirements import InvalidRequirement, Requirement
from packaging.version import InvalidVersion, Version

from ._probe import Facts

__all__ = ["Finding", "check", "load_table"]

_LOW_FREE_SHARE = 0.1


@dataclass(frozen=True)
class Finding:
    """One check's outcome. ``level``: ``ok``, ``warning`` or ``error`` (a known-bad row)."""

    level: str
    check: str
    message: str
    fix: str | None = None
    source: str | None = None

    def as_dict(self) -> dict[str, str | None]:
        """JSON-ready form."""
        return vars(self).copy()


def load_table() -> dict[str, Any]:
    """The known-bad table shipped with the package (``workers/doctor/known_bad.json``)."""
    text = resources.files("workers.doctor").joinpath("known_bad.json").read_text("utf-8")
    table: dict[str, Any] = json.loads(text)
    return table


def check(facts: Facts, table: dict[str, Any]) -> list[Finding]:
    """Every finding for ``facts``, errors first."""
    findings = [
        *_driver(facts, table),
        *_architectures(facts, table),
        *_requirements(facts),
        *_memory(facts),
    ]
    order = {"error": 0, "warning": 1, "ok": 2}
    return sorted(findings, key=lambda f: order[f.level])


def _version(text: str | None) -> Version | None:
    if text is None:
        return None
    try:
        return Version(text)
    except InvalidVersion:
        return None


def _driver(facts: Facts, table: dict[str, Any]) -> list[Finding]:
    cuda = _version(facts.cuda_runtime)
    if cuda is None:
        return [Finding("ok", "driver", "torch is a CPU build (or absent): no driver needed")]
    driver = _version(facts.driver)
    if driver is None:
        return [
            Finding(
                "warning",
                "driver",
                f"torch is built for CUDA {facts.cuda_runtime} but no NVIDIA driver was found",
                fix="install the NVIDIA driver, or a CPU build of torch on this machine",
            )
        ]
    for row in table["driver_minimums"]:
        if row["cuda_major"] == cuda.major and driver < Version(row["min_driver"]):
            return [
                Finding(
                    "error",
                    "driver",
                    f"torch is built for CUDA {facts.cuda_runtime}, which needs NVIDIA driver "
                    f">= {row['min_driver']}; this machine has {facts.driver}",
                    fix=row["fix"],
                    source=row["source"],
                )
            ]
    return [Finding("ok", "driver", f"driver {facts.driver} runs CUDA {facts.cuda_runtime}")]


def _architectures(facts: Facts, table: dict[str, Any]) -> list[Finding]:
    cuda = _version(facts.cuda_runtime)
    rows = {row["capability"]: row for row in table["arch_minimum_cuda"]}
    findings: list[Finding] = []
    for gpu in facts.gpus:
        if gpu.capability is None or cuda is None:
            continue
        row = rows.get(gpu.capability)
        if row is not None and cuda < Version(row["min_cuda"]):
            findings.append(
                Finding(
                    "error",
                    "architecture",
                    f"GPU {gpu.index} ({gpu.name}, {row['name']}) needs CUDA >= {row['min_cuda']}; "
                    f"torch is built for CUDA {facts.cuda_runtime}",
                    fix=row["fix"],
                    source=row["source"],
                )
            )
            continue
        sm = "sm_" + gpu.capability.replace(".", "")
        if facts.torch_arch_list and sm not in facts.torch_arch_list:
            findings.append(
                Finding(
                    "warning",
                    "architecture",
                    f"torch carries no {sm} code for GPU {gpu.index} ({gpu.name}); its kernels "
                    f"are for {', '.join(facts.torch_arch_list)} and must be JIT-compiled",
                    fix="install a torch build whose arch list includes " + sm,
                )
            )
        else:
            findings.append(
                Finding("ok", "architecture", f"GPU {gpu.index} ({gpu.name}, {sm}) is supported")
            )
    return findings


def _requirements(facts: Facts) -> list[Finding]:
    findings: list[Finding] = []
    installed = {name.lower(): v for name, v in facts.packages.items() if v is not None}
    for package, lines in sorted(facts.requires.items()):
        for line in lines:
            try:
                requirement = Requirement(line)
            except InvalidRequirement:
                continue
            if requirement.marker is not None and not requirement.marker.evaluate({"extra": ""}):
                continue
            have = installed.get(requirement.name.lower().replace("_", "-"))
            version = _version(have)
            if have is None or version is None:
                continue  # not installed here: nothing to clash with
            if not requirement.specifier.contains(version, prereleases=True):
                findings.append(
                    Finding(
                        "error",
                        "requirements",
                        f"{package} {installed[package.lower()]} requires "
                        f"{requirement.name}{requirement.specifier}; {have} is installed",
                        fix=f"install {requirement.name}{requirement.specifier} (or a {package} "
                        f"release built for {requirement.name} {have})",
                        source=f"{package}'s package metadata (Requires-Dist)",
                    )
                )
    if not findings:
        findings.append(Finding("ok", "requirements", "installed packages agree on versions"))
    return findings


def _memory(facts: Facts) -> list[Finding]:
    findings = []
    for gpu in facts.gpus:
        if gpu.free_mib is None or not gpu.total_mib:
            continue
        if gpu.free_mib < _LOW_FREE_SHARE * gpu.total_mib:
            findings.append(
                Finding(
                    "warning",
                    "memory",
                    f"GPU {gpu.index} ({gpu.name}) has {gpu.free_mib:.0f} of "
                    f"{gpu.total_mib:.0f} MiB free: another process holds it",
                    fix="stop the other process or give this worker another GPU",
                )
            )
    return findings
