"""``verify:`` on llm steps, end to end: a real llama.cpp worker (``local`` engine, SmolLM2) over
HTTP, the in-process model, both stores; the confidence score travels worker → dispatch → step
record. A mismatch needs a second model that answers differently: the one GGUF model answers
the same at temperature 0, so a small real HTTP server stands in for "another model" there.
"""

from __future__ import annotations

import json
import subprocess
import sys
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest
from worker_fixtures import WorkerProcess, free_port

import chainrt
from chainrt.errors import SpecError
from chainrt.store import StepRecord, open_store

pytestmark = pytest.mark.slow

SERVED = "smol"
PROMPT = "Name one colour."


@pytest.fixture(scope="module")
def worker() -> Iterator[WorkerProcess]:
    with WorkerProcess(
        "--engine", "local", "--served-model-name", SERVED,
        "--health-interval", "300", "--log-level", "warning",
    ) as w:  # fmt: skip
        yield w


class _OtherModel(BaseHTTPRequestHandler):
    """Answers every chat completion with "purple" (confidence 0.9)."""

    def do_POST(self) -> None:
        self.rfile.read(int(self.headers.get("content-length") or 0))
        body = json.dumps(
            {
                "id": "chatcmpl-other",
                "object": "chat.completion",
                "model": "other",
                "choices": [
                    {"index": 0, "message": {"role": "assistant", "content": "Purple"},
                     "finish_reason": "stop"}
                ],
                "usage": {"prompt_tokens": 5, "completion_tokens": 1, "total_tokens": 6},
                "confidence_score": 0.9,
            }
        ).encode()  # fmt: skip
        self.send_response(200)
        self.send_header("content-type", "application/json")
        self.send_header("content-length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def do_GET(self) -> None:
        self.send_response(200)
        self.send_header("content-length", "0")
        self.end_headers()

    def log_message(self, *args: object) -> None:
        return None


@pytest.fixture(scope="module")
def other() -> Iterator[str]:
    server = ThreadingHTTPServer(("127.0.0.1", 0), _OtherModel)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()


@pytest.fixture(params=["sqlite", "redis"])
def store(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    if request.param == "sqlite":
        return f"sqlite:///{tmp_path / 'runs.db'}"
    url: str = request.getfixturevalue("redis_url")
    return url


def pool(tmp_path: Path, worker: WorkerProcess, other: str) -> str:
    down = f"http://127.0.0.1:{free_port()}"
    path = tmp_path / "pool.yaml"
    path.write_text(
        "models:\n"
        f"  primary: {{served_model: {SERVED}, endpoints: [{{url: '{worker.base}'}}]}}\n"
        f"  replica: {{served_model: {SERVED}, endpoints: [{{url: '{worker.base}'}}]}}\n"
        f"  other: {{served_model: other, endpoints: [{{url: '{other}'}}]}}\n"
        f"  gone: {{served_model: gone, endpoints: [{{url: '{down}'}}]}}\n"
        "health: {interval: 200ms, timeout: 300ms}\n"
    )
    return str(path)


def chain(tmp_path: Path, verify: str) -> chainrt.Chain:
    path = tmp_path / "chain.yaml"
    path.write_text(
        "name: verified\nbudget: 30s\ninputs: {q: str}\nsteps:\n"
        "  - id: ask\n"
        "    llm: {model: primary, prompt: '{{ input.q }}', max_tokens: 6}\n"
        f"    verify: {verify}\n"
        "output: '{{ steps.ask.output }}'\n"
    )
    return chainrt.load(path)


async def run(tmp_path: Path, worker: WorkerProcess, other: str, store: str, verify: str,
              run_id: str) -> tuple[chainrt.RunResult, StepRecord]:  # fmt: skip
    result = await chain(tmp_path, verify).arun(
        {"q": PROMPT}, run_id=run_id, store=store, pool=pool(tmp_path, worker, other)
    )
    opened = open_store(store)
    try:
        record = (await opened.get_steps(run_id))["ask"]
    finally:
        await opened.close()
    return result, record


async def test_low_confidence_answer_checked_by_a_replica_matches(
    tmp_path: Path, worker: WorkerProcess, other: str, store: str
) -> None:
    result, record = await run(
        tmp_path, worker, other, store, "{below: 1.0, with: [replica]}", f"match-{store[:5]}"
    )
    assert result.status == "completed", result.error
    step = result.steps[0]
    assert step.confidence_score is not None
    assert 0.0 <= step.confidence_score < 1.0
    assert step.verification_status == "match"  # same model, temperature 0: the same answer
    assert record.verification_status == "match"
    assert record.confidence_score == step.confidence_score
    first, second = record.attempt_log
    assert (first.model, second.model, second.attempt) == ("primary", "replica", 2)
    assert first.confidence == step.confidence_score
    assert first.hops_ms is not None
    assert set(first.hops_ms) == {"queue", "admission", "prefill", "decode", "network"}
    assert first.hops_ms["prefill"] > 0.0
    # The hops split the attempt: together they are its elapsed time (network is the rest).
    assert sum(first.hops_ms.values()) == pytest.approx(first.elapsed_ms, abs=0.01)
    if store.startswith("sqlite"):
        shown = subprocess.run(
            [sys.executable, "-m", "chainrt", "inspect", f"match-{store[:5]}", "--store", store],
            capture_output=True, text=True, timeout=60, check=True,
        ).stdout  # fmt: skip
        assert "verification match" in shown
        assert f"confidence {step.confidence_score:.2f}" in shown
        assert "[queue " in shown
        assert " network " in shown


async def test_confident_answer_is_not_sent_to_the_verifier(
    tmp_path: Path, worker: WorkerProcess, other: str, store: str
) -> None:
    below = "0.000001"  # no real answer scores below this
    result, record = await run(
        tmp_path, worker, other, store, f"{{below: {below}, with: [other]}}", f"conf-{store[:5]}"
    )
    assert result.status == "completed", result.error
    assert result.steps[0].verification_status == "unverified"
    assert [a.model for a in record.attempt_log] == ["primary"]


@pytest.mark.parametrize(
    ("on_mismatch", "status", "output"),
    [("flag", "completed", None), ("fallback", "completed", "Purple"), ("fail", "failed", None)],
)
async def test_mismatch_follows_on_mismatch(
    tmp_path: Path, worker: WorkerProcess, other: str, store: str,
    on_mismatch: str, status: str, output: str | None,
) -> None:  # fmt: skip
    result, record = await run(
        tmp_path, worker, other, store,
        f"{{below: 1.0, with: [other], on_mismatch: {on_mismatch}}}",
        f"mm-{on_mismatch}-{store[:5]}",
    )  # fmt: skip
    step = result.steps[0]
    assert step.status == status
    assert step.verification_status == "mismatch"
    assert record.verification_status == "mismatch"
    if on_mismatch == "fallback":
        assert result.output == output
        assert (step.model, step.fallback, step.confidence_score) == ("other", "other", 0.9)
    elif on_mismatch == "flag":
        assert result.output not in (None, "Purple")
        assert step.model == "primary"
    else:
        assert step.error is not None
        assert "verification mismatch" in step.error


async def test_verifier_that_cannot_answer_leaves_the_answer_unverified(
    tmp_path: Path, worker: WorkerProcess, other: str, store: str
) -> None:
    result, record = await run(
        tmp_path, worker, other, store, "{below: 1.0, with: [gone]}", f"gone-{store[:5]}"
    )
    assert result.status == "completed", result.error
    assert result.steps[0].verification_status == "unverified"
    assert [a.model for a in record.attempt_log] == ["primary", "gone"]
    # "skipped" once the health poll has marked the endpoint down, "connect" before that.
    assert record.attempt_log[1].status in {"connect", "skipped"}


@pytest.mark.parametrize(
    ("verify", "message"),
    [
        ("{below: 1.5, with: [x]}", "below"),
        ("{below: 0.5, with: []}", "with"),
        ("{below: 0.5, with: [x], on_mismatch: shrug}", "on_mismatch"),
        ("{below: 0.5}", "with"),
    ],
)
def test_bad_verify_is_a_spec_error_with_its_line(
    tmp_path: Path, verify: str, message: str
) -> None:
    with pytest.raises(SpecError) as caught:
        chain(tmp_path, verify)
    text = str(caught.value)
    assert "chain.yaml:" in text
    assert message in text


def test_worker_returns_confidence_and_timings_to_the_openai_client(worker: WorkerProcess) -> None:
    answer = worker.openai().chat.completions.create(
        model=SERVED, messages=[{"role": "user", "content": PROMPT}], max_tokens=4
    )
    extra = answer.model_extra or {}
    score = extra["confidence_score"]
    assert isinstance(score, float)
    assert 0.0 <= score <= 1.0
    timings = extra["timings"]
    assert timings["queue_ms"] >= 0.0
    assert timings["admission_ms"] >= 0.0
    assert timings["prefill_ms"] > 0.0
    assert timings["decode_ms"] >= 0.0
