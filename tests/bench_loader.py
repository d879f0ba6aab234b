"""``bench/gpu_oom.py`` loaded as a module, for tests that build its tiny random Llama
(``build_random_model``) or drive its episodes."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType

__all__ = ["gpu_oom_bench"]

BENCH = Path(__file__).resolve().parent.parent / "bench" / "gpu_oom.py"


def gpu_oom_bench() -> ModuleType:
    """The bench module (loaded once per process; registered in ``sys.modules`` because its
    dataclasses resolve their annotations through it)."""
    loaded = sys.modules.get("gpu_oom_bench")
    if loaded is not None:
        return loaded
    spec = importlib.util.spec_from_file_location("gpu_oom_bench", BENCH)
    assert spec is not None
    assert spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module
