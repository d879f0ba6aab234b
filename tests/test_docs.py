"""The docs stay true: every YAML snippet loads, every setting and worker flag is documented,
every relative link points at a file of the repository."""

from __future__ import annotations

import argparse
import ast
import json
import os
import re
import shlex
from pathlib import Path

import pytest
import yaml
from pydantic import BaseModel

from chainrt._events import EVENT_TYPES
from chainrt._settings import Settings
from chainrt.dispatch import parse_pool_config
from chainrt.spec import _models as spec_models
from chainrt.spec import chain_json_schema, parse_spec
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


# -- the README's commands and what the docs promise (issue 41) -----------------------------------


def shell_blocks(text: str) -> list[str]:
    """The bodies of the ```bash and bare ``` blocks of a page (fences paired in order)."""
    blocks: list[str] = []
    body: list[str] = []
    kind: str | None = None
    for line in text.splitlines():
        if line.startswith("```"):
            if kind is None:
                kind, body = line[3:].strip(), []
            else:
                if kind in ("", "bash"):
                    blocks.append("\n".join(body))
                kind = None
        elif kind is not None:
            body.append(line)
    return blocks


def readme_commands() -> list[list[str]]:
    """Every command line of the README's shell blocks (continuations joined, comments dropped),
    as argv lists."""
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    commands = []
    for block in shell_blocks(readme):
        for line in block.replace("\\\n", " ").splitlines():
            argv = shlex.split(line, comments=True)
            if argv:
                commands.append(argv)
    return commands


def _chainrt_parser() -> argparse.ArgumentParser:
    from chainrt.cli import _parser

    return _parser()


def test_every_readme_command_parses_with_the_cli_it_names() -> None:
    """`chainrt ...` and `chainrt-worker ...` lines are parsed by the real argument parsers (an
    unknown subcommand or flag fails); `scripts/...` name executable scripts that take the
    options shown; the rest name tools the README's text introduces (docker compose)."""
    commands = readme_commands()
    assert len(commands) >= 15
    parsers = {"chainrt": _chainrt_parser(), "chainrt-worker": build_parser()}
    checked, wrong = 0, []
    for argv in commands:
        if argv[:4] == ["docker", "compose", "exec", "runner"]:
            argv = argv[4:]
        program = argv[0].removeprefix(".venv/bin/")
        if program in parsers:
            try:
                parsers[program].parse_args(argv[1:])
            except (SystemExit, Exception) as exc:  # chainrt's parser raises its usage error
                wrong.append(f"{' '.join(argv)}: {exc}")
            checked += 1
        elif program.startswith("scripts/"):
            script = ROOT / program
            if not (script.is_file() and os.access(script, os.X_OK)):
                wrong.append(f"{program}: not an executable script of the repository")
                continue
            text = script.read_text(encoding="utf-8")
            wrong += [f"{program}: no option {a}" for a in argv[1:] if a.startswith("--")
                      and a not in text]  # fmt: skip
            checked += 1
        elif program in ("docker", "python", ".venv/bin/python"):
            continue
        else:
            wrong.append(f"a command the test does not know: {' '.join(argv)}")
    assert checked >= 12
    assert wrong == []


def test_relative_links_to_sections_name_a_heading_of_the_page() -> None:
    def slugs(page: Path) -> set[str]:
        headings = re.findall(r"^#+ (.+)$", page.read_text(encoding="utf-8"), re.MULTILINE)
        out = set()
        for heading in headings:
            slug = re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")
            out.add(slug)
        return out

    broken, seen = [], 0
    for page in PAGES:
        for match in LINK.finditer(page.read_text(encoding="utf-8")):
            target, anchor = match.group(1), match.group(2)
            if anchor is None or "://" in target or not target.endswith(".md"):
                continue
            seen += 1
            if anchor[1:] not in slugs(page.parent / target):
                broken.append(f"{page.relative_to(ROOT)}: {target}{anchor}")
    assert seen >= 1
    assert broken == []


def test_install_commands_name_no_package_the_index_lacks() -> None:
    # chainrt is not on PyPI: `pip install 'chainrt[serve]'` sent a newcomer nowhere.
    wrong = re.compile(r"pip install ['\"]?chainrt\b")
    found = [
        f"{page.relative_to(ROOT)}:{number}"
        for page in PAGES
        for number, line in enumerate(page.read_text(encoding="utf-8").splitlines(), 1)
        if wrong.search(line)
    ]
    assert found == []


def test_the_readme_names_every_event_a_streamed_runnable_yields() -> None:
    # A streamed runnable yields the runtime's own events (one shape): every type there is.
    events = set(EVENT_TYPES)
    assert {"run_started", "token", "run_finished"} <= events
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    paragraph = readme[readme.index("`stream`/`astream` yield") :].split("\n\n")[0]
    named = set(re.findall(r"`(\w+)`", paragraph))
    assert events - named == set(), "the README's stream/astream paragraph misses these events"
    assert "one event per step" not in paragraph


def test_the_pages_agree_on_where_sqlite_concurrency_keys_hold() -> None:
    # docs/concurrency.md (and tests/test_limiter_multiprocess.py) hold SQLite keys across the
    # processes of a host; docs/chain-format.md said "within one process".
    table = (ROOT / "docs" / "concurrency.md").read_text(encoding="utf-8")
    assert "every process on the host that opens the same file" in table
    for page in PAGES:
        text = " ".join(page.read_text(encoding="utf-8").split())
        assert "with SQLite, within one process" not in text, page
    chain_format = " ".join((ROOT / "docs" / "chain-format.md").read_text().split())
    assert "across every process of the host that opens the same file" in chain_format


def test_the_serve_page_keeps_no_benchmark_figures() -> None:
    # Figures live in docs/performance.md; docs/serve.md links there.
    page = (ROOT / "docs" / "serve.md").read_text(encoding="utf-8")
    figures = re.findall(r"\d+(?:\.\d+)? ?(?:runs/s|ms per run|steps/s)|p50 \d|p99 \d", page)
    assert figures == []
    assert "performance.md#" in page


def _sources() -> list[Path]:
    """The files a user reads or sees the output of: code, docs, the dashboard, the README."""
    found = [ROOT / "README.md"]
    for folder in ("chainrt", "workers", "docs"):
        found += [
            p for p in (ROOT / folder).rglob("*") if p.suffix in (".py", ".md", ".js", ".html")
        ]
    return sorted(found)


def test_nothing_cites_a_design_document_the_repository_lacks() -> None:
    # "DESIGN §N" pointed at a document users never get (issue 41); the docs pages say it now.
    cited = [
        f"{path.relative_to(ROOT)}:{number}"
        for path in _sources()
        for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1)
        if "DESIGN §" in line
    ]
    assert cited == []
    schema = json.dumps(chain_json_schema())
    assert "DESIGN" not in schema  # `chainrt schema` prints it


def test_install_hints_in_messages_work_from_a_clone() -> None:
    # An error that says `pip install 'chainrt[serve]'` sends the user to a package the index
    # does not have; the hints say how to install the extra from the repository.
    wrong = re.compile(r"pip install ['\"]chainrt\[")
    found = [
        f"{path.relative_to(ROOT)}:{number}"
        for path in _sources()
        for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1)
        if wrong.search(line)
    ]
    assert found == []
