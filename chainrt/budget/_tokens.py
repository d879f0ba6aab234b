"""A run's token budget (``max_tokens_total`` of a chain): what is left, and whether a call fits.

The runner puts one :class:`TokenAccount` in :data:`RUN_TOKENS` for an execution of a chain
that sets ``max_tokens_total`` (the tokens of steps recorded before a resume already spent).
The LLM executor hands what is left to dispatch with each step and spends the step's usage
after it; dispatch checks every attempt before it starts (:func:`token_shortfall`). A step that
cannot fit is treated as one whose time ran out: ``timed_out`` (its static answer, when it has
one, still answers: it costs no tokens). The decision is pure; only the account is state.
"""

from __future__ import annotations

from collections.abc import Iterable
from contextvars import ContextVar
from dataclasses import dataclass

from .._records import StepRecord, TokenUsage

__all__ = [
    "RUN_TOKENS",
    "TOKEN_BUDGET",
    "TokenAccount",
    "out_of_tokens",
    "start_run_tokens",
    "token_shortfall",
]

TOKEN_BUDGET = "max_tokens_total"  # noqa: S105 - a field name, not a secret
"""What an attempt skipped for want of tokens says in its ``detail`` (:func:`out_of_tokens`)."""


@dataclass(slots=True)
class TokenAccount:
    """Tokens one run may still use."""

    limit: int
    used: int = 0

    @property
    def left(self) -> int:
        """Tokens left (never below 0)."""
        return max(self.limit - self.used, 0)

    def spend(self, usage: TokenUsage | None) -> None:
        """Count ``usage`` (prompt and completion tokens) as used."""
        if usage is not None:
            self.used += usage.total_tokens

    @classmethod
    def for_run(cls, limit: int | None, done: Iterable[StepRecord]) -> TokenAccount | None:
        """The account of a run with ``limit`` (None: no account), the usage of the steps
        already recorded (``done``, on a resume) spent."""
        if limit is None:
            return None
        account = cls(limit)
        for record in done:
            account.spend(TokenUsage.of([a.usage for a in record.attempt_log]))
        return account


RUN_TOKENS: ContextVar[TokenAccount | None] = ContextVar("chainrt_run_tokens", default=None)
"""The running execution's token account (None: the chain sets no ``max_tokens_total``)."""


def start_run_tokens(limit: int | None, done: Iterable[StepRecord]) -> None:
    """Give the running execution (its task) its token account (None without ``limit``)."""
    RUN_TOKENS.set(TokenAccount.for_run(limit, done))


def token_shortfall(
    prompt_tokens: int, max_tokens: int, left: int | None, spent: int = 0
) -> str | None:
    """Why an attempt asking for ``prompt_tokens`` + up to ``max_tokens`` cannot start when the
    run had ``left`` tokens at the step's start and the step's earlier attempts used ``spent``;
    None when it fits (or the run has no token budget)."""
    if left is None:
        return None
    now = left - spent
    need = prompt_tokens + max_tokens
    if need <= now:
        return None
    return (
        f"{TOKEN_BUDGET}: the call may use {need} tokens ({prompt_tokens} prompt + {max_tokens} "
        f"max_tokens), {max(now, 0)} left of the run's token budget"
    )


def out_of_tokens(detail: str | None) -> bool:
    """Whether an attempt's ``detail`` says it was skipped for want of tokens."""
    return detail is not None and f"{TOKEN_BUDGET}: " in detail
