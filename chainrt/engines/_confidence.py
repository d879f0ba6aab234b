"""One ``confidence_score`` in [0, 1] for a generation, from its tokens' top-k log-probabilities.

For each generated token the engine keeps the log-probabilities of the ``k`` most likely tokens
of the distribution it sampled from (``k`` = :data:`TOP_K`). With ``p1 >= p2 >= ...`` those
probabilities and ``q_i = p_i / sum(p)`` them renormalised over the top ``k``:

- ``margin  = p1 - p2`` (``p2 = 0`` when only one is known): 1 when the model had no rival;
- ``spread  = H(q) / ln(k)``: the normalised entropy of the top ``k``, 0 when one token holds all
  of the mass, 1 when the ``k`` are equally likely;
- ``token   = (margin + (1 - spread)) / 2``.

The answer's score is the mean of its tokens' scores; an answer with no generated token has no
score (None). The function is pure and cheap (``O(tokens * k)``).
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from typing import Any

__all__ = ["TOP_K", "confidence_score", "token_confidence", "top_logprobs"]

TOP_K = 5
"""How many of a distribution's most likely tokens the score looks at."""


def token_confidence(logprobs: Sequence[float]) -> float:
    """The score of one token from its distribution's top-k log-probabilities (any order).

    Raises ValueError on an empty sequence or a log-probability above 0 or not a number.
    """
    if not logprobs:
        raise ValueError("a token needs at least one log-probability")
    for value in logprobs:
        if math.isnan(value) or value > 1e-6:
            raise ValueError(f"not a log-probability: {value!r}")
    probs = sorted((math.exp(min(value, 0.0)) for value in logprobs), reverse=True)
    margin = probs[0] - (probs[1] if len(probs) > 1 else 0.0)
    spread = 0.0
    total = sum(probs)
    if len(probs) > 1 and total > 0.0:
        entropy = -sum(p / total * math.log(p / total) for p in probs if p > 0.0)
        spread = entropy / math.log(len(probs))
    return min(1.0, max(0.0, (margin + (1.0 - spread)) / 2.0))


def confidence_score(tokens: Iterable[Sequence[float]]) -> float | None:
    """The mean :func:`token_confidence` of a generation's tokens; None for no tokens."""
    scores = [token_confidence(logprobs) for logprobs in tokens]
    if not scores:
        return None
    return round(sum(scores) / len(scores), 6)


def top_logprobs(logits: Sequence[float] | Any, k: int = TOP_K) -> list[float]:
    """The ``k`` largest log-probabilities of a logits vector (log-softmax), largest first.

    For engines that see raw logits (llama.cpp without ``logits_all``, torch): pass a NumPy
    array and it stays vectorised.
    """
    import numpy as np

    values = np.asarray(logits, dtype=np.float64)
    if values.size == 0:
        raise ValueError("empty logits")
    top = min(k, values.size)
    peak = float(values.max())
    log_total = peak + math.log(float(np.exp(values - peak).sum()))
    best = np.partition(values, values.size - top)[values.size - top :]
    return sorted((float(v) - log_total for v in best), reverse=True)
