"""JSON-Schema-constrained decoding for the torch engine: an llguidance token mask per step.

llguidance (a maintained Rust library, the one vLLM uses as its ``guidance`` backend) compiles a
JSON Schema into a grammar and, at each step, says which tokens of the vocabulary may come next.
:class:`JsonConstraint` turns that into a logits mask — disallowed tokens get ``-inf`` — and
follows the sampled tokens, so greedy or sampled decoding can only produce text of the schema.
When the JSON value is complete the only token left is end-of-sequence.

The llguidance tokenizer is built once per engine (about a second for a 49k vocabulary).
"""

from __future__ import annotations

import json
from typing import Any

from ..errors import WorkerError
from ..toolcalls import ANY_JSON_OBJECT

__all__ = ["JsonConstraint", "build_lltokenizer"]


def _llguidance() -> Any:
    try:
        import llguidance
    except ImportError as exc:
        raise WorkerError(
            "constrained decoding in the torch engine needs llguidance; "
            "pip install -e '.[torch]' in the chainrt repository",
            retryable=False,
        ) from exc
    return llguidance


def build_lltokenizer(hf_tokenizer: Any, eos: set[int]) -> Any:
    """llguidance's view of a fast Hugging Face tokenizer (expensive: build once per model)."""
    _llguidance()
    import llguidance.hf

    return llguidance.hf.from_tokenizer(hf_tokenizer, eos_token=sorted(eos) or None)


def compile_grammar(schema: dict[str, Any] | None, lltokenizer: Any) -> str:
    """The llguidance grammar of ``schema`` (None: any JSON object); WorkerError if unusable."""
    llg = _llguidance()
    try:
        grammar = llg.LLMatcher.grammar_from_json_schema(
            json.dumps(schema if schema is not None else ANY_JSON_OBJECT),
            # One space after separators and no other whitespace: a small model left free to
            # choose whitespace can spend its whole token budget on newlines.
            overrides={"whitespace_flexible": False, "item_separator": ", ", "key_separator": ": "},
        )
    except ValueError as exc:
        raise WorkerError(f"the JSON Schema cannot be compiled: {exc}", retryable=False) from None
    error = llg.LLMatcher.validate_grammar(grammar, lltokenizer)
    if error and not error.startswith("WARNING"):
        raise WorkerError(
            f"the torch engine cannot decode into this JSON Schema: {' '.join(error.split())}",
            retryable=False,
        )
    return str(grammar)


class JsonConstraint:
    """The schema's token mask for one generation, advanced by each sampled token."""

    def __init__(self, grammar: str, lltokenizer: Any, torch: Any) -> None:
        llg = _llguidance()
        self._matcher = llg.LLMatcher(lltokenizer, grammar, log_level=0)
        if self._matcher.is_error():
            raise WorkerError(
                "the torch engine cannot decode into this JSON Schema: "
                + " ".join(self._matcher.get_error().split()),
                retryable=False,
            )
        self._torch = torch

    def mask(self, logits: Any) -> Any:
        """``logits`` (1 × vocab) with every token the schema forbids next set to -inf."""
        torch = self._torch
        bias = self._matcher.compute_logit_bias()  # one byte per token: 0 forbidden, 200 allowed
        allowed = torch.frombuffer(bytearray(bias), dtype=torch.uint8).to(logits.device) > 0
        vocab = logits.shape[-1]
        keep = torch.zeros(vocab, dtype=torch.bool, device=logits.device)
        n = min(vocab, allowed.shape[0])
        keep[:n] = allowed[:n]
        return logits.masked_fill(~keep, float("-inf"))

    def advance(self, token: int) -> None:
        """Follow the sampled token (always one the mask allowed)."""
        if not self._matcher.consume_token(token):
            raise WorkerError(
                f"the JSON constraint refused token {token}: {self._matcher.get_error()}"
            )

    @property
    def done(self) -> bool:
        """True when the JSON value is complete and nothing but end-of-sequence may follow."""
        return bool(self._matcher.is_stopped())
