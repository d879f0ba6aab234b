"""``chainrt/redis/`` is the one home for Redis: nothing outside it imports its private modules.

The store, the limiter, the serve queue, the bus and the answer cache reach Redis through the
public names of ``chainrt.redis`` (its ``__init__`` and ``chainrt.redis.keys``). An import of
``chainrt.redis._anything`` from another module of chainrt, a bench or a script fails here, naming
the file, the line and the module. Unit tests of the wire layer's own parts (``tests/``) may
import them: they test those modules themselves.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
HOME = ROOT / "chainrt" / "redis"
CHECKED = ("chainrt", "bench", "scripts")


def _module_of(path: Path) -> str:
    """The dotted name of the package ``path`` (a .py file under ROOT) belongs to."""
    return ".".join(path.relative_to(ROOT).with_suffix("").parts[:-1])


def _imported(path: Path, tree: ast.AST) -> Iterator[tuple[int, str]]:
    """Every module ``path`` imports (relative imports resolved), with its line."""
    package = _module_of(path)
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                yield node.lineno, alias.name
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                parts = package.split(".")
                base = parts[: len(parts) - node.level + 1]
                module = ".".join([*base, *([node.module] if node.module else [])])
            else:
                module = node.module or ""
            yield node.lineno, module
            for alias in node.names:  # from chainrt.redis import _pipe
                yield node.lineno, f"{module}.{alias.name}"


def _private_redis_imports() -> list[str]:
    found = []
    for top in CHECKED:
        for path in sorted((ROOT / top).rglob("*.py")):
            if path.is_relative_to(HOME):
                continue
            tree = ast.parse(path.read_text(), filename=str(path))
            for line, module in _imported(path, tree):
                parts = module.split(".")
                if parts[:2] == ["chainrt", "redis"] and any(p.startswith("_") for p in parts[2:]):
                    found.append(f"{path.relative_to(ROOT)}:{line} imports {module}")
    return found


def test_nothing_outside_chainrt_redis_imports_its_private_modules() -> None:
    offending = _private_redis_imports()
    assert not offending, (
        "private modules of chainrt/redis/ imported from outside it (use the names of "
        "chainrt.redis or chainrt.redis.keys): " + "; ".join(offending)
    )


def test_the_check_sees_a_private_import() -> None:
    path = ROOT / "chainrt" / "store" / "_example.py"
    tree = ast.parse("from ..redis._pipe import Pipe\nfrom ..redis import _lean, keys\n")
    modules = [module for _, module in _imported(path, tree)]
    assert "chainrt.redis._pipe" in modules
    assert "chainrt.redis._lean" in modules
    assert "chainrt.redis.keys" in modules
