"""``Runtime.stream`` (README.md; docs/serve.md, Run events) carries an LLM step's tokens as dispatch streams them.

Real components: the in-process local model (llama.cpp, SmolLM2) behind dispatch, a SQLite
store. Generation is greedy, so the streamed pieces joined must equal the step's answer.
"""

from __future__ import annotations

from pathlib import Path

import pytest

import chainrt
from chainrt import Runtime
from chainrt.engines import get_local_engine

pytestmark = pytest.mark.slow

PROMPT = "Count from 1 to 30, separated by commas."


async def test_runtime_stream_yields_the_llm_steps_tokens_then_its_attempt(
    tmp_path: Path,
) -> None:
    await get_local_engine().start()
    path = tmp_path / "chain.yaml"
    path.write_text(
        "name: streamed\nbudget: 60s\ninputs: {}\nsteps:\n  - id: answer\n"
        f"    llm: {{model: local, prompt: '{PROMPT}', max_tokens: 24}}\n"
        "output: '{{ steps.answer.output }}'\n"
    )
    chain = chainrt.load(path)
    async with Runtime(store=f"sqlite:///{tmp_path / 'runs.db'}") as rt:
        events = [e.to_dict() async for e in rt.stream(chain, {}, run_id="tokens-1")]
    kinds = [e["type"] for e in events]
    assert kinds[:2] == ["run_started", "step_started"]
    assert kinds[-1] == "run_finished"
    tokens = [e for e in events if e["type"] == "token"]
    assert len(tokens) > 5
    assert {e["step_id"] for e in tokens} == {"answer"}
    # The tokens come while the step runs: before its attempt is told, and before it finishes.
    assert kinds.index("token") < kinds.index("attempt") < kinds.index("step_finished")
    assert max(i for i, k in enumerate(kinds) if k == "token") < kinds.index("attempt")
    final = events[-1]
    assert final["status"] == "completed"
    assert "".join(e["text"] for e in tokens) == final["output"]
