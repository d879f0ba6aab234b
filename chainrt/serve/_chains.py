"""Loading the chains a runner serves: every chain file under a directory, by ``name``.

A file that is no chain (a pool file, a broken YAML) is skipped and reported; two files that
declare the same ``name`` are refused (SpecError naming both): serving one of them silently
would run the wrong chain for half of the fleet.
"""

from __future__ import annotations

from pathlib import Path

from .._chain import Chain
from .._errors import SpecError
from ..spec import load_spec

__all__ = ["load_chain_dir"]


def load_chain_dir(root: Path) -> tuple[dict[str, Chain], list[str]]:
    """The chains under ``root`` by name, and one line per file that was skipped.
    SpecError when two files declare the same chain name."""
    chains: dict[str, Chain] = {}
    errors: list[str] = []
    files = sorted([*root.glob("*.yaml"), *root.glob("*.yml")]) if root.is_dir() else []
    for path in files:
        try:
            loaded = load_spec(path)
        except SpecError as exc:
            errors.append(str(exc).splitlines()[0])
            continue
        name = loaded.spec.name
        if name in chains:
            raise SpecError(
                f"two chain files declare the name {name!r}: {chains[name].path} and {path}; "
                "rename one (a runner serves a chain by its name)"
            )
        chains[name] = Chain(loaded.spec, source_dir=loaded.source_dir, path=loaded.path)
    return chains, errors
