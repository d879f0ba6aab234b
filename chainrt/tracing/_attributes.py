"""Every span name and attribute name chainrt emits, in one place (docs/tracing.md).

Names under ``chainrt.*`` are chainrt's own. Where OpenTelemetry's semantic conventions have a
name for the same thing, that name is used instead: ``gen_ai.*`` for model calls (requested model,
token usage, finish reasons), ``http.*`` / ``url.*`` / ``server.*`` for the worker's HTTP server
span, ``error.type`` for the class of a failure. An operator reading one slow run in Jaeger sees
where its budget went: ``chainrt.waited_ms`` on ``concurrency.acquire``, ``checkpoint.write``
spans, one ``llm.dispatch`` span per attempt with ``chainrt.fallback``, and the worker's own span
with ``chainrt.admission`` and the token counts.

This module holds constants only: importing it never imports OpenTelemetry.
"""

from __future__ import annotations

from typing import Final

__all__ = [
    "ADMISSION",
    "AGENT_FINAL",
    "AGENT_TOOL",
    "ALLOTTED_MS",
    "ATTEMPT",
    "ATTEMPTS",
    "ATTEMPT_MS",
    "BRANCH",
    "BUDGET_MS",
    "CHAIN",
    "COST",
    "DEADLINE_MS",
    "ENDPOINT",
    "ENGINE",
    "ERROR_TYPE",
    "FALLBACK",
    "GEN_AI_OPERATION_NAME",
    "GEN_AI_PROVIDER_NAME",
    "GEN_AI_REQUEST_MAX_TOKENS",
    "GEN_AI_REQUEST_MODEL",
    "GEN_AI_REQUEST_TEMPERATURE",
    "GEN_AI_RESPONSE_FINISH_REASONS",
    "GEN_AI_RESPONSE_ID",
    "GEN_AI_RESPONSE_MODEL",
    "GEN_AI_SYSTEM",
    "GEN_AI_USAGE_INPUT_TOKENS",
    "GEN_AI_USAGE_OUTPUT_TOKENS",
    "GROUP",
    "HEDGE",
    "HTTP_REQUEST_METHOD",
    "HTTP_RESPONSE_STATUS_CODE",
    "HTTP_ROUTE",
    "ITEM_INDEX",
    "KEY",
    "KEYS",
    "LINK_KIND",
    "MODEL",
    "PATH",
    "PRIORITY",
    "REQUEST_ID",
    "RESUMED",
    "RUN_ID",
    "SERVER_ADDRESS",
    "SERVER_PORT",
    "SPAN_ACQUIRE",
    "SPAN_AGENT_CALL",
    "SPAN_AGENT_TURN",
    "SPAN_BRANCH",
    "SPAN_CHECKPOINT",
    "SPAN_DISPATCH",
    "SPAN_ITEM",
    "SPAN_RUN",
    "SPAN_STEP",
    "STATUS",
    "STEP_ID",
    "STEP_KIND",
    "TOKENS_CACHED",
    "TOKENS_COMPLETION",
    "TOKENS_PROMPT",
    "URL_PATH",
    "USED_MS",
    "WAITED_MS",
    "WEIGHT",
    "worker_span_name",
]

# ---------------------------------------------------------------------- span names

SPAN_RUN: Final = "chain.run"
"""One execution of a run (a resumed run is a new ``chain.run`` in a new trace, linked back)."""
SPAN_STEP: Final = "chain.step"
"""One step, from its allotment to its result: key waits, every retry and fallback inside."""
SPAN_ACQUIRE: Final = "concurrency.acquire"
"""Waiting for concurrency keys (chain-scoped at run start, step-scoped inside the step)."""
SPAN_CHECKPOINT: Final = "checkpoint.write"
"""One atomic checkpoint commit (step record + run progress)."""
SPAN_DISPATCH: Final = "llm.dispatch"
"""One attempt of an LLM call on one model (CLIENT span; the worker's span is its child)."""
SPAN_BRANCH: Final = "chain.branch"
"""One branch of a ``switch`` or ``parallel`` group (under the group's ``chain.step``; its
inner steps' ``chain.step`` spans under it)."""
SPAN_ITEM: Final = "chain.item"
"""One item of a ``map`` group (under the group's ``chain.step``)."""
SPAN_AGENT_TURN: Final = "agent.turn"
"""One model turn of an ``agent`` step that runs (not a replayed one), under the step's
``chain.step``; its ``llm.dispatch`` attempts under it."""
SPAN_AGENT_CALL: Final = "agent.call"
"""One tool call of an ``agent`` step that runs (not a replayed one), under the step's
``chain.step``; ``concurrency.acquire`` for the tool's own keys under it."""


def worker_span_name(path: str, method: str = "POST") -> str:
    """The worker's SERVER span name, e.g. ``POST /v1/chat/completions`` (HTTP conventions)."""
    return f"{method} {path}"


# ---------------------------------------------------------------------- run and step

RUN_ID: Final = "chainrt.run_id"
CHAIN: Final = "chainrt.chain"
"""The chain's name."""
BUDGET_MS: Final = "chainrt.budget_ms"
"""The run's total budget."""
RESUMED: Final = "chainrt.resumed"
"""True on the ``chain.run`` span of a resumed execution."""
STATUS: Final = "chainrt.status"
"""Run or step status (``completed``, ``partial``, ``timed_out`` ...)."""
STEP_ID: Final = "chainrt.step_id"
STEP_KIND: Final = "chainrt.step_kind"
"""``llm``, ``tool`` or ``runnable``."""
WEIGHT: Final = "chainrt.weight"
ALLOTTED_MS: Final = "chainrt.allotted_ms"
"""What the budget gave the step when it started."""
USED_MS: Final = "chainrt.used_ms"
"""What the step (or the run, on ``chain.run``) actually used."""
ATTEMPTS: Final = "chainrt.attempts"
"""Attempts a step made in all (retries and fallbacks included)."""
FALLBACK: Final = "chainrt.fallback"
"""The fallback model that answered, when it was not the primary."""
PATH: Final = "chainrt.path"
"""On ``chain.branch`` / ``chain.item``: the branch's path (``gather.kb``, ``per_item[3]``), the
prefix of its inner steps' ``chainrt.step_id`` (an inner step's id is its path)."""
GROUP: Final = "chainrt.group"
"""On ``chain.branch`` / ``chain.item``: the group's path."""
BRANCH: Final = "chainrt.branch"
"""On ``chain.branch``: the branch's name (a switch case, a parallel branch)."""
ITEM_INDEX: Final = "chainrt.item_index"
"""On ``chain.item``: the item's index in the map's list."""
AGENT_TOOL: Final = "chainrt.tool"
"""On ``agent.call``: the tool the model named."""
AGENT_FINAL: Final = "chainrt.final"
"""On ``agent.turn``: true for the last turn, offered no tools (it asks for the answer)."""
LINK_KIND: Final = "chainrt.link"
"""On a span link: why it links (``resumed_from``)."""

# ---------------------------------------------------------------------- concurrency keys

KEYS: Final = "chainrt.keys"
"""The rendered keys requested (a list)."""
KEY: Final = "chainrt.key"
"""The key a rejected acquisition could not get."""
WAITED_MS: Final = "chainrt.waited_ms"
"""Milliseconds spent waiting for the keys."""

# ---------------------------------------------------------------------- dispatch and workers

MODEL: Final = "chainrt.model"
"""The pool's model name (``primary``, ``local``); ``gen_ai.request.model`` is the served name."""
ATTEMPT: Final = "chainrt.attempt"
"""Attempt number within the step (1 = first try; retries and fallbacks count on)."""
ATTEMPT_MS: Final = "chainrt.attempt_ms"
"""Milliseconds one attempt was given (its share of the step's allotment)."""
CONFIDENCE: Final = "chainrt.confidence"
"""The answer's confidence score in [0, 1] (when the model reported one)."""
HOP_PREFIX: Final = "chainrt.hop_ms."
"""``chainrt.hop_ms.queue|admission|prefill|decode|network``: where an attempt's time went."""
HEDGE: Final = "chainrt.hedge"
"""True on the ``llm.dispatch`` span of a hedged attempt (``llm.hedge``: started because the
attempt before it was slow); the attempt that lost the race ends with ``chainrt.status`` =
``cancelled``."""
TOKENS_PROMPT: Final = "chainrt.tokens.prompt"
"""Prompt tokens of a step or run (the sum of its attempts'; on ``llm.dispatch`` the attempt's
own are ``gen_ai.usage.input_tokens``)."""
TOKENS_COMPLETION: Final = "chainrt.tokens.completion"
"""Completion tokens of a step or run (an attempt's: ``gen_ai.usage.output_tokens``)."""
TOKENS_CACHED: Final = "chainrt.tokens.cached"
"""Prompt tokens the server served from its cache (attempt, step or run; when reported)."""
COST: Final = "chainrt.cost"
"""What the tokens cost at the pool's ``price`` (attempt, step or run; when priced)."""
ENDPOINT: Final = "chainrt.endpoint"
"""The worker endpoint URL an attempt went to (``in-process`` for the local model)."""
DEADLINE_MS: Final = "chainrt.deadline_ms"
"""Milliseconds left until the deadline when the request started."""
PRIORITY: Final = "chainrt.priority"
"""``X-Priority`` of a worker request."""
REQUEST_ID: Final = "chainrt.request_id"
"""The worker's id of one generation request."""
ADMISSION: Final = "chainrt.admission"
"""The worker's admission decision: ``admit``, or the reason it refused."""
ENGINE: Final = "chainrt.engine"
"""The worker's engine (``vllm``, ``local``, ``torch``)."""

# OpenTelemetry GenAI conventions (semconv ``gen_ai.*``). ``gen_ai.system`` is the older name of
# ``gen_ai.provider.name``; both are set so that older and newer backends group spans alike.
GEN_AI_SYSTEM: Final = "gen_ai.system"
GEN_AI_PROVIDER_NAME: Final = "gen_ai.provider.name"
GEN_AI_OPERATION_NAME: Final = "gen_ai.operation.name"
"""``chat`` or ``text_completion``."""
GEN_AI_REQUEST_MODEL: Final = "gen_ai.request.model"
GEN_AI_REQUEST_MAX_TOKENS: Final = "gen_ai.request.max_tokens"
GEN_AI_REQUEST_TEMPERATURE: Final = "gen_ai.request.temperature"
GEN_AI_RESPONSE_MODEL: Final = "gen_ai.response.model"
GEN_AI_RESPONSE_ID: Final = "gen_ai.response.id"
GEN_AI_RESPONSE_FINISH_REASONS: Final = "gen_ai.response.finish_reasons"
"""A list, as the convention says (one entry per choice)."""
GEN_AI_USAGE_INPUT_TOKENS: Final = "gen_ai.usage.input_tokens"
GEN_AI_USAGE_OUTPUT_TOKENS: Final = "gen_ai.usage.output_tokens"

# OpenTelemetry HTTP and general conventions.
HTTP_REQUEST_METHOD: Final = "http.request.method"
HTTP_RESPONSE_STATUS_CODE: Final = "http.response.status_code"
HTTP_ROUTE: Final = "http.route"
URL_PATH: Final = "url.path"
SERVER_ADDRESS: Final = "server.address"
SERVER_PORT: Final = "server.port"
ERROR_TYPE: Final = "error.type"
"""The class of a failure (exception type, or the worker's error kind)."""
