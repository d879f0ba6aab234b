"""The docs stay true: every YAML snippet loads, every setting and worker flag is documented,
every relative link points at a file of the repository."""

from __future__ import annotations

import argparse
import ast
import re
from pathlib import Path

import pytest
import yaml
from pydantic import BaseModel

from chainrt._settings import Settings
from chainrt.dispatch import parse_pool_config
from chainrt.spec import _models as spec_models
from chainrt.spec import parse_spec
from workers.cli import build_parser

ROOT = Path(__file__).resolve().parent.parent
PAGES = sorted([ROOT / "README.md", *(ROOT / "docs").glob("*.md")])
FENCE = re.compile(r"^```yaml\n(.*?)^```", re.MULTILINE | re.DOTALL)
LINK = re.compile(r"\]\(([^)#\s]+)(#[^)\s]*)?\)")


def snippets() -> list[tuple[str, str]]:
    found = []
    for page in PAGES:
        text = page.read_text(encoding="utf-8")
        for match in FENCE.finditer(text):
            line = text.count("\n", 0, match.start(1)) + 1
            found.append((f"{page.relative_to(ROOT)} (yaml block at line {line})", match.group(1)))
    return found


SNIPPETS = snippets()


def kind(text: str) -> str:
    """``chain``, ``pool``, ``steps`` (a list of steps, shown out of a chain) or ``other``."""
    data = yaml.safe_load(text)
    if isinstance(data, list) and all(isinstance(s, dict) and "id" in s for s in data):
        return "steps"
    if not isinstance(data, dict):
        return "other"
    if "models" in data and "steps" not in data:
        return "pool"
    return "chain" if "steps" in data else "other"


def as_chain(steps: str) -> str:
    """A chain around a list of steps, declaring every input the steps read."""
    names = sorted(set(re.findall(r"input\.(\w+)", steps)))
    inputs = "".join(f"  {name}: any\n" for name in names)
    indented = "".join(
        f"  {line}\n" if not line.startswith("  ") else f"{line}\n" for line in steps.splitlines()
    )
    return f"name: snippet\nbudget: 10s\ninputs:\n{inputs or '  {}'}\nsteps:\n{indented}"


def test_the_docs_have_chain_and_pool_snippets() -> None:
    kinds = [kind(text) for _, text in SNIPPETS]
    assert kinds.count("chain") >= 4
    assert kinds.count("pool") >= 3


@pytest.mark.parametrize(("where", "text"), SNIPPETS, ids=[w for w, _ in SNIPPETS])
def test_every_yaml_snippet_is_a_valid_chain_or_pool_file(where: str, text: str) -> None:
    found = kind(text)
    if found == "pool":
        parse_pool_config(text, file=where)
    elif found == "steps":  # line numbers in errors are then those of the wrapped text
        parse_spec(as_chain(text), file=where, source_dir=ROOT / "chains")
    elif found == "chain":
        # Tool and runnable references are checked against the shipped chains/ folder.
        parse_spec(text, file=where, source_dir=ROOT / "chains")
    else:
        pytest.fail(f"{where}: a ```yaml block that is neither a chain, steps nor a pool file")


def test_every_setting_is_in_docs_settings() -> None:
    page = (ROOT / "docs" / "settings.md").read_text(encoding="utf-8")
    missing = [
        f"CHAINRT_{name.upper()}"
        for name in Settings.model_fields
        if f"`CHAINRT_{name.upper()}`" not in page
    ]
    assert missing == [], f"document these in docs/settings.md: {missing}"


def test_every_worker_serve_flag_is_in_docs_settings() -> None:
    page = (ROOT / "docs" / "settings.md").read_text(encoding="utf-8")
    commands = next(a for a in build_parser()._actions if isinstance(a, argparse._SubParsersAction))
    serve = commands.choices["serve"]
    flags = [
        option
        for action in serve._actions
        for option in action.option_strings
        if option.startswith("--") and option != "--help"
    ]
    assert "--engine" in flags
    missing = [flag for flag in flags if f"`{flag}`" not in page]
    assert missing == [], (
        f"document these chainrt-worker serve flags in docs/settings.md: {missing}"
    )


def test_relative_links_point_at_files_of_the_repository() -> None:
    broken = []
    for page in PAGES:
        for match in LINK.finditer(page.read_text(encoding="utf-8")):
            target = match.group(1)
            if "://" in target or target.startswith("mailto:"):
                continue
            if not (page.parent / target).exists():
                broken.append(f"{page.relative_to(ROOT)}: {target}")
    assert broken == []


def test_no_page_sends_readers_outside_the_repository() -> None:
    for page in PAGES:
        assert "../shared" not in page.read_text(encoding="utf-8"), page


def test_the_readme_bench_commands_name_scripts_that_exist() -> None:
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    commands = re.findall(r"`((?:\.venv/bin/)?python bench/(\w+)\.py)[^`]*`", readme)
    assert len(commands) >= 8
    missing = [script for _, script in commands if not (ROOT / "bench" / f"{script}.py").exists()]
    assert missing == []
    bare = re.findall(r"`bench/\w+\.py", readme)  # not executable: must be run with a Python
    assert bare == []


PYTHON_FENCE = re.compile(r"^```python\n(.*?)^```", re.MULTILINE | re.DOTALL)


def python_snippets() -> list[tuple[str, str]]:
    found = []
    for page in PAGES:
        text = page.read_text(encoding="utf-8")
        for match in PYTHON_FENCE.finditer(text):
            line = text.count("\n", 0, match.start(1)) + 1
            found.append(
                (f"{page.relative_to(ROOT)} (python block at line {line})", match.group(1))
            )
    return found


def test_python_snippets_parse_and_name_files_of_the_repository() -> None:
    # A newcomer pastes these from the repository root: a pool or chain file they name must be
    # there (`ChatChainrt(..., pool="pool.yaml")` failed as written).
    found = python_snippets()
    assert len(found) >= 5
    missing = []
    for where, code in found:
        ast.parse(code, filename=where)
        for path in re.findall(r"""["']((?:chains/)?[\w./-]+\.ya?ml)["']""", code):
            if not (ROOT / path).is_file():
                missing.append(f"{where}: {path}")
    assert missing == []


def test_the_docs_index_lists_every_page() -> None:
    index = (ROOT / "docs" / "index.md").read_text(encoding="utf-8")
    linked = set(re.findall(r"\]\(([\w-]+\.md)\)", index))
    pages = {p.name for p in (ROOT / "docs").glob("*.md")} - {"index.md"}
    assert pages - linked == set(), "add these pages to docs/index.md"
    assert "docs/index.md" in (ROOT / "README.md").read_text(encoding="utf-8")


def test_every_chain_field_is_in_docs_chain_format() -> None:
    page = (ROOT / "docs" / "chain-format.md").read_text(encoding="utf-8")
    models = [
        model
        for model in vars(spec_models).values()
        if isinstance(model, type)
        and issubclass(model, BaseModel)
        and model.__module__ == spec_models.__name__
    ]
    assert len(models) >= 5
    missing = [
        f"{model.__name__}.{info.alias or name}"
        for model in models
        for name, info in model.model_fields.items()
        if f"`{info.alias or name}`" not in page
    ]
    assert missing == [], f"document these chain fields in docs/chain-format.md: {missing}"
