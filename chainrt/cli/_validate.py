"""``chainrt validate``: check chain files and pool files, walking folders recursively.

A YAML file is a pool file when its top level has ``models`` and no ``steps``; otherwise it is a
chain. Inside a folder, a YAML file that is neither (no ``steps``, ``budget`` or
``models`` at the top — a compose file, a CI workflow) is skipped and counted, never guessed at;
a file named on the command line is always checked. Hidden folders, ``__pycache__`` and
``node_modules`` are not entered. The pool model (and so ``chainrt.dispatch``) is imported only when
a pool file is found, so validating chains stays as light as before.

A chain's ``tool:``/``runnable:`` files are read (parsed, never run: validating executes no code)
to see that the name a reference points at is defined there, so ``tools/weather.py:nopex`` is
reported at the chain's line instead of failing at run time.
"""

from __future__ import annotations

import os
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

from ..errors import SpecError

__all__ = ["ValidateReport", "validate"]

_SUFFIXES = (".yaml", ".yml")
_SKIP_DIRS = frozenset({"__pycache__", "node_modules"})
_CHAIN_KEYS = frozenset({"steps", "budget"})

Kind = Literal["chain", "pool", "other"]


@dataclass
class ValidateReport:
    """What ``validate`` found: files checked by kind, files skipped, and the errors."""

    chains: list[str] = field(default_factory=list)
    pools: list[str] = field(default_factory=list)
    skipped: list[str] = field(default_factory=list)
    errors: list[SpecError] = field(default_factory=list)

    def summary(self) -> str:
        """One line: ``ok: 3 chains, 1 pool file`` (and what was skipped)."""
        parts = [_count(len(self.chains), "chain"), _count(len(self.pools), "pool file")]
        text = "ok: " + ", ".join(parts)
        if self.skipped:
            text += f" (skipped {_count(len(self.skipped), 'other YAML file')})"
        return text


def _count(n: int, noun: str) -> str:
    return f"{n} {noun}" + ("" if n == 1 else "s")


def _walk(folder: Path) -> Iterator[Path]:
    for root, dirs, files in os.walk(folder):
        dirs[:] = sorted(d for d in dirs if not d.startswith(".") and d not in _SKIP_DIRS)
        for name in sorted(files):
            if name.endswith(_SUFFIXES):
                yield Path(root) / name


def _kind(path: Path) -> Kind:
    """Chain, pool or neither, from the top-level keys.

    Sniffed with PyYAML's safe loader, which reads what chain files may not contain (anchors in
    a compose file); a file it cannot read is left to the strict loader, whose SpecError names
    the line.
    """
    import yaml

    from .._files import FileRefused, read_bounded
    from ..spec._yaml import MAX_FILE_BYTES

    try:
        # Bounded, regular files only: a FIFO named *.yaml must not hang validate (finding 14).
        data = yaml.safe_load(read_bounded(path, MAX_FILE_BYTES))
    except (FileRefused, yaml.YAMLError):
        from ..spec import read_yaml

        data = read_yaml(path).data  # raises the SpecError that says what is wrong
    keys = set(data) if isinstance(data, dict) else set()
    if "models" in keys and "steps" not in keys:
        return "pool"
    return "chain" if keys & _CHAIN_KEYS else "other"


def _check(path: Path, kind: Kind, allowed_modules: Sequence[str] | None) -> None:
    if kind == "pool":
        from ..dispatch._pool import load_pool_config

        load_pool_config(path)
    else:
        from ..spec import load_spec

        loaded = load_spec(path, allowed_modules=allowed_modules)
        _check_definitions(path, loaded.source_dir)


def _check_definitions(path: Path, source_dir: Path) -> None:
    """Every ``tool:``/``runnable:`` file reference names something its file defines; the first
    that does not is a SpecError at the reference's line (the files are parsed, not run)."""
    from ..spec import read_yaml
    from ..spec._imports import definition_problem
    from ..spec._template import format_path

    doc = read_yaml(path)
    seen: dict[str, str | None] = {}
    found: list[tuple[int | None, str, str]] = []  # (line, field, problem)
    for loc, ref in _references(doc.data, ()):
        if ref not in seen:
            seen[ref] = definition_problem(ref, source_dir)
        problem = seen[ref]
        if problem is not None:
            found.append((doc.line(loc), format_path(loc), problem))
    if not found:
        return
    line, field, message = found[0]
    also = [f"line {n}: {f}: {p}" if n is not None else f"{f}: {p}" for n, f, p in found[1:]]
    if also:
        message += "; also " + "; ".join(also)
    raise SpecError(message, file=os.fspath(path), line=line, field=field)


def _references(
    node: object, loc: tuple[str | int, ...]
) -> Iterator[tuple[tuple[str | int, ...], str]]:
    """``(path, reference)`` of every step's ``tool``/``runnable`` in a chain's data, nested
    groups (``parallel``, ``switch`` cases, ``map`` steps) and agents' ``tools`` included."""
    if isinstance(node, dict):
        for key, value in node.items():
            if key in ("tool", "runnable") and isinstance(value, str) and "id" in node:
                yield (*loc, key), value
            elif key == "tools" and isinstance(value, list) and loc and loc[-1] == "agent":
                for index, entry in enumerate(value):  # an agent's tools: ref or {tool: ref}
                    if isinstance(entry, str):
                        yield (*loc, key, index), entry
                    elif isinstance(entry, dict) and isinstance(entry.get("tool"), str):
                        yield (*loc, key, index, "tool"), entry["tool"]
            elif isinstance(value, dict | list):
                yield from _references(value, (*loc, key))
    elif isinstance(node, list):
        for index, item in enumerate(node):
            yield from _references(item, (*loc, index))


def validate(
    paths: Sequence[str | os.PathLike[str]], *, allowed_modules: Sequence[str] | None = None
) -> ValidateReport:
    """Validate every chain and pool file named in ``paths`` or found under a folder there."""
    report = ValidateReport()
    for raw in paths:
        path = Path(raw)
        if path.is_dir():
            files = list(_walk(path))
            if not files:
                report.errors.append(
                    SpecError("no *.yaml or *.yml files here", file=os.fspath(raw))
                )
        else:
            files = [path]
        for file in files:
            try:
                kind = _kind(file)
                if kind == "other" and file is not path:
                    report.skipped.append(os.fspath(file))
                    continue
                _check(file, "chain" if kind == "other" else kind, allowed_modules)
            except SpecError as exc:
                report.errors.append(exc)
                continue
            (report.pools if kind == "pool" else report.chains).append(os.fspath(file))
    return report
