"""bench/agent.py's models: the scripted stub, the in-process local model, or a worker process.

``scripted``: chainrt.testing.scripted_model, a real HTTP server playing back a fixed
conversation (it says which tools are called, and waits ``delay_s`` a turn).
``local``: SmolLM2-135M on llama.cpp inside this process (the runtime's ``local`` model).
``worker``: a real ``chainrt-worker serve --engine local`` process (the same model) on a free
port, reached through HTTP like any pool endpoint.

With a real model the model decides: the chain's system message asks it to call the tool in
every reply (``constrain: calls`` decodes each turn into a call of a real tool or an answer), and
what it did is counted from the records, not assumed.
"""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx

from chainrt.testing.redis_server import free_port
from chainrt.testing.scripted_model import scripted_model

__all__ = ["KINDS", "Model", "Worker", "chain_text", "model_for"]

KINDS = ("scripted", "local", "worker")

SYSTEM = (
    "You are a test harness. In every reply call the tool {tool} and nothing else: reply "
    '{{"calls": [{{"name": "{tool}", "arguments": {{}}}}]}}. Only when told to stop, reply '
    '{{"content": "done"}}.'
)


@dataclass(frozen=True, slots=True)
class Model:
    """What a chain names (``model``) and the pool file that maps it (None: no pool)."""

    name: str
    pool: str | None
    real: bool


def chain_text(
    model: Model, *, budget: str, iterations: int, tool: str, max_tokens: int = 48
) -> str:
    """An agent chain of one tool (``_agent_tools.py:<tool>``) on ``model``."""
    if model.real:
        # The real model: told what to call, and each turn decoded into a call of a real tool
        # (or an answer).
        system = SYSTEM.format(tool=tool).replace('"', '\\"')
        head = f'      system: "{system}"\n      prompt: "Call {tool}."\n'
        constrain = "calls"
    else:
        head, constrain = '      prompt: "{{ input.q }}"\n', "shape"
    return (
        f"name: bench-agent\nbudget: {budget}\ninputs: {{q: str}}\nsteps:\n  - id: agent\n"
        f"    agent:\n      model: {model.name}\n{head}"
        "      max_calls_per_turn: 1\n"
        f"      tools: [_agent_tools.py:{tool}]\n"
        f"      max_iterations: {iterations}\n      final_reserve: auto\n"
        f"      constrain: {constrain}\n      max_tokens: {max_tokens}\n"
        "      temperature: 0\n"
        "    retry: {attempts: 1}\n"
        'output: "{{ steps.agent.output }}"\n'
    )


class Worker:
    """One ``chainrt-worker serve --engine local`` process on a free port (serves ``primary``)."""

    def __init__(self) -> None:
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        exe = Path(sys.executable).parent / "chainrt-worker"
        self.argv = [str(exe), "serve", "--engine", "local", "--port", str(self.port),
                     "--served-model-name", "primary"]  # fmt: skip
        self.log = tempfile.NamedTemporaryFile(prefix="bench-agent-worker-", suffix=".log")  # noqa: SIM115
        self.process: subprocess.Popen[bytes] | None = None

    def __enter__(self) -> Worker:
        self.process = subprocess.Popen(
            self.argv, env=dict(os.environ), stdout=self.log, stderr=subprocess.STDOUT
        )
        ends = time.monotonic() + 180
        while time.monotonic() < ends:
            if self.process.poll() is not None:
                raise RuntimeError(f"worker exited:\n{Path(self.log.name).read_text()[-3000:]}")
            with contextlib.suppress(httpx.HTTPError):
                if httpx.get(f"{self.url}/health/ready", timeout=2).status_code == 200:
                    return self
            time.sleep(0.2)
        self.__exit__()
        raise RuntimeError("the worker was not ready after 180 s")

    def __exit__(self, *exc: object) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(10)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
        self.log.close()


def _pool(folder: Path, url: str, name: str) -> str:
    path = folder / f"pool-{name}.yaml"
    path.write_text(
        f"models:\n  primary: {{endpoints: [{{url: '{url}'}}]}}\nhealth: {{enabled: false}}\n"
    )
    return str(path)


@contextlib.contextmanager
def model_for(
    kind: str, folder: Path, script: list[str], delay_s: float, worker: Worker | None
) -> Iterator[Model]:
    """The model of one bench section: ``script`` (with ``delay_s`` a turn) for ``scripted``."""
    if kind == "scripted":
        with scripted_model(script, delay_s=delay_s) as stub:
            yield Model("primary", _pool(folder, stub.url, "scripted"), real=False)
    elif kind == "local":
        yield Model("local", None, real=True)
    else:
        assert worker is not None
        yield Model("primary", _pool(folder, worker.url, "worker"), real=True)
