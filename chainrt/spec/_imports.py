"""Resolve ``tool:`` and ``runnable:`` references without letting a YAML file import anything.

Two forms exist:

- ``tools/orders.py:lookup_order`` — a Python file relative to the chain file's directory. After
  ``..`` and symlinks are resolved it must still lie inside that directory. It is executed once
  per absolute path, under a private module name, and cached.
- ``my_pkg.tools:lookup_order`` — an importable module, allowed only when it equals or lies under
  an entry of ``CHAINRT_ALLOWED_MODULES`` (``my_pkg`` allows ``my_pkg.tools``).

A tool must moreover be defined where the reference points: ``tools.py:run`` is refused when
``tools.py`` merely did ``from subprocess import run``, so an allowed file cannot become a door to
every function it imports.

:func:`check_reference` validates a reference at load time without executing user code;
:func:`definition_problem` reads a tool file's syntax tree (still executing nothing) to see that
the name a reference points at is defined there (``chainrt validate``);
:func:`resolve_callable` / :func:`resolve_object` import it at run time.
"""

from __future__ import annotations

import ast
import functools
import hashlib
import importlib
import importlib.util
import inspect
import re
import sys
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType
from typing import Any

from .._errors import SpecError, ToolError

__all__ = [
    "check_reference",
    "definition_problem",
    "is_file_reference",
    "parse_allowed_modules",
    "resolve_callable",
    "resolve_object",
]

_MODULE = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)*$")
_ATTR = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")

_loaded: dict[Path, ModuleType] = {}
_lock = threading.RLock()  # re-entrant: a tool file may itself resolve another tool


@dataclass(frozen=True)
class _Ref:
    target: str  # a file path or a module name
    attr: str
    is_file: bool


def parse_allowed_modules(text: str | Sequence[str]) -> tuple[str, ...]:
    """Split ``CHAINRT_ALLOWED_MODULES`` (``"a, b.c"``) into a tuple of module prefixes."""
    items = text.split(",") if isinstance(text, str) else list(text)
    return tuple(item.strip() for item in items if item.strip())


def _parse(ref: str) -> _Ref:
    """Split ``target:attr``; ``ValueError`` with a readable reason if malformed."""
    if not isinstance(ref, str) or ref.count(":") != 1:
        raise ValueError(
            f"{ref!r} is not a reference: write 'file.py:function' or 'package.module:function'"
        )
    target, attr = (part.strip() for part in ref.split(":"))
    if not _ATTR.match(attr):
        raise ValueError(f"{ref!r}: {attr!r} is not a Python name (one name, no dots)")
    if attr.startswith("__"):
        raise ValueError(f"{ref!r}: dunder names cannot be referenced")
    if target.endswith(".py") or "/" in target or "\\" in target:
        return _Ref(target, attr, is_file=True)
    if not _MODULE.match(target):
        raise ValueError(f"{ref!r}: {target!r} is neither a .py file nor a module name")
    return _Ref(target, attr, is_file=False)


def is_file_reference(ref: str) -> bool:
    """True for a ``file.py:name`` reference (resolved in a folder); False for ``module:name``
    and for anything malformed (which every resolution refuses anyway)."""
    try:
        return _parse(ref).is_file
    except ValueError:
        return False


def _file_in_dir(ref: _Ref, chain_dir: Path) -> Path:
    """The file a reference names, checked to lie inside ``chain_dir``; ValueError if not."""
    relative = Path(ref.target)
    if relative.is_absolute():
        raise ValueError(
            f"{ref.target!r} is an absolute path; write it relative to the chain's directory"
        )
    if relative.suffix != ".py":
        raise ValueError(f"{ref.target!r} is not a .py file")
    root = chain_dir.resolve()
    path = (root / relative).resolve()
    if not path.is_relative_to(root):
        raise ValueError(
            f"{ref.target!r} resolves to {path}, outside the chain's directory {root}; "
            "tools must live next to the chain file (or in a module of CHAINRT_ALLOWED_MODULES)"
        )
    if not path.is_file():
        raise ValueError(f"no file {ref.target!r} in {root}")
    return path


def _check_module(ref: _Ref, allowed: Sequence[str]) -> None:
    prefixes = parse_allowed_modules(allowed)
    if any(ref.target == p or ref.target.startswith(p + ".") for p in prefixes):
        return
    shown = ", ".join(prefixes) if prefixes else "none"
    raise ValueError(
        f"module {ref.target!r} is not allowed (CHAINRT_ALLOWED_MODULES: {shown}); add it there, "
        "or put the code in a .py file next to the chain"
    )


def check_reference(ref: str, chain_dir: Path, allowed: Sequence[str]) -> None:
    """Check a reference at load time, executing nothing; :class:`SpecError` if it is unusable.

    A file reference must name an existing ``.py`` file inside ``chain_dir``; a module reference
    must be on the allow-list. Whether the attribute exists is only known at run time.
    """
    problem = reference_problem(ref, chain_dir, allowed)
    if problem is not None:
        raise SpecError(problem)


def reference_problem(ref: str, chain_dir: Path, allowed: Sequence[str]) -> str | None:
    """What :func:`check_reference` would complain about, or ``None`` (for the loader)."""
    try:
        parsed = _parse(ref)
        if parsed.is_file:
            _file_in_dir(parsed, chain_dir)
        else:
            _check_module(parsed, allowed)
    except ValueError as exc:
        return str(exc)
    return None


MAX_TOOL_FILE_BYTES = 4 * 1024 * 1024
"""Largest tool file :func:`definition_problem` reads (a bigger one is left to run time)."""
_DYNAMIC_CALLS = frozenset({"globals", "exec", "setattr", "vars", "__import__"})
"""Calls through which a module can bind names its syntax does not show."""


def definition_problem(ref: str, chain_dir: Path) -> str | None:
    """For a ``file.py:name`` reference: what is wrong with the name, read from the file's syntax.

    The file is parsed, never executed (``chainrt validate`` runs no code). ``None`` when the
    name is bound at the file's top level (``def``, ``class``, an assignment, an import), when
    the file may bind names dynamically (``from x import *``, a module ``__getattr__``,
    ``globals()``, ``exec``), or when the reference is not a readable file reference (which
    :func:`reference_problem` reports). A syntax error is reported with its line.
    """
    from .._files import FileRefused, read_bounded

    try:
        parsed = _parse(ref)
        if not parsed.is_file:
            return None
        path = _file_in_dir(parsed, chain_dir)
        source = read_bounded(path, MAX_TOOL_FILE_BYTES)
    except (ValueError, FileRefused):
        return None
    try:
        tree = ast.parse(source, filename=str(path))
    except SyntaxError as exc:
        return f"{ref!r}: syntax error in {parsed.target} line {exc.lineno}: {exc.msg}"
    except (ValueError, RecursionError, MemoryError) as exc:  # NUL bytes, absurd nesting
        return f"{ref!r}: {parsed.target} cannot be parsed as Python: {exc}"
    names, dynamic = _top_level_names(tree)
    if parsed.attr in names or dynamic:
        return None
    shown = sorted(n for n in names if not n.startswith("_"))
    listed = ", ".join(shown[:20]) + (", ..." if len(shown) > 20 else "")
    return (
        f"{ref!r}: {parsed.target} defines no {parsed.attr!r} "
        f"(it defines: {listed or 'nothing public'})"
    )


def _top_level_names(tree: ast.Module) -> tuple[set[str], bool]:
    """Names a module binds at its top level (inside ``if``/``try``/``with`` blocks too), and
    whether it may bind others at run time."""
    names: set[str] = set()
    dynamic = False

    def bind(target: ast.AST) -> None:
        for node in ast.walk(target):
            if isinstance(node, ast.Name):
                names.add(node.id)

    def visit(body: list[ast.stmt]) -> None:
        nonlocal dynamic
        for stmt in body:
            if isinstance(stmt, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
                names.add(stmt.name)
            elif isinstance(stmt, ast.Assign):
                for target in stmt.targets:
                    bind(target)
            elif isinstance(stmt, ast.AnnAssign | ast.AugAssign):
                bind(stmt.target)
            elif isinstance(stmt, ast.Import | ast.ImportFrom):
                for alias in stmt.names:
                    if alias.name == "*":
                        dynamic = True
                    else:
                        names.add(alias.asname or alias.name.split(".")[0])
            elif isinstance(stmt, ast.For | ast.AsyncFor):
                bind(stmt.target)
            elif isinstance(stmt, ast.With | ast.AsyncWith):
                for item in stmt.items:
                    if item.optional_vars is not None:
                        bind(item.optional_vars)
            for child in ast.iter_child_nodes(stmt):
                if isinstance(child, ast.NamedExpr):
                    bind(child.target)
            for field in ("body", "orelse", "finalbody"):
                block = getattr(stmt, field, None)
                if isinstance(stmt, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
                    break  # their bodies are not the module's top level
                if isinstance(block, list):
                    visit(block)
            for handler in getattr(stmt, "handlers", ()):
                if handler.name:
                    names.add(handler.name)
                visit(handler.body)
            if isinstance(stmt, ast.Match):
                for case in stmt.cases:
                    visit(case.body)

    visit(tree.body)
    names.discard("*")
    if "__getattr__" in names:
        dynamic = True
    for node in ast.walk(tree):
        if (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Name)
            and node.func.id in _DYNAMIC_CALLS
        ):
            dynamic = True
            break
    return names, dynamic


def _module_name(path: Path) -> str:
    # Stable for one file (same name in every process), unique across files.
    digest = hashlib.sha256(str(path).encode()).hexdigest()[:12]
    stem = re.sub(r"\W", "_", path.stem)
    return f"_chainrt_user_{digest}_{stem}"


def _load_file(path: Path, ref: str) -> ModuleType:
    with _lock:
        module = _loaded.get(path)
        if module is not None:
            return module
        name = _module_name(path)
        spec = importlib.util.spec_from_file_location(name, path)
        if spec is None or spec.loader is None:
            raise ToolError(f"cannot import {ref!r}: {path} is not loadable as Python")
        module = importlib.util.module_from_spec(spec)
        # Registered before running so dataclasses and typing can find the module by name.
        sys.modules[name] = module
        try:
            spec.loader.exec_module(module)
        except SyntaxError as exc:
            sys.modules.pop(name, None)
            raise ToolError(
                f"cannot import {ref!r}: syntax error in {path.name} line {exc.lineno}: {exc.msg}"
            ) from None
        except BaseException as exc:
            sys.modules.pop(name, None)
            if not isinstance(exc, Exception):
                raise
            raise ToolError(
                f"cannot import {ref!r}: running {path.name} raised {type(exc).__name__}: {exc}"
            ) from exc
        _loaded[path] = module
        return module


def _load_module(parsed: _Ref, ref: str) -> ModuleType:
    try:
        return importlib.import_module(parsed.target)
    except SyntaxError as exc:
        raise ToolError(
            f"cannot import {ref!r}: syntax error in {exc.filename} line {exc.lineno}: {exc.msg}"
        ) from None
    except ImportError as exc:
        raise ToolError(f"cannot import {ref!r}: {exc}") from None
    except Exception as exc:
        raise ToolError(
            f"cannot import {ref!r}: importing {parsed.target} raised {type(exc).__name__}: {exc}"
        ) from exc


def _resolve(ref: str, chain_dir: Path, allowed_modules: Sequence[str]) -> tuple[_Ref, Any, str]:
    try:
        parsed = _parse(ref)
        path = _file_in_dir(parsed, chain_dir) if parsed.is_file else None
        if path is None:
            _check_module(parsed, allowed_modules)
    except ValueError as exc:
        raise ToolError(f"cannot import {ref!r}: {exc}") from None
    module = _load_module(parsed, ref) if path is None else _load_file(path, ref)
    try:
        obj = getattr(module, parsed.attr)
    except AttributeError:
        names = sorted(n for n in vars(module) if not n.startswith("_"))
        shown = ", ".join(names[:20]) + (", ..." if len(names) > 20 else "")
        raise ToolError(
            f"cannot import {ref!r}: {parsed.target} has no {parsed.attr!r} (it has: {shown})"
        ) from None
    return parsed, obj, module.__name__


def resolve_object(ref: str, *, chain_dir: Path, allowed_modules: Sequence[str]) -> Any:
    """Import the object ``ref`` names (e.g. a LangChain Runnable); :class:`ToolError` if not."""
    return _resolve(ref, chain_dir, allowed_modules)[1]


def resolve_callable(
    ref: str, *, chain_dir: Path, allowed_modules: Sequence[str]
) -> Callable[..., Any]:
    """Import the tool ``ref`` names and check it is callable and defined where it points.

    Raises :class:`ToolError` for a malformed or disallowed reference, a missing file, a syntax
    error or exception while importing, a missing attribute, or a non-callable; and
    :class:`SpecError` for a callable the file or module did not define (imported functions,
    bound methods of imported objects, partials of them, instances of imported classes).
    """
    parsed, obj, module_name = _resolve(ref, chain_dir, allowed_modules)
    if not callable(obj):
        raise ToolError(f"tool {ref!r} is {type(obj).__name__}, not a function")
    home, shown = _home(obj)
    inside = home == module_name
    if not parsed.is_file:
        inside = inside or any(
            home == p or home.startswith(p + ".") for p in parse_allowed_modules(allowed_modules)
        )
    if not inside:
        target = parsed.target
        raise SpecError(
            f"tool {ref!r} is {home}.{shown}, imported into {target} from elsewhere; a chain may "
            "call only functions defined in its own files or allowed modules — wrap it in a "
            f"function defined in {target}"
        )
    return obj  # type: ignore[no-any-return]


def _home(obj: Any) -> tuple[str, str]:
    """The module that defines the code ``obj`` runs, and its name there.

    A bound method runs its function (``from random import randint`` is a method of an instance
    made in ``random``); a ``functools.partial`` runs its ``func``; any other callable object runs
    its class's ``__call__``; a wrapper (``functools.lru_cache``) its ``__wrapped__``. Their own
    ``__module__`` (if any) is not trusted: it is settable.
    """
    for _ in range(32):  # partials of bound methods of partials ...: unwrap, but not forever
        if inspect.ismethod(obj):
            obj = obj.__func__
        elif isinstance(obj, functools.partial):
            obj = obj.func
        elif not inspect.isclass(obj) and callable(getattr(obj, "__wrapped__", None)):
            obj = obj.__wrapped__  # functools.wraps-style wrappers (lru_cache ...) run their target
        else:
            break
    if not (inspect.isfunction(obj) or inspect.isbuiltin(obj) or inspect.isclass(obj)):
        obj = type(obj)
    home = getattr(obj, "__module__", None)
    name = getattr(obj, "__qualname__", None) or getattr(obj, "__name__", None) or "?"
    return (home if isinstance(home, str) else "?"), str(name)
