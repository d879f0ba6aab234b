"""The confidence score: table tests of the pure function (formula in chainrt/engines/_confidence)."""

from __future__ import annotations

import math

import pytest

from chainrt.engines._confidence import confidence_score, token_confidence, top_logprobs

LN = math.log


@pytest.mark.parametrize(
    ("logprobs", "expected"),
    [
        ([0.0], 1.0),  # one token holds all the mass: margin 1, spread 0
        ([0.0, -1e9], 1.0),  # a rival with no mass changes nothing
        ([LN(0.5), LN(0.5)], 0.0),  # a tie: margin 0, spread 1
        ([LN(0.25)] * 4, 0.0),
        ([LN(0.9), LN(0.1)], 0.6655),  # margin 0.8, spread H(0.9,0.1)/ln2 = 0.469
        ([LN(0.1), LN(0.9)], 0.6655),  # order does not matter
        ([LN(0.6), LN(0.2), LN(0.2)], 0.2675),  # margin 0.4, spread 0.9503/ln3 = 0.865
        ([LN(0.3)], 0.65),  # one known token: margin 0.3, spread 0
    ],
)
def test_token_confidence_table(logprobs: list[float], expected: float) -> None:
    assert token_confidence(logprobs) == pytest.approx(expected, abs=1e-4)


def test_answer_score_is_the_mean_of_its_tokens() -> None:
    assert confidence_score([[0.0], [LN(0.5), LN(0.5)]]) == pytest.approx(0.5)
    assert confidence_score([]) is None


@pytest.mark.parametrize("bad", [[], [0.5], [float("nan")]])
def test_bad_logprobs_are_refused(bad: list[float]) -> None:
    with pytest.raises(ValueError):
        token_confidence(bad)


def test_top_logprobs_is_a_log_softmax() -> None:
    top = top_logprobs([1.0, 3.0, 2.0, 0.0], k=2)
    total = sum(math.exp(v) for v in (1.0, 3.0, 2.0, 0.0))
    assert top == pytest.approx([3.0 - math.log(total), 2.0 - math.log(total)])
    assert top_logprobs([5.0], k=5) == pytest.approx([0.0])
    with pytest.raises(ValueError):
        top_logprobs([])


class _Logprob:
    """vLLM's ``Logprob`` as the engine reads it (``.logprob`` only)."""

    def __init__(self, logprob: float) -> None:
        self.logprob = logprob


def test_vllm_positions_give_each_tokens_top_k() -> None:
    from chainrt.engines._vllm_support import token_top_logprobs

    # Position 1: the top 5 plus the sampled token (id 9) outside them: 6 entries, 5 kept.
    first = {i: _Logprob(LN(p)) for i, p in enumerate([0.5, 0.2, 0.1, 0.05, 0.04])}
    first[9] = _Logprob(LN(0.01))
    second = {3: _Logprob(0.0), 4: _Logprob(-math.inf)}
    tops = token_top_logprobs([first, None, second])
    assert [len(t) for t in tops] == [5, 2]
    assert tops[0] == sorted(tops[0], reverse=True)
    assert tops[0][-1] == pytest.approx(LN(0.04))
    assert tops[1] == [0.0, -math.inf]
    assert confidence_score(tops) is not None
    assert token_top_logprobs(None) == []
