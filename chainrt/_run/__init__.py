"""The runner's collaborators (the budget loop itself is :mod:`chainrt._runner`).

_journal    Clock, RunJournal: one execution's clock and state, every checkpoint write
_recording  a step's end written even when the store refuses its record (run ends failed)
_start      a new run's input, run id and budget checked (before anything is written)
_plan       an execution's budget plan (a new run's kept per chain spec)
_step       one step from allotment to record: keys, the kind's executor, settle()
_llm        the llm step kind (dispatch)
_tool       the tool step kind (sync/async callables; retries via tenacity + decide_retry)
_runnable   the runnable step kind (LangChain, imported on first use)
_intercept  RunInterceptor: code wrapped around each execution and each step (tracing)
"""

from __future__ import annotations

from ._intercept import (
    BranchCall,
    BranchStart,
    RunCall,
    RunInterceptor,
    RunStart,
    StepCall,
    chain_runs,
    chain_steps,
)
from ._journal import COMMIT_GRACE_S, Clock, RunJournal
from ._llm import LlmExecutor, llm_call, run_llm
from ._plan import plan_for, step_budget
from ._recording import end_step, finish_output, repeats_side_effects, run_output
from ._runnable import RunnableExecutor
from ._start import check_budget, check_inputs, check_new_run_id, new_run_id
from ._step import (
    KindExecutor,
    StepOutcome,
    StepStart,
    acquire_keys,
    run_step,
    settle,
    skipped_record,
    step_record,
)
from ._tool import TOOL_HOST, TOOL_JOURNAL, ToolExecutor, call_tool, run_tool

__all__ = [
    "COMMIT_GRACE_S",
    "TOOL_HOST",
    "TOOL_JOURNAL",
    "BranchCall",
    "BranchStart",
    "Clock",
    "KindExecutor",
    "LlmExecutor",
    "RunCall",
    "RunInterceptor",
    "RunJournal",
    "RunStart",
    "RunnableExecutor",
    "StepCall",
    "StepOutcome",
    "StepStart",
    "ToolExecutor",
    "acquire_keys",
    "call_tool",
    "chain_runs",
    "chain_steps",
    "check_budget",
    "check_inputs",
    "check_new_run_id",
    "end_step",
    "finish_output",
    "llm_call",
    "new_run_id",
    "plan_for",
    "repeats_side_effects",
    "run_llm",
    "run_output",
    "run_step",
    "run_tool",
    "settle",
    "skipped_record",
    "step_budget",
    "step_record",
]
