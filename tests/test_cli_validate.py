"""``chainrt validate``: folders searched recursively, pool files checked, other YAML skipped."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent

CHAIN = "name: ok\nbudget: 2s\nsteps:\n  - id: a\n    llm: {model: local, prompt: hi}\n"
POOL = "models:\n  primary:\n    endpoints:\n      - {url: 'http://127.0.0.1:8001', capacity: 1}\n"


def validate(*paths: Path | str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "chainrt", "validate", *map(str, paths)],
        capture_output=True,
        text=True,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
        timeout=120,
    )


@pytest.fixture
def tree(tmp_path: Path) -> Path:
    (tmp_path / "a" / "b").mkdir(parents=True)
    (tmp_path / ".hidden").mkdir()
    (tmp_path / "top.yaml").write_text(CHAIN)
    (tmp_path / "a" / "b" / "deep.yml").write_text(CHAIN.replace("name: ok", "name: deep"))
    (tmp_path / "a" / "pool.yaml").write_text(POOL)
    # A compose file: a `name`, and anchors the strict chain loader refuses; skipped, not an error.
    (tmp_path / "a" / "compose.yaml").write_text(
        "name: app\nx-img: &img redis\nservices:\n  redis: {image: *img}\n"
    )
    (tmp_path / ".hidden" / "broken.yaml").write_text("name: [\n")
    return tmp_path


def test_a_folder_is_searched_recursively_and_pool_files_are_checked(tree: Path) -> None:
    done = validate(tree)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "ok: 2 chains, 1 pool file (skipped 1 other YAML file)"


def test_an_error_in_a_nested_chain_names_its_file_and_line(tree: Path) -> None:
    deep = tree / "a" / "b" / "deep.yml"
    deep.write_text(deep.read_text() + "    colour: red\n")
    done = validate(tree)
    assert done.returncode == 2
    assert f"{deep}:6" in done.stderr
    assert "colour" in done.stderr
    assert "Traceback" not in done.stderr


def test_a_bad_pool_file_names_its_file_line_and_field(tree: Path) -> None:
    pool = tree / "a" / "pool.yaml"
    pool.write_text(POOL.replace("capacity: 1", "capacity: -5"))
    done = validate(tree)
    assert done.returncode == 2
    line = done.stderr.strip()
    assert line.startswith(f"{pool}:4"), line
    assert "capacity" in line


def test_a_file_named_on_the_command_line_is_always_checked(tree: Path) -> None:
    done = validate(tree / "a" / "compose.yaml")
    assert done.returncode == 2  # not silently skipped: it is read as a chain and refused
    assert "compose.yaml" in done.stderr


def test_the_shipped_chains_and_pool_example_validate() -> None:
    done = validate(ROOT / "chains")
    assert done.returncode == 0, done.stderr
    assert "1 pool file" in done.stdout


def test_the_whole_repository_validates() -> None:
    # docker-compose.yml is skipped; every chain (tests' data too) and pool file is valid.
    done = validate(ROOT)
    assert done.returncode == 0, done.stderr
    assert "skipped" in done.stdout


def test_validate_runs_twice_in_one_process(capsys: pytest.CaptureFixture[str]) -> None:
    """The command's function is not shadowed by its own submodule (``chainrt.cli._validate``):
    importing the submodule once used to replace the package's ``_validate`` function, so the
    second in-process ``chainrt validate`` failed with "'module' object is not callable"."""
    import chainrt.cli._validate  # noqa: F401  (what the first call imports)
    from chainrt.cli import main

    hello = str(Path(__file__).parents[1] / "chains" / "hello.yaml")
    assert main(["validate", hello]) == 0
    assert main(["validate", hello]) == 0
    assert "internal error" not in capsys.readouterr().err
