"""chainrt's public face: ``__all__`` pinned, lazy imports, and the chainrt ↔ workers boundary.

``workers`` uses chainrt through public names only (``chainrt.errors``, ``chainrt.wire``,
``chainrt.toolcalls``, ``chainrt.engines``, ``chainrt.tracing``, ``chainrt.Settings``) and chainrt
never imports ``workers``, so either side can reorganise its private modules freely (the layers:
docs/architecture.md). The CLI imports what a command needs when it runs: which modules
``--help``, ``validate`` and ``runs`` load is pinned here (their timings are measured by
``bench/cli_startup.py``, never asserted).
"""

from __future__ import annotations

import ast
import inspect
import json
import subprocess
import sys
from pathlib import Path

import pytest

import chainrt
from chainrt import wire

ROOT = Path(__file__).resolve().parent.parent


def test_chainrt_all_is_pinned() -> None:
    assert sorted(chainrt.__all__) == [
        "BackendError",
        "BudgetError",
        "BudgetSummary",
        "Chain",
        "ChainRTError",
        "CheckpointError",
        "ConcurrencyError",
        "ConcurrencyRejected",
        "ContextLengthExceeded",
        "CorruptRecord",
        "DispatchError",
        "DispatchFailed",
        "EngineDead",
        "EngineOOM",
        "FencedOut",
        "InputError",
        "InsufficientMemory",
        "LeaseReleased",
        "NoEndpoint",
        "RecordTooLarge",
        "RunEvent",
        "RunLocked",
        "RunNotFound",
        "RunResult",
        "Runtime",
        "Settings",
        "SignalRefused",
        "SpecError",
        "StepContext",
        "StepError",
        "StepSummary",
        "StoreUnavailable",
        "TemplateError",
        "ToolError",
        "UntrustedRecord",
        "WorkerError",
        "__version__",
        "aresume",
        "load",
        "resume",
    ]


@pytest.mark.parametrize("name", sorted(set(chainrt.__all__) - {"__version__"}))
def test_every_public_name_resolves_and_is_documented(name: str) -> None:
    value = getattr(chainrt, name)
    assert inspect.getdoc(value), f"chainrt.{name} has no docstring"
    assert name in dir(chainrt)


def test_an_unknown_name_is_an_attribute_error() -> None:
    with pytest.raises(AttributeError, match="no attribute 'nope'"):
        chainrt.nope


def test_wire_all_is_pinned_and_documented() -> None:
    assert sorted(wire.__all__) == [
        "CONTEXT_LENGTH_EXCEEDED",
        "DEADLINE",
        "DEADLINE_HEADER",
        "DEFAULT_PRIORITY",
        "ENGINE_ERROR",
        "ENGINE_OOM",
        "ENGINE_UNAVAILABLE",
        "INJECTED_ERROR",
        "INSUFFICIENT_MEMORY",
        "INTERNAL_ERROR",
        "INVALID_REQUEST",
        "NOT_FOUND",
        "NOT_READY",
        "PRIORITIES",
        "PRIORITY_HEADER",
        "Priority",
        "QUEUE_FULL",
        "REQUEST_ID_HEADER",
        "REQUEST_TOO_LARGE",
        "TRACEPARENT_HEADER",
        "TRACESTATE_HEADER",
        "WireError",
        "breaker_class",
        "decode_deadline",
        "encode_deadline",
        "error_body",
        "insufficient_memory_body",
        "parse_error_body",
        "parse_priority",
        "request_headers",
    ]
    for name in wire.__all__:
        value = getattr(wire, name)
        if inspect.isfunction(value) or inspect.isclass(value):
            assert inspect.getdoc(value), f"chainrt.wire.{name} has no docstring"


def test_toolcalls_all_is_pinned_and_documented() -> None:
    from chainrt import toolcalls

    assert sorted(toolcalls.__all__) == [
        "ANY_JSON_OBJECT",
        "InvalidSchema",
        "ToolCall",
        "ToolSpec",
        "check_json_schema",
        "parse_tool_answer",
        "tool_call_schema",
        "tools_instruction",
    ]
    for name in toolcalls.__all__:
        value = getattr(toolcalls, name)
        if inspect.isfunction(value) or inspect.isclass(value):
            assert inspect.getdoc(value), f"chainrt.toolcalls.{name} has no docstring"


# ------------------------------------------------------------------------ package boundary


def _private_imports(path: Path, other: str) -> list[str]:
    """``module:line: what`` for each import of a private name of package ``other``."""
    tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
    found = []
    for node in ast.walk(tree):  # function-local imports count as much as top-level ones
        modules: list[tuple[str, list[str]]]
        if isinstance(node, ast.Import):
            modules = [(alias.name, []) for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            modules = [(node.module, [alias.name for alias in node.names])]
        else:
            continue
        for module, names in modules:
            parts = module.split(".")
            if parts[0] != other:
                continue
            private = [p for p in parts + names if p.startswith("_") and not p.startswith("__")]
            if private:
                rel = path.relative_to(ROOT) if path.is_relative_to(ROOT) else path.name
                found.append(f"{rel}:{node.lineno}: {module} ({', '.join(private)})")
    return found


@pytest.mark.parametrize(("package", "other"), [("chainrt", "workers"), ("workers", "chainrt")])
def test_no_module_imports_a_private_module_of_the_other_package(package: str, other: str) -> None:
    files = sorted((ROOT / package).rglob("*.py"))
    assert len(files) > 10  # the walk really found the package
    offenders = [hit for path in files for hit in _private_imports(path, other)]
    assert offenders == []


def test_the_boundary_check_sees_every_form_of_private_import(tmp_path: Path) -> None:
    sample = tmp_path / "sample.py"
    sample.write_text(
        "import chainrt._runner\n"
        "from chainrt.tracing import _attributes as attr\n"
        "def f():\n"
        "    from chainrt._settings import get_settings\n"
        "from chainrt import __version__, errors\n"
        "from chainrt.wire import PRIORITIES\n"
        "from . import _local\n"
    )
    hits = _private_imports(sample, "chainrt")
    assert [hit.split(": ", 1)[1] for hit in hits] == [
        "chainrt._runner (_runner)",
        "chainrt.tracing (_attributes)",
        "chainrt._settings (_settings)",
    ]


# ----------------------------------------------------------------------------- lazy imports

_HEAVY = (
    "httpx",
    "redis",
    "opentelemetry",
    "langchain_core",
    "tenacity",
    "chainrt.dispatch",
    "chainrt._runner",
    "chainrt.concurrency",
    "chainrt.engines",
    "workers",
)
_PROBE = """
import atexit, json, sys
atexit.register(lambda: print("MODULES=" + json.dumps(sorted(sys.modules)), file=sys.stderr))
{code}
"""
_CLI = "from chainrt.cli import main; sys.exit(main(sys.argv[1:]))"


def _loaded(code: str, *args: str, env: dict[str, str] | None = None) -> set[str]:
    """The modules a fresh interpreter had imported when ``code`` finished."""
    done = subprocess.run(
        [sys.executable, "-c", _PROBE.format(code=code), *args],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
        env=env,
    )
    lines = [line for line in done.stderr.splitlines() if line.startswith("MODULES=")]
    assert lines, done.stderr
    assert done.returncode == 0, done.stderr
    return set(json.loads(lines[-1].removeprefix("MODULES=")))


def _heavy(modules: set[str], also: tuple[str, ...] = ()) -> list[str]:
    return sorted(
        m for m in modules if any(m == h or m.startswith(h + ".") for h in (*_HEAVY, *also))
    )


@pytest.fixture(scope="module")
def clean_env() -> dict[str, str]:
    import os

    env = {k: v for k, v in os.environ.items() if not k.startswith(("OTEL_", "CHAINRT_"))}
    env["PYTHONPATH"] = str(ROOT)
    return env


def test_import_chainrt_errors_and_wire_need_only_the_standard_library(
    clean_env: dict[str, str],
) -> None:
    loaded = _loaded("import chainrt, chainrt.errors, chainrt.wire", env=clean_env)
    assert _heavy(loaded, ("pydantic", "pydantic_settings", "yaml", "asyncio")) == []
    assert {m for m in loaded if m.startswith("chainrt")} == {
        "chainrt",
        "chainrt._version",
        "chainrt.errors",
        "chainrt.wire",
    }


def test_help_imports_nothing_of_the_runtime(clean_env: dict[str, str]) -> None:
    loaded = _loaded(_CLI, "--help", env=clean_env)
    assert (
        _heavy(loaded, ("pydantic", "pydantic_settings", "yaml", "asyncio", "chainrt.store")) == []
    )


def test_validate_loads_the_spec_but_no_runtime(clean_env: dict[str, str]) -> None:
    loaded = _loaded(_CLI, "validate", "chains/hello.yaml", env=clean_env)
    assert "chainrt.spec" in loaded  # it did validate
    assert _heavy(loaded, ("chainrt.store",)) == []


def test_runs_loads_the_store_but_no_dispatch(clean_env: dict[str, str], tmp_path: Path) -> None:
    store = f"sqlite:///{tmp_path / 'runs.db'}"
    loaded = _loaded(_CLI, "runs", "--store", store, env=clean_env)
    assert "chainrt.store._sqlite" in loaded  # it did open the store
    assert _heavy(loaded, ("chainrt.spec._loader", "yaml")) == []


def test_the_engines_package_loads_no_pydantic(clean_env: dict[str, str]) -> None:
    # The local model's engine lives in the runner too (``local``): importing it stays cheap.
    loaded = _loaded("import chainrt.engines", env=clean_env)
    assert "chainrt.engines._llamacpp" in loaded
    heavy = ("pydantic", "pydantic_settings", "llama_cpp", "httpx", "chainrt._runner")
    assert sorted(m for m in loaded if m.split(".")[0] in heavy or m in heavy) == []
