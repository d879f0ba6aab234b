"""The Python API (README.md): ``load`` a chain, ``run``/``arun`` it, ``resume``/``aresume`` a run.

These calls use the process-wide default runtime for their (store, pool) (``_defaults``): set-up
is paid once, and breakers and latency estimates carry over from run to run.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

from ._defaults import default_runtime, run_sync
from ._integrations import provider
from ._result import RunResult
from ._runtime import PoolLike, StoreLike
from .spec import ChainSpec, load_spec

if TYPE_CHECKING:
    from langchain_core.runnables import Runnable

__all__ = ["Chain", "aresume", "load", "resume"]

Duration = str | float | int | None

_NO_LANGCHAIN = (
    "Chain.as_runnable needs the LangChain integration: pip install -e '.[langchain]' in the "
    "chainrt repository (it provides 'as_runnable' under the chainrt.integrations entry points)"
)


class Chain:
    """A validated chain, ready to run. Build it with :func:`load` (or from a spec)."""

    def __init__(
        self, spec: ChainSpec, *, source_dir: Path | None = None, path: Path | None = None
    ) -> None:
        self.spec = spec
        self.source_dir = source_dir
        self.path = path

    @property
    def name(self) -> str:
        """The chain's name."""
        return self.spec.name

    async def arun(
        self,
        inputs: dict[str, Any],
        *,
        run_id: str | None = None,
        budget: Duration = None,
        store: StoreLike = None,
        pool: PoolLike = None,
    ) -> RunResult:
        """Run the chain once (async). ``budget`` overrides the chain's: ``"8s"`` or seconds."""
        runtime = await default_runtime(store, pool)
        return await runtime.run(self, inputs, run_id=run_id, budget=budget)

    def run(
        self,
        inputs: dict[str, Any],
        *,
        run_id: str | None = None,
        budget: Duration = None,
        store: StoreLike = None,
        pool: PoolLike = None,
    ) -> RunResult:
        """Run the chain once (blocking; do not call from a running event loop)."""
        return run_sync(self.arun(inputs, run_id=run_id, budget=budget, store=store, pool=pool))

    def as_runnable(
        self, *, store: StoreLike = None, pool: PoolLike = None
    ) -> Runnable[dict[str, Any], Any]:
        """This chain as a LangChain ``Runnable[dict, Any]`` (needs ``chainrt[langchain]``).

        The Runnable is :class:`chainrt.langchain.ChainRunnable`, reached through the integration
        seam (:mod:`chainrt._integrations`): the core does not import the integration.
        """
        make = provider("as_runnable")
        if make is None:
            raise ImportError(_NO_LANGCHAIN)
        runnable: Runnable[dict[str, Any], Any] = make(chain=self, store=store, pool=pool)
        return runnable

    def __repr__(self) -> str:
        return f"Chain(name={self.spec.name!r}, steps={[s.id for s in self.spec.steps]})"


def load(path: str | Path) -> Chain:
    """Load and validate a chain YAML file; :class:`SpecError` names file, line and field."""
    loaded = load_spec(path)
    return Chain(loaded.spec, source_dir=loaded.source_dir, path=loaded.path)


async def aresume(
    run_id: str,
    *,
    store: StoreLike = None,
    pool: PoolLike = None,
    budget: Duration = None,
    wait: bool = True,
) -> RunResult:
    """Resume a run from its last checkpoint (async); recorded steps are not run again."""
    runtime = await default_runtime(store, pool)
    return await runtime.resume(run_id, budget=budget, wait=wait)


def resume(
    run_id: str,
    *,
    store: StoreLike = None,
    pool: PoolLike = None,
    budget: Duration = None,
    wait: bool = True,
) -> RunResult:
    """Resume a run from its last checkpoint (blocking)."""
    return run_sync(aresume(run_id, store=store, pool=pool, budget=budget, wait=wait))
