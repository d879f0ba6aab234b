"""Hot reload (``POST /admin/reload``) on a real local-engine worker, with the official client."""

from __future__ import annotations

import shutil
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import httpx
import pytest
from openai import OpenAI
from openai.types.chat import ChatCompletionMessageParam
from worker_fixtures import WorkerProcess

from chainrt.engines import resolve_model_path

TOKEN = "reload-test-token-0123456789"
AUTH = {"Authorization": f"Bearer {TOKEN}"}
ASK: list[ChatCompletionMessageParam] = [{"role": "user", "content": "Name a color."}]
STORY: list[ChatCompletionMessageParam] = [
    {"role": "user", "content": "Write a very long story about a dragon and a knight."}
]
STORY_TOKENS = 480
"""The in-flight stream's length: it must still be generating on the old engine when the swap
comes, after the new engine's load and warm-up. 60 tokens (1.6 s beside scripts/cpu_hog and a
vLLM test) once ended before a reload on a loaded 2-core machine; 480 took 11.7 s there, and the
model reaches the length limit before its end of text at temperature 0."""


@pytest.fixture(scope="module")
def gguf_copy(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A copy of the shipped GGUF under another file name: the "new version" of the model."""
    copy = tmp_path_factory.mktemp("models") / "smollm2-v2.gguf"
    shutil.copyfile(resolve_model_path(), copy)
    return copy


@pytest.fixture
def worker() -> Iterator[WorkerProcess]:
    args = ("--engine", "local", "--served-model-name", "v1", "--admin-token", TOKEN)
    with WorkerProcess(*args) as proc:
        yield proc


def test_without_a_token_the_route_does_not_exist() -> None:
    with WorkerProcess("--engine", "local") as proc:
        answer = proc.post("/admin/reload", json={}, headers=AUTH)
        assert answer.status_code == 404


def test_wrong_or_missing_token_is_401_and_changes_nothing(worker: WorkerProcess) -> None:
    for headers in (
        {},
        {"Authorization": "Bearer wrong-token-wrong-token"},
        {"Authorization": TOKEN},
    ):
        answer = worker.post("/admin/reload", json={"served_model_name": "x"}, headers=headers)
        assert answer.status_code == 401
        assert answer.headers["www-authenticate"] == "Bearer"
        assert "admin token" in answer.json()["error"]["message"]
    assert [m.id for m in worker.openai().models.list().data] == ["v1"]


def test_bad_model_path_is_400_and_the_old_model_keeps_serving(worker: WorkerProcess) -> None:
    answer = worker.post("/admin/reload", json={"model": "/nonexistent/m.gguf"}, headers=AUTH)
    assert answer.status_code == 400
    message = answer.json()["error"]["message"]
    assert "/nonexistent/m.gguf" in message
    assert "does not exist" in message
    assert "\n" not in message
    bad = worker.post("/admin/reload", json={"model": 3, "extra": 1}, headers=AUTH)
    assert bad.status_code == 400
    assert "model" in bad.json()["error"]["message"]
    assert worker.get("/health/ready").status_code == 200
    served = worker.openai().chat.completions.create(model="v1", messages=ASK, max_tokens=4)
    assert served.model == "v1"
    assert worker.metric("chainrt_worker_reloads_total", outcome="bad_model") == 1


def test_in_flight_stream_finishes_on_the_old_model_and_a_second_reload_is_409(
    worker: WorkerProcess, gguf_copy: Path
) -> None:
    client = worker.openai()
    stream = client.chat.completions.create(
        model="v1", messages=STORY, max_tokens=STORY_TOKENS, temperature=0, stream=True
    )
    chunks = iter(stream)  # read to its end below, which closes it
    first = next(chunks)  # the stream holds the old engine from here on
    change = {"model": str(gguf_copy), "served_model_name": "v2"}
    answer = worker.post("/admin/reload", json=change, headers=AUTH, timeout=120)
    assert answer.status_code == 200, answer.text
    body = answer.json()
    assert (body["model"], body["previous"], body["draining"]) == ("v2", "v1", 1)
    assert body["served_model_names"] == ["v2", "v1"]
    again = worker.post("/admin/reload", json={}, headers=AUTH)
    assert again.status_code == 409  # the first one is still draining the old engine
    assert again.json()["error"]["type"] == "reload_in_progress"
    rest = list(chunks)
    assert {c.model for c in [first, *rest]} == {"v1"}
    assert rest[-1].choices[0].finish_reason == "length"
    # Drained: the old engine closes and reloads are accepted again.
    deadline = time.monotonic() + 60
    while (code := worker.post("/admin/reload", json={}, headers=AUTH).status_code) == 409:
        assert time.monotonic() < deadline, "the old engine never drained"
        time.sleep(0.2)
    assert code == 200
    for name in ("v1", "v2"):  # the old name stays accepted; the new model answers it
        answer_ = client.chat.completions.create(model=name, messages=ASK, max_tokens=4)
        assert answer_.model == "v2"
    assert [m.id for m in client.models.list().data] == ["v2", "v1"]
    assert worker.get("/health/ready").json()["model"] == "v2"


def test_requests_queued_on_the_old_engine_at_the_swap_are_answered_by_the_new_one(
    gguf_copy: Path,
) -> None:
    """Leased on the old engine but not started (queued behind the stream it is generating):
    the swap hands them to the new engine; the stream finishes on the old one."""
    args = ("--engine", "local", "--served-model-name", "v1", "--admin-token", TOKEN)
    with WorkerProcess(*args, "--slots", "3") as worker:
        client = worker.openai()
        stream = client.chat.completions.create(
            model="v1", messages=STORY, max_tokens=STORY_TOKENS, temperature=0, stream=True
        )
        chunks = iter(stream)  # read to its end below, which closes it
        first = next(chunks)  # generating on the old engine from here on
        models: dict[str, set[str]] = {}
        failures: list[str] = []

        def ask(streamed: bool) -> None:
            with OpenAI(base_url=f"{worker.base}/v1", api_key="x", max_retries=0) as own:
                try:
                    if streamed:
                        parts = list(
                            own.chat.completions.create(
                                model="v1", messages=ASK, max_tokens=4, stream=True
                            )
                        )
                        models["stream"] = {part.model for part in parts}
                    else:
                        answer = own.chat.completions.create(model="v1", messages=ASK, max_tokens=4)
                        models["plain"] = {answer.model}
                except Exception as exc:  # the test asserts there are none
                    failures.append(f"{type(exc).__name__}: {exc}")

        queued = [threading.Thread(target=ask, args=(streamed,)) for streamed in (False, True)]
        for thread in queued:
            thread.start()
        while worker.metric("chainrt_worker_slots_in_use") < 3:  # both hold the old engine
            time.sleep(0.02)
        change = {"model": str(gguf_copy), "served_model_name": "v2"}
        answer = worker.post("/admin/reload", json=change, headers=AUTH, timeout=120)
        assert answer.status_code == 200, answer.text
        assert (answer.json()["draining"], answer.json()["handed_over"]) == (1, 2)
        for thread in queued:
            thread.join(120)
        assert failures == []
        assert models == {"plain": {"v2"}, "stream": {"v2"}}
        rest = list(chunks)
        assert {c.model for c in [first, *rest]} == {"v1"}
        assert rest[-1].choices[0].finish_reason == "length"


@dataclass
class Load:
    """What the clients saw: (start, end, model answering) per request, and every failure."""

    answers: list[tuple[float, float, str]] = field(default_factory=list)
    failures: list[str] = field(default_factory=list)
    not_ready: list[str] = field(default_factory=list)
    stop: threading.Event = field(default_factory=threading.Event)


def _client_loop(worker: WorkerProcess, load: Load) -> None:
    with OpenAI(base_url=f"{worker.base}/v1", api_key="unused", max_retries=0) as client:
        _ask_until_stopped(client, load)


def _ask_until_stopped(client: OpenAI, load: Load) -> None:
    while not load.stop.is_set():
        started = time.monotonic()
        try:
            answer = client.chat.completions.create(
                model="v1", messages=ASK, max_tokens=8, temperature=0
            )
        except Exception as exc:  # every failure counts; the test asserts there are none
            load.failures.append(f"{type(exc).__name__}: {exc}")
            continue
        load.answers.append((started, time.monotonic(), answer.model))


def _poll_readiness(worker: WorkerProcess, load: Load) -> None:
    with httpx.Client(base_url=worker.base, timeout=30) as http:
        while not load.stop.is_set():
            answer = http.get("/health/ready")
            if answer.status_code != 200:
                load.not_ready.append(answer.text)
            time.sleep(0.05)


def _reload_under_load(worker: WorkerProcess, gguf: Path, clients: int, seconds: float) -> None:
    load = Load()
    threads = [threading.Thread(target=_client_loop, args=(worker, load)) for _ in range(clients)]
    threads.append(threading.Thread(target=_poll_readiness, args=(worker, load)))
    for thread in threads:
        thread.start()
    try:
        time.sleep(seconds / 2)
        change = {"model": str(gguf), "served_model_name": "v2"}
        answer = worker.post("/admin/reload", json=change, headers=AUTH, timeout=120)
        swapped = time.monotonic()
        assert answer.status_code == 200, answer.text
        time.sleep(seconds / 2)
    finally:
        load.stop.set()
        for thread in threads:
            thread.join(120)
    assert load.failures == []
    assert load.not_ready == []
    before = [a for a in load.answers if a[1] < swapped - answer.elapsed.total_seconds()]
    after = [a for a in load.answers if a[0] > swapped]
    assert {model for _, _, model in before} == {"v1"}
    assert {model for _, _, model in after} == {"v2"}
    assert worker.metric("chainrt_worker_requests_total", endpoint="chat", status="200") == len(
        load.answers
    )


def test_reload_under_load_two_clients(worker: WorkerProcess, gguf_copy: Path) -> None:
    _reload_under_load(worker, gguf_copy, clients=2, seconds=6)


@pytest.mark.slow
def test_reload_under_load_four_clients_twenty_seconds(
    worker: WorkerProcess, gguf_copy: Path
) -> None:
    _reload_under_load(worker, gguf_copy, clients=4, seconds=20)
