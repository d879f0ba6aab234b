"""The shape of a run with groups: each group's summary holds its inner steps' summaries.

Inner steps are recorded under their paths (``gather.kb.search``, ``per_item[3].classify``); the
result lists the chain's own steps, and under each group (``steps``) the inner steps that ran, in
order: the taken branch of a switch (``branch`` names it), every branch of a parallel group in
the order written, the items of a map in item order. Inner groups nest the same way. An agent
step's model turns and tool calls (``agent.turn[0]``, ``agent.call[0.1]``) nest under it too.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping
from typing import TYPE_CHECKING, Any

from .spec._flow import CHOICE_SUFFIX, DEFAULT_BRANCH

if TYPE_CHECKING:
    from ._records import StepRecord
    from ._result import StepSummary

__all__ = ["inner_lists", "inner_llm_paths", "is_group", "nest_groups"]

Summarise = Callable[["StepRecord"], "StepSummary"]


def nest_groups(
    spec_steps: list[dict[str, Any]],
    records: Mapping[str, StepRecord],
    summaries: list[StepSummary],
    summarise: Summarise,
) -> list[StepSummary]:
    """``summaries`` (the chain's own steps) with each group's inner steps under it."""
    groups = {s.get("id"): s for s in spec_steps if is_group(s) or s.get("agent")}
    if not groups:
        return summaries
    out = []
    for summary in summaries:
        spec = groups.get(summary.id)
        out.append(summary if spec is None else _with_inner(summary, spec, records, summarise))
    return out


def _agent_inner(
    summary: StepSummary, records: Mapping[str, StepRecord], summarise: Summarise
) -> StepSummary:
    """An agent step's summary with its turns and calls (``agent.turn[0]``, ``agent.call[0.1]``)
    under it, in the order they ran."""
    path = summary.path or summary.id
    inner = [
        (rec.started_at, key, rec)
        for key, rec in records.items()
        if key.startswith((path + ".turn[", path + ".call["))
    ]
    if not inner:
        return summary
    nested = [summarise(rec) for _, _, rec in sorted(inner, key=lambda t: (t[0], t[1]))]
    return summary.model_copy(update={"steps": nested})


def inner_llm_paths(spec_steps: list[dict[str, Any]], records: Mapping[str, Any]) -> set[str]:
    """The record ids (paths) of the ``llm`` steps inside groups, for the run's LLM counts."""
    llm: set[str] = set()
    pending: list[Any] = [s for s in spec_steps if is_group(s)]
    while pending:
        group = pending.pop()
        lists = [*(group.get("cases") or {}).values(), *(group.get("parallel") or {}).values()]
        lists += [group.get("default"), group.get("steps")]
        for steps in lists:
            for step in steps if isinstance(steps, list) else ():
                if not isinstance(step, Mapping):
                    continue
                if step.get("llm") is not None and isinstance(step.get("id"), str):
                    llm.add(step["id"])
                if is_group(step):
                    pending.append(step)
    if not llm:
        return set()
    return {key for key in records if "." in key and key.rsplit(".", 1)[1] in llm}


def is_group(spec: Mapping[str, Any]) -> bool:
    """True for the stored form of a ``switch``, ``parallel`` or ``map`` step."""
    return bool(spec.get("switch") or spec.get("parallel") or spec.get("map"))


def _with_inner(
    summary: StepSummary,
    spec: Mapping[str, Any],
    records: Mapping[str, StepRecord],
    summarise: Summarise,
) -> StepSummary:
    if spec.get("agent"):
        return _agent_inner(summary, records, summarise)
    path = summary.path or summary.id
    inner: list[StepSummary] = []
    branch: str | None = None
    for prefix, steps in inner_lists(spec, path, records):
        for step in steps:
            if not isinstance(step, Mapping) or not isinstance(step.get("id"), str):
                continue
            record = records.get(prefix + step["id"])
            if record is None:
                continue
            child = summarise(record).model_copy(update={"id": step["id"]})
            nests = is_group(step) or step.get("agent")
            inner.append(_with_inner(child, step, records, summarise) if nests else child)
    if spec.get("switch"):
        choice = records.get(path + CHOICE_SUFFIX)
        branch = choice.output if choice is not None and isinstance(choice.output, str) else None
    return summary.model_copy(update={"steps": inner, "branch": branch})


def inner_lists(
    spec: Mapping[str, Any], path: str, records: Mapping[str, StepRecord]
) -> Iterator[tuple[str, list[Any]]]:
    """The step lists of a group that ran, each with the path prefix of its steps."""
    if spec.get("switch"):
        choice = records.get(path + CHOICE_SUFFIX)
        name = choice.output if choice is not None else None
        if isinstance(name, str):
            cases = spec.get("cases") or {}
            steps = spec.get("default") if name == DEFAULT_BRANCH else cases.get(name)
            if isinstance(steps, list):
                yield f"{path}.{name}.", steps
    elif isinstance(spec.get("parallel"), Mapping):
        for name, steps in spec["parallel"].items():
            if isinstance(steps, list):
                yield f"{path}.{name}.", steps
    elif isinstance(spec.get("steps"), list):
        opening = path + "["
        indexes = set()
        for key in records:
            if key.startswith(opening):
                end = key.find("]", len(opening))
                number = key[len(opening) : end]
                if end > 0 and number.isdigit():
                    indexes.add(int(number))
        for index in sorted(indexes):
            yield f"{path}[{index}].", spec["steps"]
