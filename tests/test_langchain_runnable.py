"""Chains as LangChain Runnables, and Runnables as chain steps (README.md).

Everything is real: chains run on the real runner against a SQLite store in a temp dir; the LCEL
example's reply step asks the in-process SmolLM2 model.
"""

from __future__ import annotations

import asyncio
import json
import textwrap
import time
from pathlib import Path
from typing import Any
from uuid import UUID

import pytest
from langchain_core.callbacks import BaseCallbackHandler
from langchain_core.messages import AIMessage
from langchain_core.runnables import Runnable, RunnableConfig, RunnableLambda

import chainrt
from chainrt import InputError, RunResult
from chainrt.langchain import ChainEvent, ChainRunnable, RunIncomplete, to_json_output
from chainrt.spec import resolve_object
from chainrt.store import open_store

TOOLS = """
import asyncio
import json
import time
from pathlib import Path

from langchain_core.messages import AIMessage
from langchain_core.runnables import RunnableLambda, RunnablePassthrough
from pydantic import BaseModel


def double(x: int, log: str) -> dict:
    with open(log, "a") as fh:
        fh.write(json.dumps({"x": x}) + "\\n")
    return {"y": 2 * x}


shout = RunnableLambda(lambda d: d["text"].upper())


async def _wait_for_flag(d: dict) -> str:
    if not Path(d["flag"]).exists():
        await asyncio.sleep(30)  # far past any budget here: the step deadline must cut it
    return "done"


patient = RunnableLambda(_wait_for_flag)
message = RunnableLambda(lambda d: AIMessage(content=f"hi {d['name']}"))


class Card(BaseModel):
    name: str
    size: int


card = RunnableLambda(lambda d: Card(name=d["name"], size=len(d["name"])))
not_json = RunnableLambda(lambda d: {1, 2})


def make_shout():
    return shout


def make_nothing():
    return 42


imported_class = RunnablePassthrough


def see_deadline(d: dict) -> float | None:
    from chainrt.langchain._steps import STEP_DEADLINE

    return STEP_DEADLINE.get()


deadline_probe = RunnableLambda(see_deadline)


async def _fail_at_deadline(d: dict) -> str:
    from chainrt.langchain._steps import STEP_DEADLINE

    deadline = STEP_DEADLINE.get()
    await asyncio.sleep(max(deadline - time.time() - 0.003, 0))
    raise ValueError("gave up at the deadline")


fails_at_deadline = RunnableLambda(_fail_at_deadline)


def make_talker():
    from chainrt.langchain import ChatChainrt

    llm = ChatChainrt(model="local", pool=None, max_tokens=400, timeout=30)
    return RunnableLambda(lambda d: d["topic"]) | llm


def make_inner():
    import chainrt

    return chainrt.load(Path(__file__).with_name("demo.yaml")).as_runnable()
"""


def write_chain(directory: Path, name: str, body: str) -> Path:
    path = directory / f"{name}.yaml"
    path.write_text(textwrap.dedent(body), encoding="utf-8")
    return path


@pytest.fixture
def chain_dir(tmp_path: Path) -> Path:
    directory = tmp_path / "chains"
    directory.mkdir()
    (directory / "tools.py").write_text(TOOLS, encoding="utf-8")
    return directory


@pytest.fixture
def store_url(tmp_path: Path) -> str:
    return f"sqlite:///{tmp_path / 'runs.db'}"


@pytest.fixture
def demo(chain_dir: Path) -> chainrt.Chain:
    """A tool step, then a runnable step, then a typed output."""
    return chainrt.load(
        write_chain(
            chain_dir,
            "demo",
            """
            name: demo
            budget: 5s
            inputs: {x: int, text: str, log: str}
            steps:
              - id: double
                tool: tools.py:double
                args: {x: "{{ input.x }}", log: "{{ input.log }}"}
              - id: shout
                runnable: tools.py:shout
                input: {text: "{{ input.text }}"}
            output: {y: "{{ steps.double.output.y }}", s: "{{ steps.shout.output }}"}
            """,
        )
    )


def demo_input(tmp_path: Path, x: int = 2, text: str = "hi") -> dict[str, Any]:
    return {"x": x, "text": text, "log": str(tmp_path / "double.jsonl")}


def tool_calls(tmp_path: Path) -> list[int]:
    log = tmp_path / "double.jsonl"
    return [json.loads(line)["x"] for line in log.read_text().splitlines()] if log.exists() else []


class Recorder(BaseCallbackHandler):
    """Records chain starts and ends as (name, run_id, parent_run_id, tags, metadata, data)."""

    def __init__(self) -> None:
        self.starts: list[dict[str, Any]] = []
        self.ends: list[dict[str, Any]] = []
        self.errors: list[BaseException] = []

    def on_chain_start(
        self,
        serialized: dict[str, Any] | None,
        inputs: Any,
        *,
        run_id: UUID,
        parent_run_id: UUID | None = None,
        tags: list[str] | None = None,
        metadata: dict[str, Any] | None = None,
        **kwargs: Any,
    ) -> None:
        self.starts.append(
            {
                "name": kwargs.get("name"),
                "run_id": run_id,
                "parent": parent_run_id,
                "tags": tags or [],
                "metadata": metadata or {},
            }
        )

    def on_chain_end(self, outputs: Any, *, run_id: UUID, **kwargs: Any) -> None:
        self.ends.append({"run_id": run_id, "outputs": outputs})

    def on_chain_error(self, error: BaseException, *, run_id: UUID, **kwargs: Any) -> None:
        self.errors.append(error)


# ---------------------------------------------------------------------- inside LCEL pipelines


def test_chain_runnable_in_an_lcel_pipeline_invoke_batch_stream(
    demo: chainrt.Chain, store_url: str, tmp_path: Path
) -> None:
    runnable = demo.as_runnable(store=store_url)
    assert isinstance(runnable, ChainRunnable)
    pipeline: Runnable[Any, str] = (
        RunnableLambda(lambda d: {**d, "x": d["x"] + 1})
        | runnable
        | RunnableLambda(lambda out: f"{out['s']}:{out['y']}")
    )

    assert pipeline.invoke(demo_input(tmp_path, 2, "hi")) == "HI:6"
    assert pipeline.batch([demo_input(tmp_path, 1, "a"), demo_input(tmp_path, 4, "b")]) == [
        "A:4",
        "B:10",
    ]
    # Streaming a pipeline hands the next step exactly what invoke would: the chain's output.
    assert list(pipeline.stream(demo_input(tmp_path, 0, "yo"))) == ["YO:2"]
    assert sorted(tool_calls(tmp_path)) == [1, 2, 3, 5]  # one run per input, no more


def test_stream_yields_step_events_then_the_output(
    demo: chainrt.Chain, store_url: str, tmp_path: Path
) -> None:
    chunks = list(demo.as_runnable(store=store_url).stream(demo_input(tmp_path, 5, "yo")))
    events, output = chunks[:-1], chunks[-1]
    assert all(isinstance(e, ChainEvent) for e in events)
    assert output == {"y": 10, "s": "YO"}
    assert not isinstance(output, ChainEvent)
    assert [(e["type"], e.get("step_id")) for e in events] == [
        ("run_started", None),
        ("step_started", "double"),
        ("attempt", "double"),
        ("step_finished", "double"),
        ("step_started", "shout"),
        ("attempt", "shout"),
        ("step_finished", "shout"),
        ("run_finished", None),
    ]
    assert len({e["run_id"] for e in events}) == 1
    finished = events[3]
    assert finished["status"] == "completed"
    assert finished["attempts"] == 1
    assert events[-1]["status"] == "completed"
    assert events[-1]["budget"]["total_ms"] == 5000


async def test_async_invoke_batch_and_stream(
    demo: chainrt.Chain, store_url: str, tmp_path: Path
) -> None:
    runnable = demo.as_runnable(store=store_url)
    pipeline = runnable | RunnableLambda(lambda out: out["y"])
    assert await pipeline.ainvoke(demo_input(tmp_path, 3)) == 6
    assert await pipeline.abatch([demo_input(tmp_path, i) for i in range(4)]) == [0, 2, 4, 6]
    chunks = [c async for c in runnable.astream(demo_input(tmp_path, 7, "q"))]
    assert chunks[-1] == {"y": 14, "s": "Q"}
    assert [c["type"] for c in chunks[:-1]][::7] == ["run_started", "run_finished"]


async def test_astream_events_report_the_run_under_its_name(
    demo: chainrt.Chain, store_url: str, tmp_path: Path
) -> None:
    runnable = demo.as_runnable(store=store_url)
    seen = [
        e
        async for e in runnable.astream_events(
            demo_input(tmp_path, 1, "ev"), {"run_name": "support", "tags": ["t1"]}, version="v2"
        )
    ]
    mine = [e for e in seen if e["name"] == "support"]
    assert mine[0]["event"] == "on_chain_start"
    assert mine[-1]["event"] == "on_chain_end"
    assert mine[-1]["data"]["output"] == {"y": 2, "s": "EV"}
    streamed = [e["data"]["chunk"] for e in mine if e["event"] == "on_chain_stream"]
    assert [c["type"] for c in streamed[:-1]][:2] == ["run_started", "step_started"]
    assert all("t1" in e["tags"] for e in mine)
    # The runnable step shows up as a child run, inside the chain's run.
    child = [e for e in seen if e["event"] == "on_chain_start" and e["name"] != "support"]
    assert child
    assert child[0]["metadata"]["chainrt_step_id"] == "shout"
    assert mine[0]["run_id"] in child[0]["parent_ids"]


def test_callbacks_tags_metadata_and_run_name_are_honoured(
    demo: chainrt.Chain, store_url: str, tmp_path: Path
) -> None:
    recorder = Recorder()
    out = demo.as_runnable(store=store_url).invoke(
        demo_input(tmp_path, 1, "cb"),
        {
            "callbacks": [recorder],
            "tags": ["ticket"],
            "metadata": {"tenant": "acme"},
            "run_name": "support",
            "configurable": {"run_id": "cb-1"},
        },
    )
    assert out == {"y": 2, "s": "CB"}
    top = recorder.starts[0]
    assert top["name"] == "support"
    assert "ticket" in top["tags"]
    assert top["metadata"]["tenant"] == "acme"
    assert top["metadata"]["chainrt_run_id"] == "cb-1"
    step = recorder.starts[1]
    assert step["parent"] == top["run_id"]
    assert "chainrt_step:shout" in step["tags"]
    assert step["metadata"]["chainrt_run_id"] == "cb-1"
    assert recorder.ends[-1] == {"run_id": top["run_id"], "outputs": out}
    assert recorder.errors == []


def test_input_schema_follows_the_chain_inputs(demo: chainrt.Chain) -> None:
    schema = ChainRunnable(demo).get_input_schema().model_json_schema()
    assert schema["required"] == ["x", "text", "log"]
    assert schema["properties"]["x"]["type"] == "integer"
    assert {spec.id for spec in demo.as_runnable().config_specs} == {"run_id", "budget"}


def test_bad_calls_get_clear_errors(demo: chainrt.Chain, store_url: str, tmp_path: Path) -> None:
    runnable = demo.as_runnable(store=store_url)
    with pytest.raises(InputError, match="lacks"):
        runnable.invoke({"x": 1})
    with pytest.raises(chainrt.BudgetError, match="configurable budget"):
        runnable.invoke(demo_input(tmp_path), {"configurable": {"budget": "soon"}})
    with pytest.raises(InputError, match="a run id names one run"):
        runnable.batch(
            [demo_input(tmp_path, 1), demo_input(tmp_path, 2)], {"configurable": {"run_id": "same"}}
        )
    with pytest.raises(InputError, match="no keyword arguments"):
        runnable.invoke(demo_input(tmp_path), stop=["x"])
    assert tool_calls(tmp_path) == []


# ---------------------------------------------------------------------- resume and budgets


@pytest.fixture
def waiting(chain_dir: Path) -> chainrt.Chain:
    """A recorded tool step, then a runnable that waits until a flag file exists."""
    return chainrt.load(
        write_chain(
            chain_dir,
            "waiting",
            """
            name: waiting
            budget: 400ms
            inputs: {x: int, log: str, flag: str}
            steps:
              - id: double
                weight: 0.1
                tool: tools.py:double
                args: {x: "{{ input.x }}", log: "{{ input.log }}"}
              - id: patient
                weight: 0.9
                runnable: tools.py:patient
                input: {flag: "{{ input.flag }}"}
            output: "{{ steps.patient.output }}"
            """,
        )
    )


async def test_a_runnable_step_cut_by_its_deadline_ends_the_run_partial_within_budget(
    waiting: chainrt.Chain, store_url: str, tmp_path: Path
) -> None:
    inputs = {"x": 1, "log": str(tmp_path / "double.jsonl"), "flag": str(tmp_path / "flag")}
    result = await waiting.arun(inputs, store=store_url)
    assert result.status == "partial"
    assert result.stopped_at == "patient"
    patient = next(s for s in result.steps if s.id == "patient")
    assert patient.status == "timed_out"
    # Past its budget by at most the final write's grace (docs/dispatch.md, 0.5 s): the event
    # loop alone has been measured 77 ms late on a loaded 2-core machine, so +50 ms could break;
    # a step that was waited for would hold the run until the flag appears (never, here).
    assert result.budget.used_ms <= 400 + 500


@pytest.mark.parametrize("ref", ["tools.py:fails_at_deadline", "tools.py:make_talker"])
async def test_a_runnable_that_stops_at_its_deadline_is_timed_out_not_failed(
    chain_dir: Path, store_url: str, ref: str
) -> None:
    # make_talker asks the real local model for 400 tokens (~4 s) inside a 400 ms budget.
    chain = chainrt.load(
        write_chain(
            chain_dir,
            "cut",
            f"""
            name: cut
            budget: 400ms
            steps:
              - id: talk
                runnable: {ref}
                input: {{topic: "Tell me a very long story about the sea."}}
            """,
        )
    )
    result = await chain.arun({}, store=store_url)
    assert result.status == "partial", result.error
    assert result.steps[0].status == "timed_out"
    # At most the final write's grace past the budget (0.5 s; +50 ms could break on a loaded
    # machine); 400 tokens not cut would take seconds.
    assert result.budget.used_ms <= 400 + 500


async def test_a_runnable_step_sees_its_deadline(chain_dir: Path, store_url: str) -> None:
    chain = chainrt.load(
        write_chain(
            chain_dir,
            "probe",
            """
            name: probe
            budget: 3s
            steps:
              - id: probe
                runnable: tools.py:deadline_probe
            """,
        )
    )
    before = time.time()
    result = await chain.arun({}, store=store_url)
    assert result.status == "completed", result.error
    assert before + 2.5 < result.output <= time.time() + 3.0


def test_configurable_run_id_resumes_that_run(
    waiting: chainrt.Chain, store_url: str, tmp_path: Path
) -> None:
    flag = tmp_path / "flag"
    inputs = {"x": 21, "log": str(tmp_path / "double.jsonl"), "flag": str(flag)}
    runnable = waiting.as_runnable(store=store_url)
    config: Any = {"configurable": {"run_id": "ticket-7"}}

    with pytest.raises(RunIncomplete) as info:
        runnable.invoke(inputs, config)
    assert info.value.result.run_id == "ticket-7"
    assert info.value.result.status == "partial"
    assert info.value.retryable
    assert "ticket-7" in str(info.value)

    with pytest.raises(InputError, match="different input"):
        runnable.invoke({**inputs, "x": 22}, config)

    flag.touch()
    resumed = runnable.invoke(inputs, {"configurable": {"run_id": "ticket-7", "budget": "2s"}})
    assert resumed == "done"
    assert tool_calls(tmp_path) == [21]  # the recorded step was not run again

    # A completed run answers from the store; returns="result" shows the whole record.
    again = ChainRunnable(waiting, store=store_url, returns="result").invoke(inputs, config)
    assert isinstance(again, RunResult)
    assert again.status == "completed"
    assert again.output == "done"
    assert tool_calls(tmp_path) == [21]


def test_closing_a_stream_early_stops_the_run_and_frees_it(
    waiting: chainrt.Chain, store_url: str, tmp_path: Path
) -> None:
    flag = tmp_path / "flag"
    inputs = {"x": 5, "log": str(tmp_path / "double.jsonl"), "flag": str(flag)}
    runnable = waiting.as_runnable(store=store_url)
    config: Any = {"configurable": {"run_id": "walk-away", "budget": "60s"}}
    for chunk in runnable.stream(inputs, config):
        if chunk.get("type") == "step_started" and chunk["step_id"] == "patient":
            break  # the consumer walks away while the step waits
    flag.touch()
    # The cancelled run gave its lease back: resuming it starts at once (no wait for expiry).
    started = time.perf_counter()
    assert runnable.invoke(inputs, config) == "done"
    assert time.perf_counter() - started < 5.0  # the lease TTL is 10 s
    assert tool_calls(tmp_path) == [5]


def test_a_chain_inside_a_step_gets_its_own_run(
    demo: chainrt.Chain,
    chain_dir: Path,
    store_url: str,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("CHAINRT_STORE", store_url)  # the inner runnable uses the default store
    outer = chainrt.load(
        write_chain(
            chain_dir,
            "outer",
            """
            name: outer
            budget: 5s
            inputs: {x: int, text: str, log: str}
            steps:
              - id: inner
                runnable: tools.py:make_inner
                input: {x: "{{ input.x }}", text: "{{ input.text }}", log: "{{ input.log }}"}
            """,
        )
    )
    recorder = Recorder()
    out = outer.as_runnable().invoke(
        demo_input(tmp_path, 4, "in"),
        {"configurable": {"run_id": "outer-1"}, "callbacks": [recorder]},
    )
    # The outer run id stayed with the outer run: the inner chain did not try to resume it.
    assert out == {"y": 8, "s": "IN"}
    run_ids = {s["metadata"]["chainrt_run_id"] for s in recorder.starts if s["name"] == "demo"}
    assert len(run_ids) == 1
    assert run_ids != {"outer-1"}


async def test_an_unknown_run_id_starts_a_run_under_that_id(
    demo: chainrt.Chain, store_url: str, tmp_path: Path
) -> None:
    runnable = ChainRunnable(demo, store=store_url, returns="result")
    result = await runnable.ainvoke(demo_input(tmp_path), {"configurable": {"run_id": "fresh-1"}})
    assert result.run_id == "fresh-1"
    store = open_store(store_url)
    try:
        assert (await store.get_run("fresh-1")).status == "completed"
    finally:
        await store.close()


async def test_a_failed_run_reports_through_on_chain_error(chain_dir: Path, store_url: str) -> None:
    chain = chainrt.load(
        write_chain(
            chain_dir,
            "broken",
            """
            name: broken
            budget: 2s
            steps:
              - id: bad
                runnable: tools.py:not_json
            """,
        )
    )
    recorder = Recorder()
    with pytest.raises(RunIncomplete, match="not JSON-serialisable") as info:
        await chain.as_runnable(store=store_url).ainvoke({}, {"callbacks": [recorder]})
    assert info.value.result.status == "failed"
    assert not info.value.retryable
    assert recorder.errors == [info.value]


# ---------------------------------------------------------------------- runnables as steps


async def test_step_outputs_are_checkpointed_as_json(chain_dir: Path, store_url: str) -> None:
    chain = chainrt.load(
        write_chain(
            chain_dir,
            "objects",
            """
            name: objects
            budget: 2s
            inputs: {name: str}
            steps:
              - id: message
                runnable: tools.py:message
                input: {name: "{{ input.name }}"}
              - id: card
                runnable: tools.py:card
                input: {name: "{{ input.name }}"}
              - id: factory
                runnable: tools.py:make_shout
                input: {text: "{{ steps.message.output.kwargs.content }}"}
            """,
        )
    )
    result = await chain.arun({"name": "ada"}, run_id="objects-1", store=store_url)
    assert result.status == "completed", result.error
    assert result.output == "HI ADA"
    store = open_store(store_url)
    try:
        steps = await store.get_steps("objects-1")
    finally:
        await store.close()
    message = steps["message"].output
    assert message["lc"] == 1
    assert message["id"][-1] == "AIMessage"
    assert message["kwargs"]["content"] == "hi ada"
    assert steps["card"].output == {"name": "ada", "size": 3}


@pytest.mark.parametrize(
    ("ref", "problem"),
    [
        ("tools.py:make_nothing", "returned int, not a LangChain Runnable"),
        ("tools.py:imported_class", "imported into tools.py from elsewhere"),
        ("tools.py:absent", "has no 'absent'"),
    ],
)
async def test_unusable_runnable_references_fail_the_step_clearly(
    chain_dir: Path, store_url: str, ref: str, problem: str
) -> None:
    path = chain_dir / "ref.yaml"
    path.write_text(
        f"name: ref\nbudget: 2s\nsteps:\n  - id: step\n    runnable: {ref}\n", encoding="utf-8"
    )
    result = await chainrt.load(path).arun({}, store=store_url)
    assert result.status == "failed"
    assert result.error is not None
    assert problem in result.error


def test_to_json_output_converts_langchain_and_pydantic_objects() -> None:
    converted = to_json_output({"m": [AIMessage(content="x")], "n": 1.5}, where="test")
    assert converted["m"][0]["kwargs"]["content"] == "x"
    assert converted["n"] == 1.5
    with pytest.raises(chainrt.ToolError, match="JSON object keys are strings"):
        to_json_output({1: "a"}, where="test")
    with pytest.raises(chainrt.ToolError, match="which JSON cannot hold"):
        to_json_output(float("nan"), where="test")


def test_the_lcel_example_answers_with_the_local_model(store_url: str) -> None:
    root = Path(__file__).resolve().parent.parent / "chains"
    chain = chainrt.load(root / "lcel_support.yaml")
    # The example's 8 s budget is for a person's machine; this checks the composition, so a
    # loaded CI machine (60 tokens from the local model took over 8 s under load) gets more.
    config: RunnableConfig = {"configurable": {"budget": "60s"}}
    events = list(
        chain.as_runnable(store=store_url).stream(
            {"user_id": "u1", "question": "Where is order 1042?"}, config
        )
    )
    output = events[-1]
    assert output["order"]["order_id"] == "1042"
    assert isinstance(output["answer"], str)
    assert output["answer"].strip()
    reply = next(e for e in events if e.get("type") == "step_finished" and e["step_id"] == "reply")
    assert reply["status"] == "completed"
    # Step outputs are not in the events (as over SSE); the run's output is, in run_finished.
    assert "output" not in reply
    assert (events[-2]["type"], events[-2]["output"]) == ("run_finished", output)

    # The other direction: the whole chain as the first step of an LCEL pipeline.
    pipeline = resolve_object(
        "lcel_example.py:support_pipeline", chain_dir=root, allowed_modules=()
    )
    question = {"user_id": "u2", "question": "Is order 1017 shipped yet?"}
    text = pipeline(store=store_url).invoke(question, config)
    assert text.startswith("Order 1017: processing\n")


async def test_runs_started_from_a_running_loop_with_sync_invoke_still_work(
    demo: chainrt.Chain, store_url: str, tmp_path: Path
) -> None:
    # Sync entry points run on chainrt's own loop thread, so calling them from async code
    # blocks this loop but does not deadlock it.
    out = await asyncio.to_thread(demo.as_runnable(store=store_url).invoke, demo_input(tmp_path))
    assert out == {"y": 4, "s": "HI"}
    assert demo.as_runnable(store=store_url).invoke(demo_input(tmp_path, 3)) == {"y": 6, "s": "HI"}
