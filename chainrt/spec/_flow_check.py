"""What a template may read, and the checks of control flow no single field can make.

:class:`Scope` says which names a template in one field may read: the run's roots, and the steps
that have run when the field is rendered. In a straight chain that is the steps before it; inside
a group it is also the steps before the group in every enclosing list (a branch never sees a
sibling branch, and nothing outside a group sees the steps inside it: they may not have run).
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from dataclasses import dataclass, replace
from typing import Any

from ._cache import PerSpec
from ._expr import Condition, ListLiteral
from ._flow import MAX_NESTING, walk_steps
from ._models import ChainSpec, StepSpec
from ._template import PathKey, Template

__all__ = [
    "CONDITION_ROOT",
    "ITEM_ROOTS",
    "MODEL_FIELDS",
    "Scope",
    "all_steps",
    "branch_problems",
    "duplicate_loc",
    "flow_fields",
    "flow_maps",
    "nesting_problems",
    "step_fields",
    "walk_locs",
]

Loc = tuple[PathKey, ...]

ITEM_ROOTS = ("item", "index")
"""What the steps of a map's body see besides the run's roots."""

CONDITION_ROOT = "models"
"""What ``when`` and ``switch`` see besides: the dispatcher's live view of each model."""

MODEL_FIELDS = ("p50_ms", "p99_ms", "healthy")
"""The fields of ``models.<name>``."""

_NEVER = 1 << 62


@dataclass(frozen=True)
class Scope:
    """What a template in one field may read.

    ``order`` (step id -> position in the field's own step list) is one dict shared by every
    field of that list, so building a step's scope costs the same in a chain of 10 steps as in
    one of 10,000. ``outer`` holds the enclosing lists and the position of the group in each;
    ``inner_of`` (step id -> its outermost group) and ``groups`` (id -> group step) exist only
    in chains with groups.
    """

    roots: tuple[str, ...]
    step_id: str | None  # the step the field belongs to; None for chain-level fields
    before: int  # steps at positions below this have run when the field is rendered
    order: Mapping[str, int]
    outer: tuple[tuple[Mapping[str, int], int], ...] = ()
    inner_of: Mapping[str, str] | None = None
    groups: Mapping[str, StepSpec] | None = None

    def visible(self, step: str) -> bool:
        """True when step ``step``'s output exists when the field is rendered."""
        position = self.order.get(step)
        if position is not None and position < self.before:
            return True
        return any(order.get(step, _NEVER) < before for order, before in self.outer)


def _every_step(spec: ChainSpec) -> tuple[StepSpec, ...]:
    return tuple(step for step, _ in walk_steps(spec.steps))


_every: PerSpec[tuple[StepSpec, ...]] = PerSpec(_every_step)


def all_steps(spec: ChainSpec) -> tuple[StepSpec, ...]:
    """Every step of ``spec`` at any depth, parents first (kept while the spec object lives)."""
    return _every.get(spec)


def step_fields(step: StepSpec, base: Loc, scope: Scope) -> Iterator[tuple[Loc, Any, Scope]]:
    """The template fields of one step (its own, not those of the steps inside it)."""
    if step.llm is not None:
        llm = step.llm
        for name in ("prompt", "system"):
            yield (*base, "llm", name), getattr(llm, name), scope
        for j, message in enumerate(llm.messages or ()):
            yield (*base, "llm", "messages", j, "content"), message.content, scope
    if step.agent is not None:  # chainrt/spec/_agent.py
        agent = step.agent
        for name in ("prompt", "system"):
            yield (*base, "agent", name), getattr(agent, name), scope
        for j, message in enumerate(agent.messages or ()):
            yield (*base, "agent", "messages", j, "content"), message.content, scope
    yield (*base, "args"), step.args, scope
    yield (*base, "input"), step.input, scope
    yield (*base, "static_answer"), step.static_answer, scope
    for j, key in enumerate(step.concurrency):
        yield (*base, "concurrency", j, "key"), key.key, scope


def walk_locs(steps: list[StepSpec], base: Loc = ("steps",)) -> Iterator[tuple[StepSpec, Loc, int]]:
    """Every step at any depth with where it sits in the file and its depth (0: top level)."""
    yield from _walk(steps, base, 0)


def _inner_lists(step: StepSpec, loc: Loc) -> Iterator[tuple[list[StepSpec], Loc, bool]]:
    """A group's step lists, where each sits, and whether it is a map's body."""
    for name, branch in (step.cases or {}).items():
        yield branch, (*loc, "cases", name), False
    if step.default is not None:
        yield step.default, (*loc, "default"), False
    for name, branch in (step.parallel or {}).items():
        yield branch, (*loc, "parallel", name), False
    if step.steps is not None:
        yield step.steps, (*loc, "steps"), True


def _walk(steps: list[StepSpec], base: Loc, depth: int) -> Iterator[tuple[StepSpec, Loc, int]]:
    for index, step in enumerate(steps):
        loc = (*base, index)
        yield step, loc, depth
        for inner, where, _ in _inner_lists(step, loc):
            yield from _walk(inner, where, depth + 1)


def flow_maps(steps: list[StepSpec]) -> tuple[dict[str, str], dict[str, StepSpec]]:
    """Step id -> the innermost group holding it, and group id -> group step."""
    inner_of: dict[str, str] = {}
    groups: dict[str, StepSpec] = {}
    for step, loc, _ in walk_locs(steps):
        if step.is_group:
            groups[step.id] = step
            for inner, _, _ in _inner_lists(step, loc):
                for child in inner:
                    inner_of[child.id] = step.id  # the innermost group holding it
    return inner_of, groups


def flow_fields(steps: list[StepSpec], roots: tuple[str, ...]) -> Iterator[tuple[Loc, Any, Scope]]:
    """Every template field of a chain with groups or ``when``, with what it may read."""
    inner_of, groups = flow_maps(steps)
    yield from _fields(steps, ("steps",), roots, (), inner_of, groups)


def _fields(
    steps: list[StepSpec],
    base: Loc,
    roots: tuple[str, ...],
    outer: tuple[tuple[Mapping[str, int], int], ...],
    inner_of: Mapping[str, str],
    groups: Mapping[str, StepSpec],
) -> Iterator[tuple[Loc, Any, Scope]]:
    order = {step.id: index for index, step in enumerate(steps)}
    for index, step in enumerate(steps):
        loc = (*base, index)
        scope = Scope(roots, step.id, index, order, outer, inner_of, groups)
        yield from step_fields(step, loc, scope)
        condition = replace(scope, roots=(*roots, CONDITION_ROOT))
        if step.when is not None:
            yield (*loc, "when"), step.when, condition
        if step.switch is not None:
            yield (*loc, "switch"), step.switch, condition
        if step.map is not None:
            yield (*loc, "map"), step.map, scope
        for inner, where, is_body in _inner_lists(step, loc):
            inner_roots = (*roots, *ITEM_ROOTS) if is_body and "item" not in roots else roots
            yield from _fields(
                inner, where, inner_roots, (*outer, (order, index)), inner_of, groups
            )


def nesting_problems(steps: list[StepSpec]) -> list[tuple[Loc, str]]:
    """Groups nested deeper than :data:`MAX_NESTING`."""
    return [
        (loc, f"groups nest at most {MAX_NESTING} deep; this one is level {depth + 1}")
        for step, loc, depth in walk_locs(steps)
        if step.is_group and depth + 1 > MAX_NESTING
    ]


def duplicate_loc(data: Mapping[str, Any]) -> Loc:
    """Where a step id repeats in chain data (at any depth), or ``()``."""
    seen: set[str] = set()
    for step, loc in data_steps(data.get("steps"), ("steps",), 0):
        step_id = step.get("id")
        if isinstance(step_id, str):
            if step_id in seen:
                return (*loc, "id")
            seen.add(step_id)
    return ()


def data_steps(
    steps: Any, base: Loc = ("steps",), depth: int = 0
) -> Iterator[tuple[Mapping[str, Any], Loc]]:
    """Every step mapping of a chain's raw (or stored, normalised) ``steps`` list at any depth,
    each before its branches' steps, with where it stands; anything not a step is passed by."""
    if not isinstance(steps, list) or depth > MAX_NESTING + 1:
        return
    for index, step in enumerate(steps):
        if not isinstance(step, Mapping):
            continue
        loc = (*base, index)
        yield step, loc
        for key in ("cases", "parallel"):
            named = step.get(key)
            if isinstance(named, Mapping):
                for name, branch in named.items():
                    yield from data_steps(branch, (*loc, key, str(name)), depth + 1)
        yield from data_steps(step.get("default"), (*loc, "default"), depth + 1)
        yield from data_steps(step.get("steps"), (*loc, "steps"), depth + 1)


def branch_problems(template: Template, groups: Mapping[str, StepSpec] | None) -> list[str]:
    """Comparisons of ``steps.<switch>.branch`` with a name that is not one of its branches."""
    if not groups:
        return []
    problems: list[str] = []
    pending = list(template.expressions)
    while pending:
        node = pending.pop()
        if not isinstance(node, Condition):
            continue
        pending.extend(node.operands)
        if node.op not in ("==", "!=", "in", "not in") or len(node.operands) != 2:
            continue
        for path_side, other in (node.operands, node.operands[::-1]):
            group = _switch_of(path_side, groups)
            if group is None:
                continue
            names = _literal_names(other)
            known = [*(group.cases or {}), *(["default"] if group.default is not None else [])]
            for name in names:
                if name not in known:
                    problems.append(
                        f"{{{{ {node.text} }}}}: switch {group.id!r} has no branch {name!r} "
                        f"(branches: {', '.join(known)})"
                    )
    return problems


def _switch_of(node: Any, groups: Mapping[str, StepSpec]) -> StepSpec | None:
    path = getattr(node, "path", None)
    if getattr(node, "filters", ()) or not isinstance(path, tuple) or len(path) != 3:
        return None
    if path[0] != "steps" or path[2] != "branch" or not isinstance(path[1], str):
        return None
    group = groups.get(path[1])
    return group if group is not None and group.switch is not None else None


def _literal_names(node: Any) -> list[str]:
    if isinstance(node, ListLiteral):
        return [v for v in node.value if isinstance(v, str)]
    if getattr(node, "path", ()) is None and not getattr(node, "filters", ()):
        value = getattr(node, "literal", None)
        return [value] if isinstance(value, str) else []
    return []
