"""Load a script that is not a package module (a ``bench/`` script, a chain's tool file) as a
module, once per process, for the tests that call its functions."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType

__all__ = ["REPO", "gpu_oom_bench", "load_module"]

REPO = Path(__file__).resolve().parent.parent
"""The repository's root."""


def load_module(name: str, path: Path) -> ModuleType:
    """The file at ``path`` as module ``name`` (loaded once per process; registered in
    ``sys.modules`` because dataclasses resolve their annotations through it)."""
    loaded = sys.modules.get(name)
    if loaded is not None:
        return loaded
    spec = importlib.util.spec_from_file_location(name, path)
    assert spec is not None
    assert spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


def gpu_oom_bench() -> ModuleType:
    """``bench/gpu_oom.py``, for tests that build its tiny random Llama
    (``build_random_model``) or drive its episodes."""
    return load_module("gpu_oom_bench", REPO / "bench" / "gpu_oom.py")
