"""``ChainRunnable``: a chainrt chain as a LangChain ``Runnable[dict, Any]`` (README.md).

    runnable = chainrt.load("chains/support_agent.yaml").as_runnable(store="sqlite:///runs.db")
    pipeline = runnable | RunnableLambda(lambda out: out["answer"])
    pipeline.invoke({"user_id": "u1", "session_id": "s1", "question": "Where is 1042?"},
                    config={"configurable": {"run_id": "ticket-77", "budget": "8s"}})

Invoking runs the chain once and returns its ``output``. ``configurable`` addresses the run:
``run_id`` resumes that run when the store has it (recorded steps are not run again) and starts
it under that id otherwise; ``budget`` (``"8s"``, ``"1500ms"`` or seconds) overrides the chain's
budget (on resume: the time granted from now). A run that ends ``partial``, ``rejected`` or
``failed`` raises :class:`RunIncomplete`, whose ``result`` says where it stopped; build the
runnable with ``returns="result"`` to get every :class:`~chainrt.RunResult` back instead.

Streaming (``stream``/``astream``, and ``astream_events`` as ``on_chain_stream`` chunks) yields
the run's events as :class:`ChainEvent` dicts while the run goes, then the final value as the
last chunk. The events are those of ``Runtime.stream`` and of ``chainrt serve``'s SSE, key for
key: ``type``, ``run_id``, ``ts`` (unix seconds), ``step_id`` for step events, then the type's
own fields:

    {"type": "run_started",   "run_id": ..., "ts": ..., "chain": ..., "budget": {...},
     "resumed": False}
    {"type": "step_started",  "run_id": ..., "ts": ..., "step_id": "intent",
     "allotted_ms": 1600.0, "model": ...}
    {"type": "token",         "run_id": ..., "ts": ..., "step_id": "intent", "text": ...}
    {"type": "attempt",       "run_id": ..., "ts": ..., "step_id": "intent", "attempt": 1,
     "model": ..., "endpoint": ..., "status": "ok", "ms": 410.9, "why": None}
    {"type": "step_finished", "run_id": ..., "ts": ..., "step_id": "intent",
     "status": "completed", "attempts": 1, "elapsed_ms": 412.3, "model": ..., ...}
    {"type": "run_finished",  "run_id": ..., "ts": ..., "status": "completed", "output": ...,
     "steps": [...], ...}
    <the output>

``token`` and ``attempt`` events come from LLM steps only. After an ``attempt`` whose ``status``
is not ``ok``, the step's earlier tokens are void (the next attempt starts over).

Events cannot be added to each other, so LangChain's stream aggregation (``a + b``, falling back
to the later chunk) reduces a stream to its last chunk: the output. Runnables after this one in a
streamed pipeline therefore see exactly what ``invoke`` would hand them.

Callbacks, tags, metadata and ``run_name`` of the config are honoured (the run's metadata gains
``chainrt_run_id``); ``runnable`` steps inside the chain report to the same callbacks, nested
under this run. Sync calls run on chainrt's background event loop (see ``_loop``); pass store and
pool as URLs / paths, or objects made for the loop you call from.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Iterator, Sequence
from typing import TYPE_CHECKING, Any, Literal

from langchain_core.callbacks import AsyncCallbackManagerForChainRun, CallbackManagerForChainRun
from langchain_core.runnables import Runnable, RunnableConfig
from langchain_core.runnables.config import (
    ensure_config,
    get_config_list,
    set_config_context,
)
from langchain_core.runnables.utils import ConfigurableFieldSpec
from pydantic import BaseModel, ConfigDict, create_model

from .._durations import parse_duration_ms
from .._errors import InputError, RunNotFound
from .._progress import Progress
from .._result import RunResult
from .._runner import new_run_id
from .._runtime import PoolLike, StoreLike, open_runtime
from ._events import ChainEvent, QueueProgress, RunIncomplete
from ._loop import iterate_sync, run_sync
from ._steps import CHAINRT_CONFIG_KEYS

if TYPE_CHECKING:
    from .._chain import Chain
    from .._records import RunRecord

__all__ = ["ChainRunnable"]

_RUN_ID_KEY = "chainrt_run_id"
_PY_TYPES: dict[str, Any] = {
    "str": str,
    "int": int,
    "float": float,
    "bool": bool,
    "list": list[Any],
    "dict": dict[str, Any],
    "any": Any,
}


def _merge_input(chunks: Sequence[Any]) -> Any:
    """One input from streamed input chunks: dicts merge (later keys win), else the last one."""
    if chunks and all(isinstance(c, dict) for c in chunks):
        merged: dict[str, Any] = {}
        for chunk in chunks:
            merged.update(chunk)
        return merged
    return chunks[-1] if chunks else None


class ChainRunnable(Runnable[dict[str, Any], Any]):
    """A chain as a LangChain Runnable: each invocation is one chainrt run (or a resume).

    ``store`` and ``pool`` are as for :meth:`chainrt.Chain.arun`. ``returns="output"`` (default)
    gives the chain's output and raises :class:`RunIncomplete` for runs that did not complete;
    ``returns="result"`` gives the :class:`~chainrt.RunResult` of every run.
    """

    def __init__(
        self,
        chain: Chain,
        *,
        store: StoreLike = None,
        pool: PoolLike = None,
        returns: Literal["output", "result"] = "output",
        name: str | None = None,
    ) -> None:
        if returns not in ("output", "result"):
            raise InputError(f"returns must be 'output' or 'result', got {returns!r}")
        self.chain = chain
        self.store = store
        self.pool = pool
        self.returns = returns
        self.name = name or chain.name

    def __repr__(self) -> str:
        return f"ChainRunnable(chain={self.chain.name!r}, returns={self.returns!r})"

    # ------------------------------------------------------------------ schema

    @property
    def InputType(self) -> type[dict[str, Any]]:
        """Runs take a dict of the chain's inputs."""
        return dict

    @property
    def OutputType(self) -> Any:
        """The chain's output (any JSON value), or a RunResult with ``returns="result"``."""
        return RunResult if self.returns == "result" else Any

    def get_input_schema(self, config: RunnableConfig | None = None) -> type[BaseModel]:
        """A pydantic model of the chain's declared ``inputs`` (any dict when none are declared)."""
        fields: dict[str, Any] = {
            name: (_PY_TYPES.get(type_name, Any), ...)
            for name, type_name in self.chain.spec.inputs.items()
        }
        settings = ConfigDict(extra="forbid") if fields else ConfigDict(extra="allow")
        title = "".join(p.capitalize() for p in self.chain.name.replace("-", "_").split("_"))
        model: type[BaseModel] = create_model(f"{title}Input", __config__=settings, **fields)
        return model

    @property
    def config_specs(self) -> list[ConfigurableFieldSpec]:
        """The ``configurable`` keys this runnable reads: ``run_id`` and ``budget``."""
        return [
            ConfigurableFieldSpec(
                id="run_id",
                annotation=str | None,
                name="Run id",
                description="Resume this chainrt run if the store has it, else start it so.",
                default=None,
            ),
            ConfigurableFieldSpec(
                id="budget",
                annotation=str | float | None,
                name="Budget",
                description="Budget of the run ('8s', '1500ms' or seconds); default: the chain's.",
                default=None,
            ),
        ]

    # ------------------------------------------------------------------ entry points

    def invoke(
        self, input: dict[str, Any], config: RunnableConfig | None = None, **kwargs: Any
    ) -> Any:
        """Run the chain once (blocking) and return its output."""
        return self._call_with_config(
            self._invoke_blocking, input, self._prepare(config, kwargs), run_type="chain"
        )

    async def ainvoke(
        self, input: dict[str, Any], config: RunnableConfig | None = None, **kwargs: Any
    ) -> Any:
        """Run the chain once and return its output."""
        return await self._acall_with_config(
            self._collect, input, self._prepare(config, kwargs), run_type="chain"
        )

    def batch(
        self,
        inputs: list[dict[str, Any]],
        config: RunnableConfig | list[RunnableConfig] | None = None,
        *,
        return_exceptions: bool = False,
        **kwargs: Any,
    ) -> list[Any]:
        """One run per input, concurrently (LangChain's ``max_concurrency`` applies)."""
        _check_batch(config, len(inputs))
        return super().batch(inputs, config, return_exceptions=return_exceptions, **kwargs)

    async def abatch(
        self,
        inputs: list[dict[str, Any]],
        config: RunnableConfig | list[RunnableConfig] | None = None,
        *,
        return_exceptions: bool = False,
        **kwargs: Any,
    ) -> list[Any]:
        """One run per input, concurrently (LangChain's ``max_concurrency`` applies)."""
        _check_batch(config, len(inputs))
        return await super().abatch(inputs, config, return_exceptions=return_exceptions, **kwargs)

    def stream(
        self, input: dict[str, Any], config: RunnableConfig | None = None, **kwargs: Any
    ) -> Iterator[Any]:
        """Events of the run as it goes, then its output (see the module docstring)."""
        yield from self.transform(iter([input]), config, **kwargs)

    async def astream(
        self, input: dict[str, Any], config: RunnableConfig | None = None, **kwargs: Any
    ) -> AsyncIterator[Any]:
        """Events of the run as it goes, then its output (see the module docstring)."""

        async def single() -> AsyncIterator[dict[str, Any]]:
            yield input

        async for chunk in self.atransform(single(), config, **kwargs):
            yield chunk

    def transform(
        self, input: Iterator[dict[str, Any]], config: RunnableConfig | None = None, **kwargs: Any
    ) -> Iterator[Any]:
        """Like :meth:`stream`, with the input arriving in chunks (dicts are merged)."""
        yield from self._transform_stream_with_config(
            input, self._transform_blocking, self._prepare(config, kwargs), run_type="chain"
        )

    async def atransform(
        self,
        input: AsyncIterator[dict[str, Any]],
        config: RunnableConfig | None = None,
        **kwargs: Any,
    ) -> AsyncIterator[Any]:
        """Like :meth:`astream`, with the input arriving in chunks (dicts are merged)."""
        async for chunk in self._atransform_stream_with_config(
            input, self._atransform, self._prepare(config, kwargs), run_type="chain"
        ):
            yield chunk

    # ------------------------------------------------------------------ plumbing

    def _prepare(self, config: RunnableConfig | None, kwargs: dict[str, Any]) -> RunnableConfig:
        """Validate the call and fix the run id, so that it is in the run's metadata from the
        first callback on."""
        if kwargs:
            raise InputError(
                f"{self.get_name()} takes no keyword arguments besides config, got "
                f"{', '.join(sorted(kwargs))}; run options go in config['configurable']"
            )
        config = ensure_config(config)
        configurable = config.get("configurable") or {}
        run_id = configurable.get("run_id")
        if run_id is not None and not isinstance(run_id, str):
            raise InputError(f"configurable run_id must be a string, got {type(run_id).__name__}")
        budget = configurable.get("budget")
        if budget is not None:
            parse_duration_ms(budget, what="configurable budget")  # fail before any callback
        config["configurable"] = dict(configurable)
        config["metadata"] = {**(config.get("metadata") or {}), _RUN_ID_KEY: run_id or new_run_id()}
        return config

    # LangChain passes ``config`` (the child config, whose callbacks nest under this run) only to
    # functions that take both ``run_manager`` and ``config``; the run manager itself is unused.

    def _invoke_blocking(
        self, input: dict[str, Any], run_manager: CallbackManagerForChainRun, config: RunnableConfig
    ) -> Any:
        return run_sync(self._collect(input, None, config))

    async def _collect(
        self,
        input: dict[str, Any],
        run_manager: AsyncCallbackManagerForChainRun | None,
        config: RunnableConfig,
    ) -> Any:
        final: Any = None
        async for item in self._events(input, config):
            final = item
        return final

    def _transform_blocking(
        self,
        chunks: Iterator[dict[str, Any]],
        run_manager: CallbackManagerForChainRun,
        config: RunnableConfig,
    ) -> Iterator[Any]:
        value = _merge_input(list(chunks))
        yield from iterate_sync(self._events(value, config))

    async def _atransform(
        self,
        chunks: AsyncIterator[dict[str, Any]],
        run_manager: AsyncCallbackManagerForChainRun,
        config: RunnableConfig,
    ) -> AsyncIterator[Any]:
        value = _merge_input([chunk async for chunk in chunks])
        async for item in self._events(value, config):
            yield item

    async def _events(self, inputs: Any, config: RunnableConfig) -> AsyncIterator[Any]:
        """The run's events as they happen, then the final value (output or RunResult)."""
        configurable = dict(config.get("configurable") or {})
        explicit = configurable.get("run_id")
        budget = configurable.get("budget")
        budget_ms = None if budget is None else parse_duration_ms(budget, what="budget")
        run_id = str((config.get("metadata") or {}).get(_RUN_ID_KEY) or explicit or new_run_id())
        events: asyncio.Queue[ChainEvent | None] = asyncio.Queue()
        progress = QueueProgress(events, run_id)
        # The run (and the runnables of its steps) sees this config as its parent: callbacks
        # nest under this run, and the keys that address this run do not leak into them.
        # (patch_config would merge configurable dicts, so the keys are dropped by hand.)
        inner = config.copy()
        inner["configurable"] = {
            k: v for k, v in configurable.items() if k not in CHAINRT_CONFIG_KEYS
        }
        with set_config_context(inner) as context:
            task = asyncio.get_running_loop().create_task(
                self._execute(inputs, run_id, explicit is not None, budget_ms, progress),
                context=context,
            )
            task.add_done_callback(lambda _: events.put_nowait(None))
            try:
                while (event := await events.get()) is not None:
                    yield event
                result = task.result()
            finally:
                if not task.done():
                    task.cancel()
                    with contextlib.suppress(asyncio.CancelledError):
                        await task
        yield self._final(result)

    async def _execute(
        self,
        inputs: Any,
        run_id: str,
        may_resume: bool,
        budget_ms: float | None,
        progress: Progress,
    ) -> RunResult:
        async with open_runtime(store=self.store, pool=self.pool, progress=progress) as runtime:
            if may_resume:
                try:
                    record = await runtime.store.get_run(run_id)
                except RunNotFound:
                    record = None
                if record is not None:
                    self._check_same_run(record, inputs)
                    return await runtime.runner.resume(run_id, budget_ms=budget_ms)
            return await runtime.runner.run(
                self.chain.spec,
                inputs,
                source_dir=self.chain.source_dir,
                run_id=run_id,
                budget_ms=budget_ms,
            )

    def _check_same_run(self, record: RunRecord, inputs: Any) -> None:
        if record.chain != self.chain.name:
            raise InputError(
                f"run {record.run_id} belongs to chain {record.chain!r}, not {self.chain.name!r}; "
                "pick another run_id"
            )
        if record.input != inputs:
            raise InputError(
                f"run {record.run_id} exists with a different input; resume it with the same "
                "input, or pick another run_id for a new run"
            )

    def _final(self, result: RunResult) -> Any:
        if self.returns == "result":
            return result
        if result.status != "completed":
            raise RunIncomplete(result)
        return result.output


def _check_batch(config: RunnableConfig | list[RunnableConfig] | None, count: int) -> None:
    """A run id names one run: a batch may not share one between inputs."""
    if count <= 1:
        return
    run_ids = [(c.get("configurable") or {}).get("run_id") for c in get_config_list(config, count)]
    named = [r for r in run_ids if r is not None]
    if len(named) != len(set(named)):
        raise InputError(
            "a batch shares one configurable run_id between several inputs; a run id names one "
            "run — pass one config per input, each with its own run_id (or none)"
        )
