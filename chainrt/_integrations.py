"""The seam through which the runtime core reaches an integration that stands above it.

The core never imports an integration (docs/architecture.md): ``Chain.as_runnable`` and the
``runnable`` step kind need chainrt's LangChain integration, which itself imports the core, so a
direct import would tie the two into one circle. Instead an integration *provides* a role:

- in its package metadata, under the entry-point group :data:`GROUP` (chainrt's own, in
  ``pyproject.toml``: ``as_runnable`` → ``chainrt.langchain:ChainRunnable`` and
  ``runnable_step`` → ``chainrt.langchain:run_runnable_step``), found on first use, so nobody
  has to import the integration beforehand;
- or by :func:`provide` when it is imported (which also serves a checkout that is not installed).

The core asks :func:`provider` for a role and gets None when no integration provides it (or the
integration's library, e.g. ``langchain-core``, is not installed). The roles, and how the core
calls what provides them:

    as_runnable     (chain=, store=, pool=) -> a LangChain Runnable of the chain
    runnable_step   (step, scope, *, run_id, deadline, source_dir, allowed_modules)
                    -> the StepOutcome of a ``runnable`` step (awaited)

Standard library only.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from importlib.metadata import entry_points
from typing import Any

__all__ = ["GROUP", "provide", "provider"]

GROUP = "chainrt.integrations"
"""The entry-point group in which an installed integration names what it provides, by role."""

_lock = threading.Lock()
_provided: dict[str, Callable[..., Any]] = {}
_looked_up: set[str] = set()


def provide(role: str, value: Callable[..., Any]) -> None:
    """Make ``value`` what :func:`provider` answers for ``role`` (an integration, on import)."""
    with _lock:
        _provided[role] = value


def provider(role: str) -> Callable[..., Any] | None:
    """What provides ``role`` (None: no integration does, or its library is not installed).

    Metadata is read once per role: a role nobody provides costs one look-up per process.
    """
    with _lock:
        if role in _provided or role in _looked_up:
            return _provided.get(role)
    # Loaded without the lock: the integration's import calls provide(), maybe from another
    # thread that is importing it too. Two threads loading at once load the same thing.
    loaded = _installed(role)
    with _lock:
        _looked_up.add(role)
        if loaded is not None:
            _provided.setdefault(role, loaded)
        return _provided.get(role)


def _installed(role: str) -> Callable[..., Any] | None:
    """The entry point of :data:`GROUP` named ``role``, loaded (None if none loads)."""
    for point in entry_points(group=GROUP, name=role):
        try:
            loaded: Callable[..., Any] = point.load()
        except ImportError:  # the integration's extra is not installed
            continue
        return loaded
    return None
