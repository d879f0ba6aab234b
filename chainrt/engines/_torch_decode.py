"""The torch engine's decode loop: prefill, then one token at a time with the KV cache.

Pure computation on a loaded model, run on the engine's GPU thread. A real (or injected)
out-of-memory error propagates from here untouched; the engine catches it. Tokens are decoded
as they come; a stop string is recognised across tokens and never emitted
(:class:`~chainrt.engines._textstream.TextAssembler`).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from ._base import FinishReason, GenerationRequest
from ._confidence import TOP_K
from ._hf_model import PromptTokenizer
from ._textstream import TextAssembler
from ._torch_constrain import JsonConstraint

__all__ = ["DecodeJob", "decode", "is_oom", "warm_shape"]

_OOM_MARKERS = ("out of memory", "CUBLAS_STATUS_ALLOC_FAILED", "can't allocate memory")
"""RuntimeError texts that mean memory exhaustion (cuBLAS workspaces, the CPU allocator)."""


@dataclass(frozen=True, slots=True)
class DecodeJob:
    """Everything one generation needs."""

    model: Any
    torch: Any
    device: str
    prompt_ids: list[int]
    request: GenerationRequest
    budget: int
    """Most tokens to generate (max_tokens, capped by the context left)."""
    eos: set[int]
    tokens: PromptTokenizer
    emit: Callable[[str], None]
    """Receives each final piece of text."""
    interrupted: Callable[[], FinishReason | None]
    """Checked before each token: "deadline"/"abort" stops the loop."""
    inject_oom: bool = False
    constraint: JsonConstraint | None = None
    """Masks each step's logits to what a JSON Schema allows (None: unconstrained)."""
    tops: list[list[float]] = field(default_factory=list)
    """Filled with each generated token's top-k log-probabilities (the model's own, unmasked)."""
    marks: list[float] = field(default_factory=list)
    """Filled with the ``perf_counter`` time the first token was picked (the end of prefill)."""


def decode(job: DecodeJob) -> tuple[FinishReason, str, int]:
    """Run the generation; returns (finish reason, text, completion tokens)."""
    torch = job.torch
    text = TextAssembler(job.request.stop)
    generated: list[int] = []
    emitted = ""  # decoded text of `generated` already fed to the assembler
    reason = job.interrupted()
    sampler = _Sampler(torch, job.request, job.device)
    with torch.inference_mode():
        if job.inject_oom:
            raise torch.OutOfMemoryError("injected out-of-memory error (fault injection)")
        if reason is None and job.budget > 0:
            inputs = torch.tensor([job.prompt_ids], device=job.device)
            # logits_to_keep=1: a long prompt needs the last position's logits only.
            out = job.model(input_ids=inputs, use_cache=True, logits_to_keep=1)
            past, logits = out.past_key_values, out.logits[:, -1, :]
            del out, inputs
            constraint = job.constraint
            while True:
                if not job.marks:
                    job.marks.append(time.perf_counter())
                best = (
                    torch.log_softmax(logits[0].float(), dim=-1)
                    .topk(min(TOP_K, logits.shape[-1]))
                    .values
                )
                job.tops.append([float(v) for v in best.tolist()])
                if constraint is not None:
                    logits = constraint.mask(logits)
                token = sampler.pick(logits)
                if token in job.eos:
                    reason = "stop"
                    break
                if constraint is not None:
                    constraint.advance(token)
                generated.append(token)
                whole = job.tokens.decode(generated)
                if not whole.endswith("\ufffd"):  # hold back a half-decoded character
                    piece = text.feed(whole[len(emitted) :].encode("utf-8"))
                    emitted = whole
                    if piece:
                        job.emit(piece)
                if text.stopped or (constraint is not None and constraint.done):
                    reason = "stop"
                    break
                if len(generated) >= job.budget:
                    reason = "length"
                    break
                reason = job.interrupted()
                if reason is not None:
                    break
                step = torch.tensor([[token]], device=job.device)
                out = job.model(input_ids=step, past_key_values=past, use_cache=True)
                past, logits = out.past_key_values, out.logits[:, -1, :]
                del out
            del past, logits
    if not text.stopped:  # what the character hold-back kept from the assembler
        rest = job.tokens.decode(generated)[len(emitted) :].rstrip("\ufffd")
        piece = text.feed(rest.encode("utf-8"))
        if piece:
            job.emit(piece)
    tail = text.finish()
    if tail:
        job.emit(tail)
    return reason or "length", text.text, len(generated)


def warm_shape(model: Any, torch: Any, device: str, prompt_tokens: int, steps: int) -> None:
    """Run one generation's attention shapes without a request: a prefill of ``prompt_tokens``
    placeholder tokens, then ``steps - 1`` one-token steps on its KV cache (no sampling, no
    synchronisation: the caller waits for the device once at the end)."""
    with torch.inference_mode():
        inputs = torch.zeros((1, prompt_tokens), dtype=torch.long, device=device)
        out = model(input_ids=inputs, use_cache=True, logits_to_keep=1)
        past = out.past_key_values
        step = inputs[:, :1]
        del out, inputs
        for _ in range(steps - 1):
            out = model(input_ids=step, past_key_values=past, use_cache=True)
            past = out.past_key_values
            del out
        del past


class _Sampler:
    """Greedy at temperature 0, else softmax sampling with a per-request seeded generator."""

    def __init__(self, torch: Any, request: GenerationRequest, device: str | None) -> None:
        self._torch = torch
        self._temperature = max(request.temperature, 0.0)
        self._generator = None
        if self._temperature > 0:
            self._generator = torch.Generator(device=device or "cpu")
            seed = request.seed if request.seed is not None else int(time.time_ns() % 2**31)
            self._generator.manual_seed(seed)

    def pick(self, logits: Any) -> int:
        if self._generator is None:
            return int(logits.argmax(dim=-1).item())
        probs = self._torch.softmax(logits.float() / self._temperature, dim=-1)
        return int(self._torch.multinomial(probs, 1, generator=self._generator).item())


def is_oom(exc: BaseException, torch: Any) -> bool:
    """True for torch's OutOfMemoryError, MemoryError, and allocator RuntimeErrors."""
    if torch is not None and isinstance(exc, torch.OutOfMemoryError):
        return True
    if isinstance(exc, MemoryError):
        return True
    return isinstance(exc, RuntimeError) and any(m in str(exc) for m in _OOM_MARKERS)
