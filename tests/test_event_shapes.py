"""One event shape everywhere (issue 41): the SSE of a real ``chainrt serve``, ``Runtime.stream``
and ``Chain.as_runnable().stream`` give the same events, key for key, for the same chain.

Each source runs the chain once (a nap, a parallel group of two naps, then, in the ``llm`` case,
a step answered by the in-process local model so that ``token`` events come too). The SSE watcher connects while the
nap runs, so it hears the later steps live (tokens are never stored, so a late watcher would not).
"""

from __future__ import annotations

import asyncio
import json
import shutil
from collections import Counter
from pathlib import Path
from typing import Any

import httpx
import pytest

import chainrt
from chainrt import Runtime
from chainrt.langchain import ChainEvent
from chainrt.testing.serve_process import ServeProcess

TOOLS = Path(__file__).parent / "data" / "dashboard" / "tools.py"
NAP_S = 1.5  # long enough for the SSE watcher to connect before the second step starts
STEP_KEYS = ("type", "run_id", "ts", "step_id")
RUN_KEYS = ("type", "run_id", "ts")

Shape = set[tuple[str, str | None, tuple[str, ...]]]


def write_chain(where: Path, llm: bool) -> Path:
    """A chain dir with ``shapes.yaml``: a nap, then (``llm``) a local-model step."""
    where.mkdir()
    shutil.copy(TOOLS, where / "tools.py")
    text = (
        "name: shapes\nbudget: 2m\ninputs: {seconds: float}\nsteps:\n"
        '  - {id: wait, tool: "tools.py:nap", args: {seconds: "{{ input.seconds }}"}}\n'
        "  - id: both\n    parallel:\n"  # steps inside a control-flow group
        '      a: [{id: quick, tool: "tools.py:nap", args: {seconds: 0.0}}]\n'
        '      b: [{id: slow, tool: "tools.py:nap", args: {seconds: 0.2}}]\n'
    )
    if llm:
        text += "  - id: say\n    llm: {model: local, prompt: 'Say hello.', max_tokens: 4}\n"
    (where / "shapes.yaml").write_text(text)
    return where / "shapes.yaml"


def shape(events: list[dict[str, Any]]) -> Shape:
    """Which keys each (type, step) event carries."""
    return {(e["type"], e.get("step_id"), tuple(sorted(e))) for e in events}


def order(events: list[dict[str, Any]]) -> Counter[tuple[str, str | None]]:
    """How many events of each (type, step) a run gave, tokens left out (how many pieces may
    vary); a multiset, as the branches of a parallel group may interleave either way."""
    return Counter((e["type"], e.get("step_id")) for e in events if e["type"] != "token")


def sse_events(server: ServeProcess, run_id: str) -> list[dict[str, Any]]:
    answer = server.post(
        "/v1/runs", json={"chain": "shapes", "run_id": run_id, "input": {"seconds": NAP_S}}
    )
    assert answer.status_code == 202, answer.text
    events: list[dict[str, Any]] = []
    url = f"{server.url}/v1/runs/{run_id}/events"
    with httpx.stream("GET", url, timeout=100.0) as stream:
        assert stream.status_code == 200
        for line in stream.iter_lines():
            if line.startswith("data: "):
                events.append(json.loads(line[6:]))
                if events[-1]["type"] == "run_finished":
                    break
    return events


async def runtime_events(chain: chainrt.Chain, store: str) -> list[dict[str, Any]]:
    async with Runtime(store=store) as runtime:
        return [e.to_dict() async for e in runtime.stream(chain, {"seconds": NAP_S})]


@pytest.mark.parametrize("llm", [False, pytest.param(True, marks=pytest.mark.slow)])
def test_sse_runtime_stream_and_runnable_stream_give_the_same_event_keys(
    llm: bool, tmp_path: Path
) -> None:
    path = write_chain(tmp_path / "chains", llm)
    chain = chainrt.load(path)
    store = f"sqlite:///{tmp_path / 'runs.db'}"

    with ServeProcess(store=f"sqlite:///{tmp_path / 'served.db'}", chains=path.parent) as server:
        over_http = sse_events(server, "shape-sse")
    in_process = asyncio.run(runtime_events(chain, store))
    chunks = list(chain.as_runnable(store=store).stream({"seconds": NAP_S}))
    from_runnable = [dict(c) for c in chunks[:-1]]
    assert all(isinstance(c, ChainEvent) for c in chunks[:-1])
    assert not isinstance(chunks[-1], ChainEvent)
    assert chunks[-1] == from_runnable[-1]["output"]  # the output comes last, after the events

    types = {e["type"] for e in over_http}
    expected = {"run_started", "step_started", "attempt", "step_finished", "run_finished"}
    assert types == (expected | {"token"} if llm else expected)
    for events in (over_http, in_process, from_runnable):
        for event in events:
            run_event = event["type"] in ("run_started", "run_finished")
            assert set(RUN_KEYS if run_event else STEP_KEYS) <= set(event)
    assert shape(in_process) == shape(over_http)
    assert shape(from_runnable) == shape(over_http)
    assert order(in_process) == order(from_runnable) == order(over_http)
    inner = {e.get("step_id") for e in over_http} - {None, "wait", "both", "say"}
    assert inner, "the steps inside the parallel group gave no events"
    for events in (over_http, in_process, from_runnable):
        assert (events[0]["type"], events[-1]["type"]) == ("run_started", "run_finished")
