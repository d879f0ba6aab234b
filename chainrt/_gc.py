"""Garbage-collector tuning for the processes chainrt owns (``chainrt run``/``resume``/``serve``).

A runner allocates many short-lived container objects per durable step (records, coroutines,
futures, dicts); with CPython's default gen0 threshold (700) that is a young collection every few
steps, and objects that live across a few awaits get promoted and rescanned by the older
generations, whose full collections walk every object start-up left behind (pydantic schemas,
the redis client, FastAPI). :func:`tune_gc_for_runner` moves what start-up allocated out of the
collector's reach (:func:`gc.freeze` after a :func:`gc.collect`) and raises the gen0 threshold.
docs/performance.md ("Round 8") has the figures; ``CHAINRT_GC_TUNING=0`` leaves the collector
as it is.

Only chainrt's own entry points call it: a library (``open_runtime``, ``Runner``,
``chainrt.serve.serve``) must not change its host process's collector.
"""

from __future__ import annotations

import gc

__all__ = ["GC_THRESHOLDS", "tune_gc_for_runner"]

GC_THRESHOLDS = (10_000, 20, 100)
"""The (gen0, gen1, gen2) thresholds a tuned process runs with (CPython's default: 700, 10, 10)."""

_tuned = False


def tune_gc_for_runner() -> bool:
    """Tune this process's collector for a long-running runner, once; True when it is tuned.

    Collects, then freezes every object alive (start-up's modules, schemas and clients are never
    scanned again; one that later becomes cyclic garbage stays allocated) and sets
    :data:`GC_THRESHOLDS`. A second call changes nothing. With ``CHAINRT_GC_TUNING`` off it does
    nothing and returns False. Call it from a process's own entry point, after its imports.
    """
    global _tuned
    if _tuned:
        return True
    from ._settings import get_settings

    if not get_settings().gc_tuning:
        return False
    gc.collect()
    gc.freeze()
    gc.set_threshold(*GC_THRESHOLDS)
    _tuned = True
    return True
