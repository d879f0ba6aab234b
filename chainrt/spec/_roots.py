"""Chain roots: the folders whose ``.py`` files a process lets chains execute (docs/security.md).

A run started from a chain file resolves its tool files next to that file: the person or code
that named the file chose it. A run *resumed from the store* names its chain folder in its
record, and a store is shared infrastructure: whoever can write a record must not be able to
point a runner at any folder of the machine (the standard library, say, with ``os.py:popen``).
So a stored folder is used only when it lies inside one of this process's chain roots:

- the folders of ``CHAINRT_CHAIN_ROOTS`` (``os.pathsep``-separated; default ``chains``),
- the folders given to :func:`add_chain_root` (the CLI's ``--chains``),
- the folder of every chain file this process loaded (:func:`chainrt.load`, ``chainrt run``).

Relative roots are resolved against the working directory when they are used.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Iterable
from pathlib import Path

__all__ = [
    "add_chain_root",
    "chain_roots",
    "inside_roots",
    "parse_chain_roots",
]

_added: list[Path] = []
_given: set[str] = set()
"""Absolute paths already passed to :func:`add_chain_root` (a reused runtime adds its chain's
folder on every run; resolving it again each time cost ~0.1 ms of set-up per run)."""
_lock = threading.Lock()


def parse_chain_roots(text: str) -> tuple[Path, ...]:
    """Split ``CHAINRT_CHAIN_ROOTS`` (``"chains:/srv/chains"``) into paths; empty parts ignored."""
    return tuple(Path(part.strip()) for part in text.split(os.pathsep) if part.strip())


def add_chain_root(path: str | os.PathLike[str]) -> None:
    """Trust ``path`` (a folder) as a chain root for the rest of this process.

    An absolute path is resolved the first time it is given; a relative one every time (it
    depends on the working directory of the moment).
    """
    given = os.fspath(path)
    absolute = os.path.isabs(given)
    if absolute and given in _given:  # a set lookup is atomic: no lock needed to read
        return
    resolved = Path(given).resolve()
    with _lock:
        if resolved not in _added:
            _added.append(resolved)
        if absolute:
            _given.add(given)


def chain_roots(configured: Iterable[Path] = ()) -> tuple[Path, ...]:
    """``configured`` roots, then those added in this process; resolved, without duplicates."""
    with _lock:
        added = list(_added)
    roots: list[Path] = []
    for root in [*configured, *added]:
        resolved = root.resolve()
        if resolved not in roots:
            roots.append(resolved)
    return tuple(roots)


def inside_roots(folder: Path, roots: Iterable[Path]) -> Path | None:
    """``folder`` resolved (symlinks and ``..`` followed) if it lies in one of ``roots``, else None."""
    resolved = folder.resolve()
    for root in roots:
        if resolved.is_relative_to(root.resolve()):
            return resolved
    return None
