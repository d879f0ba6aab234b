"""LangChain integration (``pip install 'chainrt[langchain]'``): chains as Runnables, Runnables
as steps, and a chat model over the worker pool (DESIGN §11).

    from chainrt.langchain import ChatChainrt
    llm = ChatChainrt(model="primary", fallbacks=["local"], pool="pool.yaml")
    runnable = chainrt.load("chains/support_agent.yaml").as_runnable()   # a ChainRunnable
    pipeline = runnable | RunnableLambda(lambda out: out["answer"])

A chain step ``runnable: file.py:attr`` runs any Runnable under the step's deadline
(:func:`run_runnable_step`, called by the runner). Importing this package imports
``langchain_core`` (slow); nothing else in chainrt imports it.
"""

from __future__ import annotations

from ._chat import ChatChainrt
from ._events import ChainEvent, RunIncomplete
from ._runnable import ChainRunnable
from ._steps import resolve_runnable, run_runnable_step, to_json_output

__all__ = [
    "ChainEvent",
    "ChainRunnable",
    "ChatChainrt",
    "RunIncomplete",
    "resolve_runnable",
    "run_runnable_step",
    "to_json_output",
]
