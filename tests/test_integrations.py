"""The integration seam (chainrt/_integrations.py): the core reaches LangChain without importing it."""

from __future__ import annotations

import subprocess
import sys
import tomllib
from importlib.metadata import entry_points
from pathlib import Path

import pytest

import chainrt
from chainrt import _chain, _integrations

ROOT = Path(__file__).resolve().parent.parent


def test_the_installed_entry_points_are_the_ones_pyproject_declares() -> None:
    # An environment installed before an entry point was added misses it: scripts/setup again.
    declared = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))
    wanted = declared["project"]["entry-points"][_integrations.GROUP]
    installed = {p.name: p.value for p in entry_points(group=_integrations.GROUP)}
    assert installed == wanted, "run scripts/setup (pip install -e .) to register the entry points"


def test_as_runnable_finds_the_integration_nobody_imported() -> None:
    code = (
        "import sys, chainrt\n"
        "chain = chainrt.load('chains/hello.yaml')\n"
        "assert 'chainrt.langchain' not in sys.modules\n"
        "print(type(chain.as_runnable()).__name__)\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "ChainRunnable"


def test_the_roles_are_what_the_integration_provides() -> None:
    from chainrt.langchain import ChainRunnable, run_runnable_step

    assert _integrations.provider("as_runnable") is ChainRunnable
    assert _integrations.provider("runnable_step") is run_runnable_step
    assert _integrations.provider("no-such-role") is None


def test_without_the_integration_as_runnable_says_how_to_install_it(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(_chain, "provider", lambda role: None)
    chain = chainrt.load(ROOT / "chains" / "hello.yaml")
    with pytest.raises(ImportError, match=r"pip install -e '\.\[langchain\]'"):
        chain.as_runnable()


def test_a_provided_role_is_answered_without_reading_metadata() -> None:
    def fake(**kwargs: object) -> str:
        return "fake"

    _integrations.provide("test-integrations-role", fake)
    assert _integrations.provider("test-integrations-role") is fake
