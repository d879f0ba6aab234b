"""Which requests of a vLLM engine core that failed by itself are bystanders (replayable).

When an engine core fails by itself (an out-of-memory error in its model runner, a crashed
kernel), every request it ran dies with it, and vLLM does not say which one the failing step
failed on. A step fails on what is new in it, and the new work of a step is prefill: so a request
that had a token generated there already (past its prefill) is taken for a bystander, and so is a
request with no token yet whose prompt is smaller than the largest prompt among the requests with
no token (a failed allocation is most likely the biggest one). The request(s) with that largest
new prompt are the suspects: never replayed. A wrong guess costs one replay (a request is replayed
once only) and the standby core it lands on.

The requests of a core are tracked on the ``AsyncLLM`` object itself, from submission to their
end; the suspects' prompt size is fixed from that record the first time a request asks, while
every request of the failed core is still in it.
"""

from __future__ import annotations

from typing import Any

from ._vllm_support import Collected

__all__ = ["bystander_reason", "track", "untrack"]

_REQUESTS = "_chainrt_requests"
_SUSPECT_TOKENS = "_chainrt_suspect_prompt_tokens"


def track(llm: Any, rid: str, prompt_tokens: int, got: Collected) -> None:
    """Note a request submitted to ``llm`` (its prompt size and its progress so far)."""
    requests: dict[str, tuple[int, Collected]] | None = getattr(llm, _REQUESTS, None)
    if requests is None:
        requests = {}
        setattr(llm, _REQUESTS, requests)
    requests[rid] = (prompt_tokens, got)


def untrack(llm: Any, rid: str) -> None:
    """Forget a request of ``llm`` that ended."""
    requests: dict[str, tuple[int, Collected]] = getattr(llm, _REQUESTS, {})
    requests.pop(rid, None)


def bystander_reason(llm: Any, rid: str) -> str | None:
    """Why request ``rid`` of ``llm`` (a core that failed by itself) is taken for a bystander of
    the failure; None when it is a suspect."""
    requests: dict[str, tuple[int, Collected]] = getattr(llm, _REQUESTS, {})
    if rid not in requests:
        return None
    suspect: int | None = getattr(llm, _SUSPECT_TOKENS, None)
    if suspect is None:
        waiting = [tokens for tokens, got in requests.values() if got.completion == 0]
        suspect = max(waiting, default=0)
        setattr(llm, _SUSPECT_TOKENS, suspect)
    tokens, got = requests[rid]
    if got.completion > 0:
        return f"was past its prefill there ({got.completion} token(s) generated)"
    if tokens < suspect:
        return f"had a smaller new prompt ({tokens} tokens) than the largest there ({suspect})"
    return None
