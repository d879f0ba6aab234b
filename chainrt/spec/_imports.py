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
:func:`resolve_callable` / :func:`resolve_object` import it at run time.
"""

from __future__ import annotations

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
