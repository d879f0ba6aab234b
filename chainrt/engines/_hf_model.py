"""An HF model directory as the vllm and torch engines use it: where it is, its facts, its prompts.

Both engines feed the model token ids made here, with the model's own tokenizer and chat template,
so ``count_tokens`` is exactly what the model sees. Only the standard library is imported at
import time; transformers loads with the first tokenizer.
"""

from __future__ import annotations

import json
import os
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..errors import WorkerError
from ._base import ContextLengthExceeded, GenerationRequest
from ._hf_cache import ensure_hf_model, force_offline

__all__ = ["ModelFacts", "PromptTokenizer", "read_model_facts", "resolve_model_dir"]


def resolve_model_dir(model: str | os.PathLike[str] | None) -> Path:
    """``model`` as an HF model directory; None converts/uses the cached SmolLM2 directory."""
    if model is None:
        return ensure_hf_model()
    path = Path(model).expanduser()
    if not (path / "config.json").is_file():
        raise WorkerError(
            f"--model {str(path)!r} is not an HF model directory (no config.json); "
            "leave --model out to use SmolLM2 (converted once from the shipped GGUF)"
        )
    return path


class PromptTokenizer:
    """The model directory's tokenizer, loaded on first use; safe to share between threads."""

    def __init__(self, model_dir: Path, *, engine: str) -> None:
        self._model_dir = model_dir
        self._engine = engine
        self._lock = threading.Lock()  # a fast tokenizer must not be used by two threads at once
        self._tokenizer: Any = None

    def load(self) -> Any:
        """The transformers tokenizer (loaded now if it was not yet)."""
        with self._lock:
            return self._load()

    def _load(self) -> Any:
        if self._tokenizer is None:
            force_offline()
            from transformers import AutoTokenizer

            self._tokenizer = AutoTokenizer.from_pretrained(
                str(self._model_dir), local_files_only=True
            )
        return self._tokenizer

    def prompt_ids(self, request: GenerationRequest, context_tokens: int) -> list[int]:
        """Token ids of the request's prompt (chat template applied to ``messages``).

        Raises WorkerError for a request without text and ContextLengthExceeded when the prompt
        leaves no room for a single generated token.
        """
        with self._lock:
            tokenizer = self._load()
            if request.messages is not None:
                messages = [{"role": m.role, "content": m.content} for m in request.messages]
                prompt = tokenizer.apply_chat_template(
                    messages, add_generation_prompt=True, tokenize=False
                )
                # The template already wrote every special token it wants.
                ids = tokenizer.encode(prompt, add_special_tokens=False)
            elif request.prompt is not None:
                ids = tokenizer.encode(request.prompt, add_special_tokens=True)
            else:
                raise WorkerError("a generation request needs messages or a prompt; it had neither")
        if not ids:
            raise WorkerError("the prompt is empty after tokenization; send some text")
        if len(ids) >= context_tokens:
            raise ContextLengthExceeded(
                f"the prompt has {len(ids)} tokens but the {self._engine} engine's context holds "
                f"{context_tokens} (prompt + completion); shorten the prompt",
                prompt_tokens=len(ids),
                context_tokens=context_tokens,
            )
        return list(ids)

    def decode(self, ids: list[int]) -> str:
        """Text of ``ids`` without special tokens."""
        with self._lock:
            return str(self._load().decode(ids, skip_special_tokens=True))

    @property
    def eos_token_id(self) -> int | None:
        """The tokenizer's end-of-sequence token id, if it has one."""
        value = self.load().eos_token_id
        return int(value) if value is not None else None


@dataclass(frozen=True, slots=True)
class ModelFacts:
    """What admission control needs from an HF model's ``config.json``."""

    num_layers: int
    num_kv_heads: int
    head_dim: int
    max_position_embeddings: int

    def kv_bytes_per_token(self, dtype_bytes: int) -> int:
        """K and V bytes one token takes in the cache: 2 × layers × kv_heads × head_dim × dtype."""
        return 2 * self.num_layers * self.num_kv_heads * self.head_dim * dtype_bytes

    @classmethod
    def from_config(cls, config: dict[str, object]) -> ModelFacts:
        """Read the facts from a decoded ``config.json`` (Llama-style key names)."""
        text = config.get("text_config")  # multimodal configs nest the language model's
        if isinstance(text, dict):
            config = {**config, **text}

        def number(key: str, default: int | None = None) -> int:
            value = config.get(key, default)
            if not isinstance(value, int) or isinstance(value, bool) or value <= 0:
                raise WorkerError(
                    f"model config has no usable {key!r} (got {value!r}); "
                    "is this a decoder-only HF model directory?"
                )
            return value

        layers = number("num_hidden_layers")
        heads = number("num_attention_heads")
        kv_heads = number("num_key_value_heads", heads)
        head_dim_default = number("hidden_size") // heads
        head_dim = config.get("head_dim") or head_dim_default
        if not isinstance(head_dim, int) or head_dim <= 0:
            raise WorkerError(f"model config has an unusable 'head_dim' ({head_dim!r})")
        return cls(layers, kv_heads, head_dim, number("max_position_embeddings", 2048))


def read_model_facts(model_dir: str | Path) -> ModelFacts:
    """:class:`ModelFacts` of the HF model directory ``model_dir`` (reads its ``config.json``)."""
    path = Path(model_dir) / "config.json"
    try:
        config = json.loads(path.read_text())
    except (OSError, ValueError) as exc:
        raise WorkerError(f"cannot read model config {path}: {exc}") from exc
    if not isinstance(config, dict):
        raise WorkerError(f"model config {path} is not a JSON object")
    return ModelFacts.from_config(config)
