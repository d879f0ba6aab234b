"""The torch worker service on a real GPU: a real CUDA OOM over HTTP loses no other request.

Runs ``bench/gpu_worker.py`` (a real ``chainrt-worker serve --engine torch`` process, the official
``openai`` client from four threads, ballast leaving 1 GiB free, oversized requests) and checks
the properties, not the speed: the speed is what the bench prints. Skipped without a CUDA GPU.
"""

from __future__ import annotations

import importlib.util
import json
import math
import re
import subprocess
import sys
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("openai")

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU"),
]

ROOT = Path(__file__).resolve().parent.parent


def test_a_real_oom_fails_only_the_oversized_request(tmp_path: Path) -> None:
    assert importlib.util.find_spec("transformers") is not None
    out = tmp_path / "report.json"
    done = subprocess.run(
        [sys.executable, str(ROOT / "bench" / "gpu_worker.py"), "--random-model",
         "--episodes", "2", "--gap-s", "2", "--json", str(out)],
        cwd=ROOT, capture_output=True, text=True, timeout=600,
    )  # fmt: skip
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    report = json.loads(out.read_text())
    assert report["mode"] == "real CUDA OOM"
    assert [e["status"] for e in report["episodes"]] == [503, 503]
    assert all("out of cuda memory" in e["error"] for e in report["episodes"])
    assert all(math.isfinite(e["ready_again_s"]) for e in report["episodes"])
    assert report["small_ok"] > 0
    assert report["small_failed"] == 0, report["small_errors"]
    assert report["worker_oom_events"] >= 2


def test_a_hot_reload_under_load_on_the_gpu_drops_nothing() -> None:
    done = subprocess.run(
        [sys.executable, str(ROOT / "bench" / "reload.py"), "--engine", "torch",
         "--random-model", "--clients", "4", "--seconds", "10", "--episodes", "1"],
        cwd=ROOT, capture_output=True, text=True, timeout=600,
    )  # fmt: skip
    out = done.stdout
    assert done.returncode == 0, out[-2000:] + done.stderr[-2000:]
    assert re.search(r"^  reload to v2: HTTP 200 in .*; answered after by v2$", out, re.M), out
    assert "failed requests: 0" in out
    assert ", not ready: 0" in out
