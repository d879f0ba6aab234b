"""What a cancel finds in flight inside a group (pure): the inner steps it records ``cancelled``.

A cancel fences the run's owner out before it writes, so the canceller writes what the owner
would have (:mod:`chainrt.runs._cancel`). For a straight chain that is one step: the first without a
final record. When that step is a group, the steps running inside it are found the same way,
list by list, in the group's stored form and the run's records: in each branch or item that was
running (the switch's recorded branch; every branch of a ``parallel`` group; the items of a
``map`` wave that has begun), the first step without a final record, unless the list had
already stopped (a record that is neither final nor ``running``: failed, cancelled, ...). A
group found so is searched in turn. A ``map``'s items are those of the wave that was running
when the caller could render its list (a top-level map: :mod:`chainrt.runs._cancel` does), else
those its records name (an item that had not written a record is not found).
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from typing import Any

from .._records import FINAL_STEP_STATUSES, StepRecord
from .._result_tree import inner_lists, is_group

__all__ = ["inner_in_flight"]

_MAX_DEPTH = 8
"""Nesting the chain format allows (deeper lists are not searched)."""


def inner_in_flight(
    group: Mapping[str, Any],
    path: str,
    records: Mapping[str, StepRecord],
    items: int | None = None,
) -> list[str]:
    """The paths of the steps running inside the group ``group`` (its stored form) at ``path``
    when the run was cancelled, nested groups (and their own running steps) included.

    ``items``: how many items the group has, when it is a ``map`` whose list the caller could
    render (else its items are those its records name)."""
    found: list[str] = []
    _search(group, path, records, found, 1, items)
    return found


def _search(
    group: Mapping[str, Any],
    path: str,
    records: Mapping[str, StepRecord],
    found: list[str],
    depth: int,
    items: int | None = None,
) -> None:
    if depth > _MAX_DEPTH:
        return
    for prefix, steps in _running_lists(group, path, records, items):
        inner, step = _first_open(prefix, steps, records)
        if inner is not None and step is not None:
            found.append(inner)
            if is_group(step):
                _search(step, inner, records, found, depth + 1)


def _first_open(
    prefix: str, steps: list[Any], records: Mapping[str, StepRecord]
) -> tuple[str | None, Mapping[str, Any] | None]:
    """A list's first step without a final record, unless the list had stopped before it (a
    record neither final nor ``running``: failed, cancelled, ...) or ended."""
    for step in steps:
        if not isinstance(step, Mapping) or not isinstance(step.get("id"), str):
            return None, None
        inner = prefix + step["id"]
        record = records.get(inner)
        if record is not None and record.status in FINAL_STEP_STATUSES:
            continue
        if record is None or record.status == "running":
            return inner, step
        return None, None
    return None, None


def _running_lists(
    group: Mapping[str, Any],
    path: str,
    records: Mapping[str, StepRecord],
    items: int | None,
) -> Iterator[tuple[str, list[Any]]]:
    """The step lists of ``group`` that may have been running: a switch's recorded branch,
    every branch of a ``parallel`` group; for a ``map`` of ``items`` items, the open items of
    the first wave that has one (the waves run one after another), else the items its records
    name."""
    body, size = group.get("steps"), group.get("max_concurrency")
    if group.get("map") and items is not None and isinstance(body, list):
        size = size if isinstance(size, int) and size > 0 else max(items, 1)
        open_items = [
            i for i in range(items) if _first_open(f"{path}[{i}].", body, records)[0] is not None
        ]
        if open_items:
            wave = open_items[0] // size
            for index in open_items:
                if index // size == wave:
                    yield f"{path}[{index}].", body
        return
    yield from inner_lists(group, path, records)
