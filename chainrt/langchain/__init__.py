"""LangChain integration (``pip install -e '.[langchain]'`` in the chainrt repository): chains as Runnables, Runnables
as steps, and a chat model over the worker pool (README.md).

    from chainrt.langchain import ChatChainrt
    llm = ChatChainrt(model="primary", fallbacks=["local"], pool="pool.yaml")
    runnable = chainrt.load("chains/support_agent.yaml").as_runnable()   # a ChainRunnable
    pipeline = runnable | RunnableLambda(lambda out: out["answer"])

A chain step ``runnable: file.py:attr`` runs any Runnable under the step's deadline
(:func:`run_runnable_step`, called by the runner). Importing this package imports
``langchain_core`` (slow); nothing else in chainrt imports it. The integration stands above the
runtime core (docs/architecture.md): the core reaches ``ChainRunnable`` and ``run_runnable_step``
through :mod:`chainrt._integrations` (this package's ``chainrt.integrations`` entry points, and
the :func:`~chainrt._integrations.provide` calls below), never by importing this package.
"""

from __future__ import annotations

from .._integrations import provide
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

provide("as_runnable", ChainRunnable)
provide("runnable_step", run_runnable_step)
