"""Which requests of a vLLM engine core that failed by itself are bystanders (replayed).

Pure bookkeeping on the object that stands for the ``AsyncLLM`` (the real engine is exercised in
``tests/test_engine_vllm_replay.py``, marker vllm).
"""

from __future__ import annotations

from types import SimpleNamespace

from chainrt.engines._vllm_blame import bystander_reason, track, untrack
from chainrt.engines._vllm_support import Collected


def progress(tokens: int) -> Collected:
    got = Collected()
    got.completion = tokens
    return got


def test_a_request_past_its_prefill_is_a_bystander() -> None:
    llm = SimpleNamespace()
    track(llm, "decoding", 12, progress(3))
    track(llm, "new", 40, progress(0))
    assert bystander_reason(llm, "decoding") == "was past its prefill there (3 token(s) generated)"
    assert bystander_reason(llm, "new") is None  # the only new prompt: the suspect


def test_among_new_prompts_only_the_largest_is_a_suspect() -> None:
    llm = SimpleNamespace()
    track(llm, "long", 1500, progress(0))
    track(llm, "short", 20, progress(0))
    track(llm, "tie", 1500, progress(0))
    reason = bystander_reason(llm, "short")
    assert reason == "had a smaller new prompt (20 tokens) than the largest there (1500)"
    assert bystander_reason(llm, "long") is None
    assert bystander_reason(llm, "tie") is None


def test_the_suspect_size_is_fixed_while_every_request_of_the_failure_is_known() -> None:
    llm = SimpleNamespace()
    track(llm, "long", 1500, progress(0))
    track(llm, "short", 20, progress(0))
    assert bystander_reason(llm, "long") is None
    untrack(llm, "long")  # the suspect's failure ended first
    assert bystander_reason(llm, "short") is not None  # still smaller than the suspect


def test_an_untracked_request_is_never_a_bystander() -> None:
    llm = SimpleNamespace()
    track(llm, "done", 10, progress(5))
    untrack(llm, "done")
    assert bystander_reason(llm, "done") is None
    assert bystander_reason(SimpleNamespace(), "unknown") is None
