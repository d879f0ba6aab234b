"""Tracing with the SDK's in-memory exporter: the span tree of a real run, and the hooks' contract.

The main test runs one chain through the real runner, store, limiter and llama.cpp model: its
first step waits for a ``limit: 1`` key another holder has, its LLM step's primary model has no
endpoint so dispatch falls back to ``local``, its last step is interrupted (the run task is
cancelled, as Ctrl-C does to the CLI) and the run is resumed. The two executions must form two
traces, the second linked to the first, with the attributes an operator needs.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest
from opentelemetry.sdk.trace import ReadableSpan
from opentelemetry.trace import SpanKind, StatusCode

from chainrt import ChainRTError
from chainrt._hooks import NO_HOOKS
from chainrt._runtime import open_runtime
from chainrt._settings import Settings
from chainrt.cli import main as cli_main
from chainrt.concurrency import KeyRequest, open_limiter
from chainrt.spec import spec_from_dict
from chainrt.tracing import (
    TraceConfig,
    hooks_from_env,
    in_memory_hooks,
    tracer_provider_from_env,
)
from chainrt.tracing import _attributes as attr
from chainrt.tracing._hooks import OtelHooks, clean_attributes

MODULE = __name__
_started: dict[str, asyncio.Event] = {}
_calls: dict[str, int] = {}


async def gate_tool() -> str:
    """The step behind the concurrency key."""
    return "through"


async def hang_once(name: str) -> str:
    """Hangs (until cancelled) on its first call for ``name``; answers at once afterwards."""
    _calls[name] = _calls.get(name, 0) + 1
    if _calls[name] == 1:
        _started[name].set()
        await asyncio.sleep(120)
    return f"finished {name}"


def _chain() -> dict[str, Any]:
    return {
        "name": "traced",
        "budget": "60s",
        "inputs": {"user": "str"},
        "steps": [
            {
                "id": "gate",
                "tool": f"{MODULE}:gate_tool",
                "concurrency": [{"key": "gate:{{ input.user }}", "limit": 1}],
            },
            {
                "id": "answer",
                "llm": {"model": "primary", "prompt": "Say hello.", "max_tokens": 2},
                "fallbacks": ["local"],
            },
            {"id": "finish", "tool": f"{MODULE}:hang_once", "args": {"name": "{{ run_id }}"}},
        ],
    }


def outline(spans: Sequence[ReadableSpan], parent: ReadableSpan) -> list[Any]:
    """The names of ``parent``'s descendants as nested lists, children in start order."""
    assert parent.context is not None
    children = sorted(
        (s for s in spans if s.parent is not None and s.parent.span_id == parent.context.span_id),
        key=lambda s: s.start_time or 0,
    )
    return [(c.name, outline(spans, c)) for c in children]


def roots(spans: Sequence[ReadableSpan]) -> list[ReadableSpan]:
    return sorted((s for s in spans if s.parent is None), key=lambda s: s.start_time or 0)


def hexid(value: int, width: int) -> str:
    return format(value, f"0{width}x")


@pytest.fixture
def otel_env_cleared(monkeypatch: pytest.MonkeyPatch) -> None:
    import os

    for name in [n for n in os.environ if n.startswith("OTEL_")] + ["CHAINRT_TRACE"]:
        monkeypatch.delenv(name, raising=False)


async def test_run_that_waits_falls_back_and_resumes_makes_two_linked_traces(
    tmp_path: Any, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("CHAINRT_ALLOWED_MODULES", MODULE)
    monkeypatch.setenv("CHAINRT_JAEGER_URL", "http://jaeger.example:16686")
    store = f"sqlite:///{tmp_path / 'runs.db'}"
    run_id = "traced-1"
    _started[run_id] = asyncio.Event()
    hooks = in_memory_hooks(jaeger_url="http://jaeger.example:16686")
    spec = spec_from_dict(_chain())

    # Another holder has the run's step key; it lets go after 500 ms.
    limiter = open_limiter(store)
    other = await limiter.acquire([KeyRequest("gate:u1", 1)], timeout_s=1, holder="other")

    async with open_runtime(store=store, hooks=hooks) as runtime:

        async def let_go() -> None:
            # Count from the moment the run waits in line for the key: loading the local model,
            # the run's creation and its first checkpoint come before it, and on a busy machine
            # they could use up a head start counted from any earlier point.
            deadline = time.monotonic() + 60
            while not (await limiter.snapshot("gate:u1")).waiting:
                assert time.monotonic() < deadline, "the run never queued for its key"
                await asyncio.sleep(0.01)
            await asyncio.sleep(0.5)
            await other.release()

        releaser = asyncio.create_task(let_go())
        first = asyncio.create_task(runtime.runner.run(spec, {"user": "u1"}, run_id=run_id))
        await asyncio.wait_for(_started[run_id].wait(), 60)
        first.cancel()  # interrupted in its last step
        with pytest.raises(asyncio.CancelledError):
            await first
        await releaser
        result = await runtime.runner.resume(run_id)
        record = await runtime.store.get_run(run_id)
    assert result.status == "completed", result.error
    assert result.output == f"finished {run_id}"

    spans = hooks.exporter.get_finished_spans()  # type: ignore[union-attr]
    run_a, run_b = roots(spans)
    assert run_a.context is not None
    assert run_b.context is not None
    trace_a, trace_b = run_a.context.trace_id, run_b.context.trace_id
    assert trace_a != trace_b
    assert {s.context.trace_id for s in spans if s.context} == {trace_a, trace_b}

    # The first execution: wait for the key, fall back to local, interrupted in "finish".
    steps_a = outline(spans, run_a)
    assert [name for name, _ in steps_a] == [
        "checkpoint.write",  # the run record gets its trace ids
        "chain.step",  # gate
        "checkpoint.write",
        "chain.step",  # answer
        "checkpoint.write",
        "chain.step",  # finish, interrupted
        "checkpoint.write",  # the lease given back for a resume
    ]
    assert steps_a[1][1] == [("concurrency.acquire", [])]
    assert steps_a[5][1] == []
    dispatches = [name for name, _ in steps_a[3][1]]
    assert dispatches
    assert set(dispatches) == {"llm.dispatch"}

    def children(parent: ReadableSpan, name: str) -> list[ReadableSpan]:
        assert parent.context is not None
        return [
            s
            for s in spans
            if s.name == name and s.parent and s.parent.span_id == parent.context.span_id
        ]

    gate, answer, finish_a = children(run_a, "chain.step")
    assert run_a.attributes is not None
    assert run_a.attributes[attr.RUN_ID] == run_id
    assert run_a.attributes[attr.CHAIN] == "traced"
    assert run_a.attributes[attr.RESUMED] is False
    assert run_a.status.status_code is StatusCode.ERROR
    assert [e.attributes["exception.type"] for e in run_a.events if e.attributes] == [
        "asyncio.exceptions.CancelledError"
    ]

    assert gate.attributes is not None
    assert gate.attributes[attr.STEP_ID] == "gate"
    assert gate.attributes[attr.STATUS] == "completed"
    assert 0 < gate.attributes[attr.WEIGHT] <= 1  # type: ignore[operator]
    assert gate.attributes[attr.ALLOTTED_MS] > 10_000  # type: ignore[operator]  # a third of 60 s
    (acquire,) = children(gate, "concurrency.acquire")
    assert acquire.attributes is not None
    assert acquire.attributes[attr.KEYS] == ("gate:u1",)
    assert acquire.attributes[attr.WAITED_MS] >= 200  # type: ignore[operator]
    assert gate.attributes[attr.USED_MS] >= acquire.attributes[attr.WAITED_MS]  # type: ignore[operator]

    assert answer.attributes is not None
    assert answer.attributes[attr.STEP_ID] == "answer"
    assert answer.attributes[attr.STATUS] == "completed"
    assert answer.attributes[attr.FALLBACK] == "local"
    local = children(answer, "llm.dispatch")[-1]
    assert local.kind is SpanKind.CLIENT
    assert local.attributes is not None
    assert local.attributes[attr.MODEL] == "local"
    assert 1 <= local.attributes[attr.GEN_AI_USAGE_OUTPUT_TOKENS] <= 2  # type: ignore[operator]
    assert local.status.status_code is not StatusCode.ERROR
    # Per-hop latency: the in-process model has no queue/admission hop, only its engine's.
    assert 0.0 <= local.attributes[attr.CONFIDENCE] <= 1.0  # type: ignore[operator]
    hops = {k: v for k, v in local.attributes.items() if k.startswith(attr.HOP_PREFIX)}
    assert set(hops) == {attr.HOP_PREFIX + h for h in ("prefill", "decode", "network")}
    assert hops[attr.HOP_PREFIX + "prefill"] > 0  # type: ignore[operator]

    assert finish_a.attributes is not None
    assert finish_a.attributes[attr.STEP_ID] == "finish"
    assert finish_a.status.status_code is StatusCode.ERROR
    assert finish_a.events[0].name == "exception"

    # The resumed execution: a new trace, linked to the first, running only "finish".
    assert outline(spans, run_b) == [
        ("checkpoint.write", []),
        ("chain.step", []),
        ("checkpoint.write", []),
        ("checkpoint.write", []),
    ]
    assert run_b.attributes is not None
    assert run_b.attributes[attr.RESUMED] is True
    assert run_b.attributes[attr.STATUS] == "completed"
    assert run_b.status.status_code is StatusCode.UNSET
    (link,) = run_b.links
    assert (link.context.trace_id, link.context.span_id) == (trace_a, run_a.context.span_id)
    assert link.attributes == {attr.LINK_KIND: "resumed_from"}
    (finish_b,) = children(run_b, "chain.step")
    assert finish_b.attributes is not None
    assert finish_b.attributes[attr.STATUS] == "completed"

    # The run record keeps the new trace ids and where it was resumed from.
    assert record.trace["trace_id"] == hexid(trace_b, 32)
    assert record.trace["span_id"] == hexid(run_b.context.span_id, 16)
    assert [(t["trace_id"], t["span_id"]) for t in record.trace["resumed_from"]] == [
        (hexid(trace_a, 32), hexid(run_a.context.span_id, 16))
    ]
    url = f"http://jaeger.example:16686/trace/{hexid(trace_b, 32)}"
    assert hooks.trace_url(hexid(trace_b, 32)) == url
    capsys.readouterr()
    code = await asyncio.to_thread(cli_main, ["inspect", run_id, "--store", store, "--json"])
    assert code == 0
    assert json.loads(capsys.readouterr().out)["trace_url"] == url


async def test_tracing_wraps_store_limiter_backends_and_runner_only_when_on(
    tmp_path: Any,
) -> None:
    from chainrt.tracing._backend import TracedBackend
    from chainrt.tracing._intercept import TracedLimiter, TracedStore, TracingInterceptor

    store = f"sqlite:///{tmp_path / 'runs.db'}"
    async with open_runtime(store=store, hooks=NO_HOOKS) as off:
        # Off costs nothing: the runner talks to the parts themselves, no interceptor between.
        assert not isinstance(off.store, TracedStore)
        assert off.runner.store is off.store
        assert not isinstance(off.limiter, TracedLimiter)
        assert not isinstance(off.dispatcher.backend("local"), TracedBackend)
        assert off.runner.interceptors == ()
    async with open_runtime(store=store, hooks=in_memory_hooks()) as on:
        assert isinstance(on.store, TracedStore)
        assert on.runner.store is on.store
        assert isinstance(on.limiter, TracedLimiter)
        assert isinstance(on.dispatcher.backend("local"), TracedBackend)
        assert [type(i) for i in on.runner.interceptors] == [TracingInterceptor]


async def test_spans_nest_across_tasks_and_traceparent_names_the_current_span() -> None:
    hooks = in_memory_hooks()
    assert hooks.traceparent() is None
    assert hooks.current_ids() == {}
    with hooks.span("chain.run") as outer:
        ids = hooks.current_ids()
        assert hooks.traceparent() == f"00-{ids['trace_id']}-{ids['span_id']}-03"

        async def child() -> dict[str, Any]:
            with hooks.span("llm.dispatch"):
                return hooks.current_ids()

        inner = await asyncio.create_task(child())
        outer.event("note", detail="x", dropped=None)
    assert hooks.current_ids() == {}
    spans = {s.name: s for s in hooks.exporter.get_finished_spans()}  # type: ignore[union-attr]
    dispatch, run = spans["llm.dispatch"], spans["chain.run"]
    assert dispatch.parent is not None
    assert run.context is not None
    assert dispatch.parent.span_id == run.context.span_id
    assert inner["trace_id"] == ids["trace_id"]
    assert inner["span_id"] != ids["span_id"]
    assert [(e.name, dict(e.attributes or {})) for e in run.events] == [("note", {"detail": "x"})]


def test_errors_are_events_with_status_error_recorded_once() -> None:
    hooks = in_memory_hooks()
    error = ChainRTError("step s failed: tool raised")

    def fail() -> None:
        with hooks.span("chain.step") as span:
            span.error(error)  # what the runner does, before the error leaves the span
            raise error

    with pytest.raises(ChainRTError):
        fail()
    (got,) = hooks.exporter.get_finished_spans()  # type: ignore[union-attr]
    assert got.status.status_code is StatusCode.ERROR
    assert got.status.description == "step s failed: tool raised"
    assert [e.name for e in got.events] == ["exception"]
    assert got.attributes is not None
    assert got.attributes[attr.ERROR_TYPE] == "ChainRTError"


def test_attributes_drop_none_and_coerce_what_otel_cannot_take() -> None:
    assert clean_attributes(
        {
            "none": None,
            "s": "x",
            "n": 3,
            "f": 1.5,
            "b": True,
            "keys": ["a", "b"],
            "nums": [1, 2.5],
            "mixed": ["a", 1],
            "obj": {"k": 1},
        }
    ) == {
        "s": "x",
        "n": 3,
        "f": 1.5,
        "b": True,
        "keys": ("a", "b"),
        "nums": (1.0, 2.5),
        "mixed": ("a", "1"),
        "obj": '{"k": 1}',
    }


def test_links_skip_corrupt_ids_and_follow_earlier_resumes() -> None:
    hooks = in_memory_hooks()
    first = {"trace_id": "a" * 32, "span_id": "b" * 16}
    second = {"trace_id": "c" * 32, "span_id": "d" * 16, "resumed_from": [first]}
    with hooks.span(
        "chain.run", links=[{"trace_id": "not-hex", "span_id": "1"}, second, dict(first)]
    ):
        pass
    (run,) = hooks.exporter.get_finished_spans()  # type: ignore[union-attr]
    assert [(hexid(link.context.trace_id, 32)) for link in run.links] == ["c" * 32, "a" * 32]


def test_tracing_is_off_without_otel_variables(otel_env_cleared: None) -> None:
    assert hooks_from_env(Settings()) is NO_HOOKS
    assert TraceConfig.from_env({}) is None
    assert TraceConfig.from_env({"OTEL_TRACES_EXPORTER": "none"}, force=True) is None
    assert TraceConfig.from_env({"OTEL_SDK_DISABLED": "true"}, force=True) is None
    forced = TraceConfig.from_env({}, force=True)
    assert forced is not None
    assert (forced.exporters, forced.protocol) == (("otlp",), "http/protobuf")
    grpc = TraceConfig.from_env(
        {"OTEL_EXPORTER_OTLP_ENDPOINT": "http://c:4317", "OTEL_EXPORTER_OTLP_PROTOCOL": "grpc"}
    )
    assert grpc is not None
    assert grpc.protocol == "grpc"


def test_tracing_off_never_imports_opentelemetry(otel_env_cleared: None) -> None:
    import os
    import subprocess
    import sys

    code = (
        "import sys\n"
        "from chainrt._runtime import default_hooks\n"
        "from chainrt._settings import get_settings\n"
        "hooks = default_hooks(get_settings())\n"
        "print(type(hooks).__name__, any(m.startswith('opentelemetry') for m in sys.modules))\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        env=dict(os.environ),
        cwd=Path(__file__).resolve().parent.parent,
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["NoHooks", "False"]


def test_unusable_exporter_or_protocol_is_a_clear_error() -> None:
    with pytest.raises(ChainRTError, match="OTEL_TRACES_EXPORTER='zipkin'"):
        TraceConfig.from_env({"OTEL_TRACES_EXPORTER": "zipkin"})
    with pytest.raises(ChainRTError, match=r"http/json.*http/protobuf or grpc"):
        TraceConfig.from_env({"OTEL_EXPORTER_OTLP_PROTOCOL": "http/json"}, force=True)


def test_env_tracing_builds_one_provider_per_process_and_names_the_service(
    otel_env_cleared: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A closed port: no span is ever exported here, the test only looks at the set-up.
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_ENDPOINT", "http://127.0.0.1:9")
    hooks = hooks_from_env(Settings(jaeger_url="http://j:16686/"))
    again = hooks_from_env(Settings())
    assert isinstance(hooks, OtelHooks)
    assert isinstance(again, OtelHooks)
    assert hooks.provider is again.provider
    assert hooks.provider.resource.attributes["service.name"] == "chainrt-runner"
    assert hooks.jaeger_url == "http://j:16686"
    assert hooks.trace_url("ab" * 16) is None  # nothing of that trace reached a collector
    worker = tracer_provider_from_env("chainrt-worker")
    assert worker is not None
    assert worker.resource.attributes["service.name"] == "chainrt-worker"
    monkeypatch.setenv("OTEL_SERVICE_NAME", "my-runner")
    named = hooks_from_env(Settings())
    assert isinstance(named, OtelHooks)
    assert named.provider is not hooks.provider
    assert named.provider.resource.attributes["service.name"] == "my-runner"


def test_worker_observer_follows_the_same_otel_variables(
    otel_env_cleared: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    from chainrt import WorkerError
    from workers.server import NullObserver
    from workers.server._tracing import TracingObserver, observer_from_env

    assert isinstance(observer_from_env("local"), NullObserver)
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_ENDPOINT", "http://127.0.0.1:9")  # nothing is sent
    observer = observer_from_env("vllm")
    assert isinstance(observer, TracingObserver)
    assert observer.provider.resource.attributes["service.name"] == "chainrt-worker"
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_PROTOCOL", "http/json")
    with pytest.raises(WorkerError, match="cannot set up tracing: OTEL_EXPORTER_OTLP_PROTOCOL"):
        observer_from_env("vllm")
