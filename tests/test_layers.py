"""The layers of chainrt and workers (docs/architecture.md), enforced on every import.

Every ``import`` and ``from ... import`` in ``chainrt/`` and ``workers/`` counts: module-level,
function-local, under ``if TYPE_CHECKING:`` or in a ``try``. A module may import its own
component and any component of a lower layer; never a higher layer, never another component of
its own layer (``chainrt.serve`` and ``workers.server`` stand side by side and know nothing of
each other). A second check keeps the import graph among chainrt's modules free of cycles, except
the few listed below, each with its reason.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
PACKAGES = ("chainrt", "workers")

LAYERS: list[tuple[str, list[list[str]]]] = [
    # (layer, its components, each a list of module prefixes), bottom first. A module belongs to
    # the longest prefix that names it; ``X.__init__`` is the package X's own module.
    (
        "foundation",
        [
            [
                "chainrt.errors",
                "chainrt._errors",
                "chainrt.wire",
                "chainrt.toolcalls",
                "chainrt._settings",
                "chainrt._version",
                "chainrt._records",
                "chainrt._redact",
            ]
        ],
    ),
    ("engines", [["chainrt.engines"]]),
    ("core", [["chainrt"]]),
    ("facade", [["chainrt.__init__"]]),
    ("integration", [["chainrt.langchain"]]),
    ("services", [["chainrt.serve"], ["workers.server"], ["workers.doctor"]]),
    ("commands", [["chainrt.cli", "chainrt.__main__"], ["workers.cli", "workers.__main__"]]),
    ("namespace", [["workers.__init__"]]),
]

ALLOWED_UPWARD: dict[tuple[str, str], str] = {}
"""(importer, imported) pairs that may cross the layers the wrong way, and why."""

ALLOWED_CYCLES: dict[tuple[str, str], str] = {
    ("chainrt._runtime", "chainrt._chain"): "type-only: Runtime.run/stream take a Chain",
    ("chainrt._result_tree", "chainrt._result"): "type-only: the tree is built of StepSummary",
    ("chainrt._run._intercept", "chainrt._run._flow"): "type-only: BranchCall carries an Ended",
    ("chainrt.store._answers", "chainrt.store._protocol"): (
        "type-only: the answer cache is built for a CheckpointStore (issue 40 moves the choice)"
    ),
    ("chainrt.spec._agent", "chainrt.spec._models"): (
        "the agent step's fields use the step models' small types, and StepSpec holds an agent "
        "(_models imports _agent at its end, once those types exist)"
    ),
    ("chainrt.spec._flow", "chainrt.spec._models"): "type-only: groups hold StepSpecs",
    ("chainrt.spec._wait", "chainrt.spec._models"): "type-only: a wait's checks read the spec",
    ("chainrt.serve._signal_api", "chainrt.serve._service"): "type-only: routes of a Service",
    ("chainrt.serve._handling", "chainrt.serve._service"): "type-only: a handler of a Service",
}
"""(importer, imported) edges left out of the cycle check, and why each closes a cycle."""


# ------------------------------------------------------------------------------ the walker


def module_name(path: Path, root: Path = ROOT) -> str:
    """``chainrt/dispatch/_http.py`` → ``chainrt.dispatch._http``; a package → ``X.__init__``."""
    return ".".join(path.relative_to(root).with_suffix("").parts)


def _known(name: str, root: Path) -> str | None:
    """The module ``name`` is (``X.__init__`` for a package), or None if it is no file here."""
    base = root.joinpath(*name.split("."))
    if base.with_suffix(".py").is_file():
        return name
    if (base / "__init__.py").is_file():
        return f"{name}.__init__"
    return None


def imports(path: Path, root: Path = ROOT) -> Iterator[tuple[int, str]]:
    """(line, module) for every import of a module of ours in ``path``, in any position."""
    name = module_name(path, root)
    package = name.split(".")[:-1]  # X.__init__ and X.y both live in package X
    tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
    for node in ast.walk(tree):  # function-local and TYPE_CHECKING imports count too
        if isinstance(node, ast.Import):
            targets = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            parts = package[: len(package) - node.level + 1] if node.level else []
            base = ".".join([*parts, *([node.module] if node.module else [])])
            targets = [
                f"{base}.{alias.name}" if _known(f"{base}.{alias.name}", root) else base
                for alias in node.names
            ]
        else:
            continue
        for target in targets:
            if target.split(".")[0] not in PACKAGES:
                continue
            while target and _known(target, root) is None:  # `import a.b.C`-like: the module
                target = target.rpartition(".")[0]
            found = _known(target, root) if target else None
            if found is not None and found != name:
                yield node.lineno, found


def modules(root: Path = ROOT) -> list[Path]:
    """Every Python file of the checked packages."""
    return sorted(p for package in PACKAGES for p in (root / package).rglob("*.py"))


def place(module: str) -> tuple[int, str, int]:
    """(layer index, layer name, component index) of ``module``: its longest matching prefix."""
    best: tuple[int, int, str, int] | None = None
    for index, (layer, components) in enumerate(LAYERS):
        for number, prefixes in enumerate(components):
            for prefix in prefixes:
                named = module == prefix or module.startswith(prefix + ".")
                if named and (best is None or len(prefix) > best[0]):
                    best = (len(prefix), index, layer, number)
    if best is None:
        raise LookupError(f"{module} is in no layer: add it to LAYERS in tests/test_layers.py")
    return best[1], best[2], best[3]


def violations(root: Path = ROOT) -> list[str]:
    """``file:line: A (layer) imports B (layer)`` for each import against the layer order."""
    found = []
    for path in modules(root):
        source = module_name(path, root)
        here = place(source)
        for line, target in imports(path, root):
            there = place(target)
            upward = there[0] > here[0]
            sideways = there[0] == here[0] and there[2] != here[2]
            if (upward or sideways) and (source, target) not in ALLOWED_UPWARD:
                rel = path.relative_to(root)
                found.append(f"{rel}:{line}: {source} ({here[1]}) imports {target} ({there[1]})")
    return found


def cycles(root: Path = ROOT, allowed: dict[tuple[str, str], str] = ALLOWED_CYCLES) -> list[str]:
    """Each cycle of chainrt's import graph (less the ``allowed`` edges), with its edges."""
    graph: dict[str, set[str]] = {}
    for path in modules(root):
        source = module_name(path, root)
        if source.startswith("chainrt"):
            graph[source] = {
                target
                for _, target in imports(path, root)
                if target.startswith("chainrt") and (source, target) not in allowed
            }
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    found: list[str] = []

    def visit(node: str) -> None:  # Tarjan's strongly connected components
        index[node] = low[node] = len(index)
        stack.append(node)
        for nxt in graph.get(node, ()):
            if nxt not in index:
                visit(nxt)
                low[node] = min(low[node], low[nxt])
            elif nxt in stack:
                low[node] = min(low[node], index[nxt])
        if low[node] == index[node]:
            members = set()
            while True:
                member = stack.pop()
                members.add(member)
                if member == node:
                    break
            if len(members) > 1:
                edges = sorted(f"{a} -> {b}" for a in members for b in graph[a] & members)
                found.append(f"{len(members)} modules: " + "; ".join(edges))

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return found


# ------------------------------------------------------------------------------- the checks


def test_every_module_has_a_layer() -> None:
    files = modules()
    assert len(files) > 100  # the walk really found both packages
    for path in files:
        place(module_name(path))


def test_no_import_goes_up_or_sideways() -> None:
    assert violations() == []


def test_chainrt_has_no_import_cycle_but_the_listed_ones() -> None:
    assert cycles() == []


def test_every_allowed_exception_is_still_needed() -> None:
    edges = {(module_name(p), t) for p in modules() for _, t in imports(p)}
    stale = sorted(set(ALLOWED_UPWARD) - edges) + sorted(set(ALLOWED_CYCLES) - edges)
    assert stale == [], "no such import any more: remove it from the allowed list"


def test_the_walker_sees_every_form_of_import(tmp_path: Path) -> None:
    for folder in ("chainrt/store", "chainrt/langchain", "workers/server"):
        (tmp_path / folder).mkdir(parents=True)
    for name in (
        "chainrt/__init__",
        "chainrt/_chain",
        "chainrt/errors",
        "chainrt/store/__init__",
        "chainrt/store/_records",
        "chainrt/langchain/__init__",
        "workers/__init__",
        "workers/server/__init__",
        "workers/server/_app",
    ):
        (tmp_path / f"{name}.py").write_text("")
    sample = tmp_path / "chainrt" / "_chain.py"
    sample.write_text(
        "from typing import TYPE_CHECKING\n"
        "import json\n"
        "from . import errors\n"
        "from .store import _records, RunRecord\n"
        "if TYPE_CHECKING:\n"
        "    import chainrt.langchain\n"
        "def f():\n"
        "    from workers.server._app import create_app\n"
        "try:\n"
        "    from .. import nothing_above_the_root\n"
        "except ImportError:\n"
        "    pass\n"
        "from chainrt import __version__\n"
    )
    assert sorted(imports(sample, tmp_path)) == [
        (3, "chainrt.errors"),
        (4, "chainrt.store.__init__"),
        (4, "chainrt.store._records"),
        (6, "chainrt.langchain.__init__"),
        (8, "workers.server._app"),
        (13, "chainrt.__init__"),
    ]


@pytest.mark.parametrize(
    ("source", "target", "why"),
    [
        ("chainrt._chain", "chainrt.langchain.__init__", "core imports integration"),
        ("chainrt.engines._base", "chainrt.dispatch.__init__", "engines import core"),
        ("chainrt.serve._app", "workers.server.__init__", "a service imports its peer"),
        ("chainrt.dispatch._http", "chainrt.__init__", "core imports the facade"),
    ],
)
def test_the_order_refuses_what_the_architecture_forbids(
    source: str, target: str, why: str
) -> None:
    here, there = place(source), place(target)
    assert there[0] > here[0] or (there[0] == here[0] and there[2] != here[2]), why


def test_a_cycle_is_reported_with_its_edges(tmp_path: Path) -> None:
    (tmp_path / "chainrt").mkdir()
    (tmp_path / "chainrt" / "__init__.py").write_text("")
    (tmp_path / "chainrt" / "a.py").write_text("def f():\n    from . import b\n")
    (tmp_path / "chainrt" / "b.py").write_text("from chainrt import a\n")
    (tmp_path / "workers").mkdir()
    assert cycles(tmp_path, {}) == ["2 modules: chainrt.a -> chainrt.b; chainrt.b -> chainrt.a"]


def test_a_violation_names_the_file_line_and_both_layers(tmp_path: Path) -> None:
    (tmp_path / "chainrt" / "langchain").mkdir(parents=True)
    (tmp_path / "workers").mkdir()
    (tmp_path / "chainrt" / "__init__.py").write_text("")
    (tmp_path / "chainrt" / "langchain" / "__init__.py").write_text("from .. import _chain\n")
    (tmp_path / "chainrt" / "_chain.py").write_text(
        "def as_runnable():\n    from .langchain import ChainRunnable\n"
    )
    assert violations(tmp_path) == [
        "chainrt/_chain.py:2: chainrt._chain (core) imports chainrt.langchain.__init__ "
        "(integration)"
    ]
