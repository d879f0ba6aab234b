"""No run is left ``running`` by a value the store cannot record (issue 12, finding 2).

On SQLite and a real Redis: a tool returning a list nested 300 deep or a lone surrogate, a tool
whose error message holds one, and a concurrency key over 1,024 characters each end the step and
the run ``failed`` with a message that says why — and a resume neither runs the tool again nor
changes the run. An LLM step cut at its deadline with ``on_timeout: partial`` ends the run
``partial`` with a real message (it ended ``failed`` with "step X: None").
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

import chainrt
from chainrt._records import StepRecord
from chainrt._run import settle
from chainrt.spec import parse_spec
from chainrt.store import open_store

TOOLS = """\
import json
import os


def _log(name):
    with open(os.environ["CHAINRT_TEST_LOG"], "a") as fh:
        fh.write(json.dumps({"tool": name}) + "\\n")


def deep():
    _log("deep")
    value = []
    for _ in range(300):
        value = [value]
    return value


def surrogate():
    _log("surrogate")
    return {"text": "\\ud800"}


def raises_surrogate():
    _log("raises_surrogate")
    raise ValueError("bad byte \\udcff here")


def fine(user=None):
    _log("fine")
    return "fine"
"""


@pytest.fixture
def folder(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    (tmp_path / "tools.py").write_text(TOOLS, encoding="utf-8")
    monkeypatch.setenv("CHAINRT_TEST_LOG", str(tmp_path / "calls.jsonl"))
    return tmp_path


def calls(folder: Path) -> list[str]:
    log = folder / "calls.jsonl"
    if not log.exists():
        return []
    return [json.loads(line)["tool"] for line in log.read_text().splitlines()]


def chain(folder: Path, name: str, body: str) -> chainrt.Chain:
    path = folder / f"{name}.yaml"
    path.write_text(f"name: {name}\nbudget: 10s\n{body}", encoding="utf-8")
    return chainrt.load(path)


@pytest.mark.parametrize(
    ("tool", "reason"),
    [
        ("deep", "depth"),
        ("surrogate", "surrogates not allowed"),
        ("raises_surrogate", "surrogates not allowed"),
    ],
)
async def test_a_step_the_store_cannot_record_ends_the_run_failed_once(
    folder: Path, store_url: str, tool: str, reason: str
) -> None:
    steps = (
        f"steps:\n  - {{id: a, tool: 'tools.py:{tool}'}}\n  - {{id: b, tool: 'tools.py:fine'}}\n"
    )
    first = await chain(folder, "unrec", steps).arun({}, run_id="unrec-1", store=store_url)
    assert first.status == "failed"
    assert first.stopped_at == "a"
    assert first.error is not None
    assert first.error.startswith("step a: its record could not be stored")
    assert reason in first.error
    assert [(s.id, s.status) for s in first.steps] == [("a", "failed")]
    assert calls(folder) == [tool]  # b never ran

    store = open_store(store_url)
    try:
        run = await store.get_run("unrec-1")
        assert (run.status, run.owner) == ("failed", None)
        again = await chainrt.aresume("unrec-1", store=store_url)
        after = await store.get_run("unrec-1")
    finally:
        await store.close()
    assert again.status == "failed"
    assert again.error == first.error
    assert calls(folder) == [tool]  # the resume did not call the tool a second time
    assert after.fencing_token == run.fencing_token  # nor claimed the run


async def test_a_concurrency_key_over_the_limit_fails_the_run_without_running_it(
    folder: Path, store_url: str
) -> None:
    body = (
        "inputs: {user: str}\n"
        "concurrency:\n  - {key: 'user:{{ input.user }}', limit: 1}\n"
        "steps:\n  - {id: a, tool: 'tools.py:fine'}\n"
    )
    result = await chain(folder, "longkey", body).arun(
        {"user": "x" * 10_000}, run_id="key-1", store=store_url
    )
    assert result.status == "failed"
    assert result.error is not None
    assert result.error.startswith("concurrency: concurrency key 'user:xxx")
    assert "10005 characters long, over the 1024 allowed" in result.error
    assert calls(folder) == []
    store = open_store(store_url)
    try:
        assert (await store.get_run("key-1")).status == "failed"
    finally:
        await store.close()


async def test_a_step_key_over_the_limit_fails_the_step_and_the_run(
    folder: Path, store_url: str
) -> None:
    body = (
        "inputs: {user: str}\n"
        "steps:\n  - id: a\n    tool: tools.py:fine\n"
        "    concurrency:\n      - {key: 'user:{{ input.user }}', limit: 1}\n"
    )
    result = await chain(folder, "steplongkey", body).arun(
        {"user": "y" * 2_000}, run_id="key-2", store=store_url
    )
    assert result.status == "failed"
    assert [(s.id, s.status) for s in result.steps] == [("a", "failed")]
    assert result.error is not None
    assert "step a: concurrency: concurrency key" in result.error
    assert calls(folder) == []


def _step_record(status: str, error: str | None = None) -> StepRecord:
    return StepRecord(step_id="answer", status=status, output="The order is on", error=error)


LLM_CHAIN = """\
name: cut
budget: 1s
steps:
  - id: answer
    optional: {optional}
    llm:
      model: local
      prompt: "Write a very long story about a dragon, at least 3000 words."
      max_tokens: 2000
    on_timeout: partial
"""


@pytest.mark.parametrize(("optional", "stop"), [(False, "partial"), (True, None)])
def test_a_partial_llm_step_stops_the_run_partial_with_a_message(
    optional: bool, stop: str | None
) -> None:
    """settle(): a cut-off answer is the budget running out there, not a failure."""
    step = parse_spec(LLM_CHAIN.format(optional=str(optional).lower())).steps[0]
    record, status = settle(step, _step_record("partial"))
    assert status == stop
    assert record.error is not None
    assert "cut off at its deadline (on_timeout: partial)" in record.error
    assert record.output == "The order is on"  # the text so far is kept
    assert record.status == ("skipped" if optional else "partial")


@pytest.mark.slow
async def test_a_real_cut_off_llm_answer_ends_the_run_partial(tmp_path: Path) -> None:
    """The in-process SmolLM2 on llama.cpp, asked for far more than 1 s can generate (2,000
    tokens; it writes a few hundred a second on two idle cores).

    Whether the engine hands back its text within dispatch's grace after the deadline depends on
    the machine's load (past the grace the attempt is abandoned and the step is ``timed_out``);
    either way the run must end ``partial`` with a real message, never ``failed`` with "None".
    """
    path = tmp_path / "cut.yaml"
    path.write_text(LLM_CHAIN.format(optional="false"), encoding="utf-8")
    url = f"sqlite:///{tmp_path / 'runs.db'}"
    result = await chainrt.load(path).arun({}, store=url)
    assert result.status == "partial", result.error
    assert result.stopped_at == "answer"
    assert result.error is not None
    assert result.error.startswith("step answer: ")
    assert "None" not in result.error
    answer = result.steps[0]
    assert answer.status in ("partial", "timed_out")
    if answer.status == "partial":
        assert result.error.startswith("step answer: cut off at its deadline")
        store = open_store(url)
        try:
            recorded = (await store.get_steps(result.run_id))["answer"]
        finally:
            await store.close()
        assert isinstance(recorded.output, str)
        assert recorded.output  # the tokens generated before the deadline
