"""Fencing: a paused owner whose run was taken over cannot write to it any more.

Process A runs a chain with a 1 s lease on Redis and is frozen (SIGSTOP) in the middle of a step.
A's pid is alive on this host, so process B's resume must wait for A's lease to expire; it then
takes the run over with a higher fencing token and finishes it. Woken (SIGCONT), A finishes its
step, and its write is rejected inside Redis: A stops with one line on stderr and a non-zero exit,
and the records stay exactly as B left them.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import redis

from chainrt.redis.keys import StoreKeys
from chainrt.testing.drill import expected_output, read_log

pytestmark = [pytest.mark.redis, pytest.mark.slow]

CHAIN = Path(__file__).parent / "data" / "drill" / "fencing.yaml"  # 6 steps of 200 ms
RUN = "fence-1"


def _env(ttl_s: float) -> dict[str, str]:
    return {**os.environ, "CHAINRT_LEASE_TTL_S": str(ttl_s)}


def _wait_for_log(log: Path, step: str, pid: int, timeout_s: float = 30) -> None:
    """Until ``pid`` has logged the start of ``step`` (a step logs before it works)."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        executions, _ = read_log(log)
        if any(e.step == step and e.pid == pid for e in executions):
            return
        time.sleep(0.005)
    raise AssertionError(f"pid {pid} never started step {step}")


def _raw(client: redis.Redis, keys: StoreKeys) -> tuple[dict[bytes, bytes], dict[bytes, bytes]]:
    """Everything stored about the run, byte for byte."""
    return client.hgetall(keys.run(RUN)), client.hgetall(keys.steps(RUN))  # type: ignore[return-value]


def test_a_paused_owner_is_fenced_out_after_a_takeover(redis_url: str, tmp_path: Path) -> None:
    log = tmp_path / f"{RUN}.jsonl"
    seed = "fencing-seed"
    inputs = json.dumps({"seed": seed, "log_dir": str(tmp_path)})
    run_args = ["run", str(CHAIN), "--input", inputs, "--run-id", RUN, "--store", redis_url]
    a = subprocess.Popen(
        [sys.executable, "-m", "chainrt", *run_args, "--json"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=_env(1.0),
    )
    client = redis.Redis.from_url(redis_url)
    keys = StoreKeys()
    try:
        # What a resuming CLI process costs before it can look at the lease, measured now (it
        # is seconds, not a fraction of one, on a loaded 2-core machine): a resume of a run that
        # does not exist takes the same imports and store set-up, then ends.
        started = time.time()
        absent = subprocess.run(
            [sys.executable, "-m", "chainrt", "resume", "no-such-run", "--store", redis_url],
            capture_output=True,
            text=True,
            env=_env(1.0),
            timeout=60,
        )
        cli_start_s = time.time() - started
        assert absent.returncode != 0
        _wait_for_log(log, "s02", a.pid)
        a.send_signal(signal.SIGSTOP)  # frozen inside a step, lease no longer renewed
        paused_at = time.time()
        a_steps = [e.step for e in read_log(log)[0]]
        in_flight = a_steps[-1]  # s02, unless this machine was very slow to send the signal
        # A step in flight has no record, or a `running` one (a tool that takes ctx writes its
        # attempt before the call); a completed record would mean A was between steps.
        raw = client.hget(keys.steps(RUN), in_flight)
        assert raw is None or json.loads(raw)["status"] == "running", "A was not inside a step"
        lease_expires_at = float(client.hget(keys.run(RUN), "owner_expires_at") or 0)
        assert int(client.hget(keys.run(RUN), "token") or 0) == 1

        b = subprocess.run(
            [
                sys.executable,
                "-m",
                "chainrt",
                "resume",
                RUN,
                "--store",
                redis_url,
                "--json",
                "--chains",
                str(CHAIN.parent),
            ],
            capture_output=True,
            text=True,
            env=_env(1.0),
            timeout=60,
        )
        assert b.returncode == 0, b.stderr
        result = json.loads(b.stdout)
        assert result["status"] == "completed"
        assert result["output"] == expected_output(seed, 6)
        run_b, steps_b = _raw(client, keys)
        assert run_b[b"token"] == b"2"  # B took over with a higher fencing token
        assert b"owner_pid" not in run_b  # ... and released the run when it finished
        assert sorted(steps_b) == [f"s{i:02d}".encode() for i in range(6)]
    finally:
        a.send_signal(signal.SIGCONT)
    try:
        _, a_err = a.communicate(timeout=60)
    finally:
        client_after = _raw(client, keys)
        client.close()

    # A's next write was refused inside Redis; A stopped with one clear line and a failure code.
    assert a.returncode not in (0, None), a_err
    lines = a_err.strip().splitlines()
    assert len(lines) == 1, a_err
    assert "Traceback" not in a_err
    assert RUN in lines[0]
    assert "fencing token 1" in lines[0] or "taken over" in lines[0], lines[0]
    # Nothing A did after waking changed a byte of the run or its steps.
    assert client_after == (run_b, steps_b)

    executions, problems = read_log(log)
    assert problems == []
    by_pid: dict[int, list[str]] = {}
    for e in executions:
        by_pid.setdefault(e.pid, []).append(e.step)
    assert by_pid.pop(a.pid) == a_steps  # A started nothing after it woke
    (b_steps,) = by_pid.values()
    all_steps = [f"s{i:02d}" for i in range(6)]
    assert b_steps == all_steps[all_steps.index(in_flight) :]  # B re-ran only the step in flight
    b_first = min(e.t for e in executions if e.step == in_flight and e.pid != a.pid)
    assert b_first >= lease_expires_at  # B took over only once A's lease had expired
    # ... and did not wait much longer than that: the 1 s lease, B's own start-up (twice what
    # it measured above, load varies) and a second of slack; waiting for the default 10 s lease
    # or a second expiry would be past it.
    assert b_first - paused_at < 1.0 + 2 * cli_start_s + 1.0, cli_start_s
    record = json.loads(steps_b[in_flight.encode()])
    assert record["started_at"] <= b_first <= record["finished_at"]  # B's run of that step
