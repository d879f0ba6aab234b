"""``chainrt validate`` reads tool files (parses them, runs nothing) to see the function exists."""

from __future__ import annotations

import ast
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from chainrt.cli._validate import validate
from chainrt.spec._imports import _top_level_names, definition_problem

CHAIN = """\
name: weather
budget: 2s
inputs: {{city: str}}
steps:
  - id: fetch
    tool: tools/weather.py:{name}
    args: {{city: "{{{{ input.city }}}}"}}
"""

TOOL = """\
import os

MARKER = os.environ.get("CHAINRT_TEST_MARKER")
if MARKER:  # proves validate never runs this file
    open(MARKER, "w").close()


def forecast(city: str) -> dict[str, str]:
    return {"city": city, "sky": "clear"}
"""


def _chain(tmp_path: Path, name: str, tool: str = TOOL) -> Path:
    (tmp_path / "tools").mkdir(exist_ok=True)
    (tmp_path / "tools" / "weather.py").write_text(tool)
    path = tmp_path / "weather.yaml"
    path.write_text(CHAIN.format(name=name))
    return path


def test_a_missing_function_is_reported_at_the_chain_line(tmp_path: Path) -> None:
    path = _chain(tmp_path, "nopex")
    report = validate([path])
    assert len(report.errors) == 1
    error = report.errors[0]
    assert error.line == 6  # the `tool:` line
    assert str(error).startswith(f"{path}:6: steps[0].tool: ")
    assert "tools/weather.py defines no 'nopex'" in str(error)
    assert "forecast" in str(error)  # what it does define
    assert report.chains == []


def test_an_existing_function_passes(tmp_path: Path) -> None:
    report = validate([_chain(tmp_path, "forecast")])
    assert report.errors == []
    assert len(report.chains) == 1


def test_the_cli_exits_non_zero_and_never_runs_the_tool_file(tmp_path: Path) -> None:
    path = _chain(tmp_path, "nopex")
    marker = tmp_path / "ran"
    env = {"CHAINRT_TEST_MARKER": str(marker), "PATH": "/usr/bin:/bin"}
    done = subprocess.run(
        [sys.executable, "-m", "chainrt", "validate", str(path)],
        capture_output=True,
        text=True,
        env=env,
        timeout=60,
        check=False,
    )
    assert done.returncode != 0
    assert f"{path}:6" in done.stderr + done.stdout
    assert "nopex" in done.stderr + done.stdout
    assert not marker.exists()
    # A good chain passes, and still nothing was executed.
    _chain(tmp_path, "forecast")
    done = subprocess.run(
        [sys.executable, "-m", "chainrt", "validate", str(path)],
        capture_output=True,
        text=True,
        env=env,
        timeout=60,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    assert not marker.exists()


def test_a_syntax_error_in_the_tool_file_is_reported_with_its_line(tmp_path: Path) -> None:
    path = _chain(tmp_path, "forecast", tool="def forecast(city):\n    return {\n")
    report = validate([path])
    assert len(report.errors) == 1
    assert "syntax error in tools/weather.py line" in str(report.errors[0])


@pytest.mark.parametrize(
    ("source", "name", "defined"),
    [
        ("def f(): pass", "f", True),
        ("async def f(): pass", "f", True),
        ("class F: pass", "F", True),
        ("f = lambda: 1", "f", True),
        ("a, (b, f) = 1, (2, 3)", "f", True),
        ("f: int = 1", "f", True),
        ("from json import dumps as f", "f", True),  # found here; run time refuses imports
        ("import os.path", "os", True),
        ("try:\n    import x\nexcept ImportError:\n    def f(): pass", "f", True),
        ("if True:\n    def f(): pass\nelse:\n    g = 1", "f", True),
        ("with open('x') as f: pass", "f", True),
        ("for f in []: pass", "f", True),
        ("if (f := 1): pass", "f", True),
        ("def g():\n    def f(): pass", "f", False),  # nested: not the module's
        ("class C:\n    def f(self): pass", "f", False),
        ("def g(): pass", "f", False),
    ],
)
def test_top_level_names(source: str, name: str, defined: bool) -> None:
    names, dynamic = _top_level_names(ast.parse(textwrap.dedent(source)))
    assert not dynamic
    assert (name in names) is defined


@pytest.mark.parametrize(
    "source",
    [
        "from os.path import *",
        "def __getattr__(name): ...",
        "globals()['f'] = print",
        "exec('def f(): pass')",
    ],
)
def test_a_file_that_may_bind_names_at_run_time_is_not_judged(tmp_path: Path, source: str) -> None:
    (tmp_path / "t.py").write_text(source + "\n")
    assert definition_problem("t.py:f", tmp_path) is None


def test_references_that_are_not_readable_files_are_left_to_the_other_checks(
    tmp_path: Path,
) -> None:
    assert definition_problem("json:dumps", tmp_path) is None  # a module: not read here
    assert definition_problem("missing.py:f", tmp_path) is None  # reference_problem's finding
    assert definition_problem("../x.py:f", tmp_path) is None
