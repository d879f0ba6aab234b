"""Load a chain file into a validated :class:`ChainSpec`, or fail with ONE clear :class:`SpecError`.

Three layers check a chain, in order: the YAML itself (:mod:`._yaml`), the pydantic models
(:mod:`._models`), and the cross-checks no single field can make: every template parses, names
only declared inputs and earlier steps, and tool files exist inside the chain's directory.
Whatever fails is reported as ``file:line: field.path: problem`` on one line; when several things
are wrong the first (by line) leads and the rest are summarised after it.
"""

from __future__ import annotations

import difflib
import itertools
import os
import re
import types
import typing
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ValidationError

from .._errors import SpecError, TemplateError
from .._settings import get_settings
from ._flow import has_flow
from ._flow_check import (
    CONDITION_ROOT,
    ITEM_ROOTS,
    MODEL_FIELDS,
    Scope,
    branch_problems,
    duplicate_loc,
    flow_fields,
    flow_maps,
    nesting_problems,
    step_fields,
    walk_locs,
)
from ._imports import parse_allowed_modules, reference_problem
from ._models import ChainSpec
from ._roots import add_chain_root
from ._template import PathKey, Template, compile_template, format_path, walk_strings
from ._wait import wait_placement_problems
from ._yaml import LinePath, YamlDocument, parse_yaml, read_yaml

__all__ = [
    "LoadedSpec",
    "chain_json_schema",
    "load_spec",
    "parse_spec",
    "spec_from_dict",
    "validate_paths",
]

_MAX_EXTRA_SHOWN = 3
_DICT_TYPE = re.compile(r"a valid dictionary( or instance of \w+)?")


@dataclass(frozen=True)
class LoadedSpec:
    """A validated chain and where it came from (tool files resolve against ``source_dir``)."""

    spec: ChainSpec
    path: Path
    source_dir: Path


@dataclass(frozen=True)
class _Problem:
    loc: LinePath
    message: str
    line: int | None


_LINE_BREAKS = re.compile("[\r\n\x0b\x0c\x1c-\x1e\x85\u2028\u2029]")


def _one_line(text: str) -> str:
    """``str(SpecError)`` must stay on one line, whatever text went into it."""
    return _LINE_BREAKS.sub(" ", text)


def _combine(problems: list[_Problem], file: str | None) -> SpecError:
    """One SpecError: the first problem by line leads, the others follow in brief."""
    ordered = sorted(problems, key=lambda p: (p.line is None, p.line or 0))
    first = ordered[0]
    message = first.message
    extra = [
        f"line {p.line}: {format_path(p.loc) or '(top)'}: {p.message}"
        if p.line is not None
        else f"{format_path(p.loc) or '(top)'}: {p.message}"
        for p in ordered[1 : 1 + _MAX_EXTRA_SHOWN]
    ]
    if extra:
        message += "; also " + "; ".join(extra)
        if len(ordered) > 1 + _MAX_EXTRA_SHOWN:
            message += f"; and {len(ordered) - 1 - _MAX_EXTRA_SHOWN} more"
    return SpecError(
        _one_line(message), file=file, line=first.line, field=format_path(first.loc) or None
    )


# ------------------------------------------------------------------------------ pydantic errors


def _unwrap(tp: Any) -> Any:
    """``X | None`` -> ``X`` (the one non-None member), anything else unchanged."""
    if typing.get_origin(tp) in (typing.Union, types.UnionType):
        members = [a for a in typing.get_args(tp) if a is not type(None)]
        return members[0] if len(members) == 1 else tp
    return tp


def _model_at(loc: LinePath) -> type[BaseModel] | None:
    """The model class that validates the value at ``loc`` (to list its allowed keys)."""
    tp: Any = ChainSpec
    for part in loc:
        if isinstance(tp, type) and issubclass(tp, BaseModel) and isinstance(part, str):
            fields = tp.model_fields
            found = next((f for n, f in fields.items() if part in (n, f.alias)), None)
            if found is None:
                return None
            tp = _unwrap(found.annotation)
        elif typing.get_origin(tp) is list and isinstance(part, int):
            tp = _unwrap(typing.get_args(tp)[0])
        else:
            return None
    return tp if isinstance(tp, type) and issubclass(tp, BaseModel) else None


def _allowed_keys(model: type[BaseModel]) -> list[str]:
    return [field.alias or name for name, field in model.model_fields.items()]


def _kind(value: object) -> str:
    if isinstance(value, Mapping):
        return "a mapping"
    if isinstance(value, list | tuple):
        return "a list"
    return repr(value) if len(repr(value)) <= 60 else repr(value)[:57] + "..."


def _pydantic_message(error: Mapping[str, Any], loc: LinePath) -> str:
    kind = error["type"]
    if kind == "extra_forbidden":
        key = str(loc[-1])
        model = _model_at(loc[:-1])
        if model is None:
            return f"unknown key {key!r}"
        allowed = _allowed_keys(model)
        close = difflib.get_close_matches(key, allowed, n=1)
        hint = f" (did you mean {close[0]!r}?)" if close else ""
        return f"unknown key {key!r}{hint}; allowed: {', '.join(allowed)}"
    if kind == "missing":
        return "required key is missing"
    message = str(error["msg"])
    if message.startswith("Value error, "):
        return message[len("Value error, ") :]
    if message.startswith("Input should"):
        message = message[len("Input ") :]
    message = _DICT_TYPE.sub("a mapping", message)
    if kind not in ("assertion_error",) and "input" in error:
        message += f" (got {_kind(error['input'])})"
    return message


def _locate_root(message: str, data: Mapping[str, Any]) -> LinePath:
    """Point a whole-chain error (a duplicate step id) at the step that repeats."""
    if "duplicate step id" in message:
        return duplicate_loc(data)
    return ()


def _from_validation(
    exc: ValidationError, data: Mapping[str, Any], doc: YamlDocument | None
) -> list[_Problem]:
    problems = []
    for error in exc.errors(include_url=False):
        loc: LinePath = tuple(p for p in error["loc"] if isinstance(p, str | int))
        message = _pydantic_message(error, loc)
        if not loc:
            loc = _locate_root(message, data)
        problems.append(_Problem(loc, message, doc.line(loc) if doc else None))
    return problems


# ------------------------------------------------------------------------------- cross-checks


_STEP_ROOTS = ("input", "steps", "run_id", "step")
_OUTPUT_ROOTS = ("input", "steps", "run_id")
_STEP_FIELDS = ("id", "model", "weight")


_Scope = Scope


_CHAIN_KEY = _Scope(("input", "run_id"), None, 0, {})


def _root_problem(root: str, scope: _Scope) -> str:
    if root == "step" and scope.step_id is None:
        return "'step' exists only in the fields of a step"
    if root == "steps" and "steps" not in scope.roots:
        return (
            "chain concurrency keys are taken before any step runs: they may use only input "
            "and run_id"
        )
    return f"unknown name {root!r}; templates here can use {', '.join(scope.roots)}"


def _steps_problem(ref: tuple[PathKey, ...], scope: _Scope) -> str | None:
    if len(ref) < 2 or not isinstance(ref[1], str):
        return "name a step's output: steps.<id>.output"
    step = ref[1]
    if not scope.visible(step):
        if step == scope.step_id:
            return f"step {step!r} cannot read its own output"
        group = scope.inner_of.get(step) if scope.inner_of is not None else None
        if group is not None and group != step:
            return (
                f"step {step!r} may not have run here: it is inside group {group!r} "
                f"(read steps.{group}.output)"
            )
        if step in scope.order and scope.step_id is not None:
            return f"no step {step!r} before step {scope.step_id!r} (steps run in order)"
        known = ", ".join(itertools.islice(scope.order, 20)) or "none"
        where = f" before step {scope.step_id!r}" if scope.step_id else ""
        return f"no step {step!r}{where} (steps: {known})"
    group_step = scope.groups.get(step) if scope.groups is not None else None
    if group_step is not None:
        return _group_problem(ref, group_step)
    if len(ref) < 3 or ref[2] != "output":
        return f"a step exposes only its output: write steps.{step}.output"
    return None


def _group_problem(ref: tuple[PathKey, ...], group: Any) -> str | None:
    """``steps.<switch>.branch``, and ``steps.<parallel>.output.<branch>`` with a real branch."""
    step = ref[1]
    if group.switch is not None and len(ref) == 3 and ref[2] == "branch":
        return None
    if len(ref) < 3 or ref[2] != "output":
        also = f" (or steps.{step}.branch)" if group.switch is not None else ""
        return f"a step exposes only its output: write steps.{step}.output{also}"
    branch = ref[3] if len(ref) > 3 else None
    if group.parallel is not None and isinstance(branch, str) and branch not in group.parallel:
        names = ", ".join(group.parallel)
        return f"group {step!r} has no branch {branch!r} (branches: {names})"
    return None


def _check_references(template: Template, scope: _Scope, inputs: Mapping[str, str]) -> list[str]:
    """What is wrong with the names ``template`` reads, if it were rendered in ``scope``."""
    problems: list[str] = []
    for ref in template.references:
        root = str(ref[0])
        shown = f"{{{{ {format_path(ref)} }}}}"
        problem: str | None = None
        if root not in scope.roots:
            problem = _root_problem(root, scope)
        elif root == "input" and len(ref) > 1:
            if ref[1] not in inputs:
                declared = ", ".join(inputs) or "none; declare them under `inputs:`"
                problem = f"input {ref[1]!r} is not declared (inputs: {declared})"
        elif root == "steps":
            problem = _steps_problem(ref, scope)
        elif root == "run_id" and len(ref) > 1:
            problem = "run_id is a string; it has no fields"
        elif root == CONDITION_ROOT and (len(ref) != 3 or ref[2] not in MODEL_FIELDS):
            problem = f"write models.<name>.{', .'.join(MODEL_FIELDS)}"
        elif root == ITEM_ROOTS[1] and len(ref) > 1:
            problem = "index is a number; it has no fields"
        elif root == "step" and len(ref) > 1 and (ref[1] not in _STEP_FIELDS or len(ref) > 2):
            problem = f"step has only {', '.join(_STEP_FIELDS)}"
        if problem is not None:
            problems.append(f"{shown}: {problem}")
    return problems


def _template_fields(spec: ChainSpec) -> Iterable[tuple[LinePath, Any, _Scope]]:
    """Every field that is rendered as a template, where it sits, and what it may see."""
    for index, key in enumerate(spec.concurrency):
        yield ("concurrency", index, "key"), key.key, _CHAIN_KEY
    order = {step.id: index for index, step in enumerate(spec.steps)}
    if has_flow(spec.steps):
        yield from flow_fields(spec.steps, _STEP_ROOTS)
    else:
        for index, step in enumerate(spec.steps):
            scope = _Scope(_STEP_ROOTS, step.id, index, order)
            yield from step_fields(step, ("steps", index), scope)
    inner_of, groups = flow_maps(spec.steps) if has_flow(spec.steps) else (None, None)
    yield (
        ("output",),
        spec.output,
        _Scope(_OUTPUT_ROOTS, None, len(order), order, (), inner_of, groups),
    )


def _check_templates(
    spec: ChainSpec, data: Mapping[str, Any], doc: YamlDocument | None
) -> list[_Problem]:
    problems = []
    for base, value, scope in _template_fields(spec):
        for path, text in walk_strings(value, base):
            loc: tuple[PathKey, ...] = path
            try:
                template = compile_template(text)
            except TemplateError as exc:
                problems.append(_Problem(loc, exc.message, doc.line(loc) if doc else None))
                continue
            messages = _check_references(template, scope, spec.inputs)
            if scope.groups:
                messages += branch_problems(template, scope.groups)
            for message in messages:
                problems.append(_Problem(loc, message, doc.line(loc) if doc else None))
    return problems


def _check_imports(
    spec: ChainSpec, source_dir: Path, allowed: Sequence[str], doc: YamlDocument | None
) -> list[_Problem]:
    problems = []
    checked: dict[str, str | None] = {}  # a chain often names one tool file many times
    for step, base, _ in walk_locs(spec.steps):
        refs: list[tuple[LinePath, str | None]] = [(("tool",), step.tool)]
        refs.append((("runnable",), step.runnable))
        if step.agent is not None:  # an agent's tools: agent.tools[j].tool
            refs += [
                (("agent", "tools", j, "tool"), t.tool) for j, t in enumerate(step.agent.tools)
            ]
        for where, ref in refs:
            if ref is None:
                continue
            if ref not in checked:
                checked[ref] = reference_problem(ref, source_dir, allowed)
            problem = checked[ref]
            if problem is not None:
                loc = (*base, *where)
                problems.append(_Problem(loc, problem, doc.line(loc) if doc else None))
    return problems


def _validate(
    data: Any,
    *,
    file: str | None,
    doc: YamlDocument | None,
    source_dir: Path | None,
    allowed: Sequence[str] | None,
) -> ChainSpec:
    if not isinstance(data, Mapping):
        raise SpecError(f"a chain must be a mapping, got {type(data).__name__}", file=file)
    try:
        spec = ChainSpec.model_validate(dict(data))
    except ValidationError as exc:
        raise _combine(_from_validation(exc, data, doc), file) from None
    except (RecursionError, TypeError, ValueError) as exc:
        # Not expected from pydantic, but a malformed dict must still end as a SpecError.
        raise SpecError(f"cannot validate: {_one_line(str(exc))}", file=file) from None
    problems = [
        _Problem(loc, message, doc.line(loc) if doc else None)
        for loc, message in (*nesting_problems(spec.steps), *wait_placement_problems(spec.steps))
    ]
    problems += _check_templates(spec, data, doc)
    if source_dir is not None:
        if allowed is None:
            allowed = parse_allowed_modules(get_settings().allowed_modules)
        problems += _check_imports(spec, source_dir, allowed, doc)
    if problems:
        raise _combine(problems, file)
    return spec


# --------------------------------------------------------------------------------- public API


def spec_from_dict(data: Mapping[str, Any], *, file: str | None = None) -> ChainSpec:
    """Validate a chain given as data, e.g. the normalised spec stored with a run.

    ``spec.model_dump(mode="json", by_alias=True)`` round-trips through it unchanged. Tool files
    are not checked here (there is no chain directory); the runner checks them when it imports.
    """
    return _validate(data, file=file, doc=None, source_dir=None, allowed=None)


def parse_spec(
    source: str | bytes,
    *,
    file: str | None = None,
    source_dir: Path | None = None,
    allowed_modules: Sequence[str] | None = None,
) -> ChainSpec:
    """Validate chain YAML given as text. With ``source_dir``, tool references are checked too."""
    doc = parse_yaml(source, file=file)
    return _validate(doc.data, file=file, doc=doc, source_dir=source_dir, allowed=allowed_modules)


def load_spec(
    path: str | os.PathLike[str], *, allowed_modules: Sequence[str] | None = None
) -> LoadedSpec:
    """Read and validate a chain file; :class:`SpecError` names file, line and field if invalid.

    ``allowed_modules`` defaults to ``CHAINRT_ALLOWED_MODULES``. No user code runs: tool files are
    only checked to exist inside the chain's directory. That directory becomes one of this
    process's chain roots (:mod:`chainrt.spec._roots`): the caller named the file.
    """
    name = os.fspath(path)
    doc = read_yaml(path)
    resolved = Path(path).resolve()
    spec = _validate(
        doc.data, file=name, doc=doc, source_dir=resolved.parent, allowed=allowed_modules
    )
    add_chain_root(resolved.parent)
    return LoadedSpec(spec=spec, path=resolved, source_dir=resolved.parent)


def validate_paths(
    paths: Iterable[str | os.PathLike[str]], *, allowed_modules: Sequence[str] | None = None
) -> list[SpecError]:
    """Validate chain files (a directory means every ``*.yaml``/``*.yml`` in it); the errors."""
    errors: list[SpecError] = []
    for raw in paths:
        path = Path(raw)
        if path.is_dir():
            files = sorted(p for p in path.iterdir() if p.suffix in (".yaml", ".yml"))
            if not files:
                errors.append(SpecError("no *.yaml or *.yml files here", file=os.fspath(raw)))
        else:
            files = [path]
        for file in files:
            try:
                load_spec(os.fspath(raw) if file is path else file, allowed_modules=allowed_modules)
            except SpecError as exc:
                errors.append(exc)
    return errors


def chain_json_schema() -> dict[str, Any]:
    """The JSON Schema (draft 2020-12) of the chain format, for editors and ``chainrt schema``."""
    schema = ChainSpec.model_json_schema(by_alias=True)
    schema.pop("title", None)
    schema.pop("description", None)
    return {
        "$schema": "https://json-schema.org/draft/2020-12/schema",
        "title": "chainrt chain",
        "description": "A chainrt chain file (docs/chain-format.md): budget, inputs, concurrency keys, "
        "weighted steps (llm | tool | runnable, and the groups switch | parallel | map) and "
        "output. Templates are written {{ expr }}.",
        **schema,
    }
