"""A tool that raises: the step's recorded error says where in the tool (file:line), and
``chainrt inspect --full`` shows the frames down to the raise."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from chainrt._run._raised import MAX_TRACE_LINES, describe_raise, tool_file

CHAIN = """\
name: calc
budget: 5s
inputs: {a: int, b: int}
steps:
  - id: divide
    tool: tools/calc.py:divide
    args: {a: "{{ input.a }}", b: "{{ input.b }}"}
"""

TOOL = """\
import json

SECRET = "hunter2"  # a literal on a line the trace never quotes


def _ratio(a, b):
    return a / b


def divide(a, b):
    json.loads("{}")
    return {"ratio": _ratio(a, b)}
"""
RAISE_LINE = TOOL.splitlines().index("    return a / b") + 1
CALL_LINE = TOOL.splitlines().index('    return {"ratio": _ratio(a, b)}') + 1


def _cli(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "CHAINRT_CHAIN_ROOTS": str(cwd)}
    return subprocess.run(
        [sys.executable, "-m", "chainrt", *args],
        capture_output=True,
        text=True,
        cwd=cwd,
        env=env,
        timeout=90,
        check=False,
    )


def test_the_error_names_the_tool_line_in_json_and_inspect(tmp_path: Path) -> None:
    (tmp_path / "tools").mkdir()
    (tmp_path / "tools" / "calc.py").write_text(TOOL)
    (tmp_path / "calc.yaml").write_text(CHAIN)
    store = f"sqlite:///{tmp_path}/runs.db"
    done = _cli(
        "run", "calc.yaml", "--input", '{"a": 1, "b": 0}', "--store", store, "--json",
        "--run-id", "r1", cwd=tmp_path,
    )  # fmt: skip
    assert done.returncode == 1, done.stderr
    result = json.loads(done.stdout)
    error = result["steps"][0]["error"]
    where = f"tools/calc.py:{RAISE_LINE} in _ratio"
    assert error == f"ZeroDivisionError: division by zero (at {where})"

    short = _cli("inspect", "r1", "--store", store, cwd=tmp_path)
    assert short.returncode == 0, short.stderr
    assert f"error: ZeroDivisionError: division by zero (at {where})" in short.stdout
    assert "trace (innermost last)" not in short.stdout  # the normal view stays short

    full = _cli("inspect", "r1", "--store", store, "--full", cwd=tmp_path)
    assert full.returncode == 0, full.stderr
    lines = full.stdout.splitlines()
    start = next(i for i, line in enumerate(lines) if "trace (innermost last)" in line)
    assert lines[start + 1].strip() == f"tools/calc.py:{CALL_LINE} in divide"
    assert lines[start + 2].strip() == where
    assert "hunter2" not in full.stdout  # no source text, no locals


def _raise_in(fn: Any, *args: Any) -> BaseException:
    try:
        fn(*args)
    except Exception as exc:
        return exc
    raise AssertionError("did not raise")


def _tool_module(tmp_path: Path, source: str) -> dict[str, Any]:
    path = tmp_path / "mod.py"
    path.write_text(source)
    scope: dict[str, Any] = {}
    exec(compile(source, str(path), "exec"), scope)  # a tool file of this test's own
    return scope


def test_a_raise_inside_a_library_points_at_the_tool_line_that_called_it(
    tmp_path: Path,
) -> None:
    scope = _tool_module(tmp_path, "import json\n\ndef parse(text):\n    return json.loads(text)\n")
    exc = _raise_in(scope["parse"], "{nope")
    line, full = describe_raise(exc, scope["parse"])
    assert line.startswith("JSONDecodeError: Expecting property name")
    assert line.endswith(f"(at {tmp_path / 'mod.py'}:4 in parse)") or line.endswith(
        "mod.py:4 in parse)"
    )
    assert "json/decoder.py" in full  # the frames below the tool, with --full
    assert full.splitlines()[0] == line


def test_a_deep_recursion_keeps_the_innermost_frames(tmp_path: Path) -> None:
    source = "def down(n):\n    if n == 0:\n        raise ValueError('bottom')\n    down(n - 1)\n"
    scope = _tool_module(tmp_path, source)
    exc = _raise_in(scope["down"], 50)
    line, full = describe_raise(exc, scope["down"])
    assert line.endswith(":3 in down)")
    trace = full.splitlines()[2:]
    assert len(trace) == MAX_TRACE_LINES + 1
    assert "frames ..." in trace[MAX_TRACE_LINES // 2]
    assert trace[-1].strip().endswith(":3 in down")


def test_an_error_raised_outside_the_tool_file_stays_bare() -> None:
    exc = _raise_in(int, "x")  # a builtin: no frame of any tool file
    assert (
        describe_raise(exc, int) == ("ValueError: invalid literal for int() with base 10: 'x'",) * 2
    )


@pytest.mark.parametrize("wrap", ["plain", "partial", "wrapped"])
def test_tool_file_sees_through_wrappers(wrap: str) -> None:
    import functools

    def tool(x: int) -> int:
        return x

    fn: Any = tool
    if wrap == "partial":
        fn = functools.partial(tool, 1)
    elif wrap == "wrapped":
        fn = functools.wraps(tool)(lambda *a: tool(*a))
    assert tool_file(fn) == __file__
