"""The SQLite limiter (embedded store): the conformance suite, several instances on one file, and
real ``chainrt run`` processes sharing a key on the default store (issue 12 finding 16).

Limits across processes are checked from the (entered, left) times the tool writes, never from
the limiter's own tables.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import sqlite3
import subprocess
import sys
import time
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest
from limiter_workers import LimiterWorkers

from chainrt.concurrency import KeyRequest, Limiter, LocalLimiter, SQLiteLimiter, open_limiter
from chainrt.testing.limiter_conformance import Leftovers, LimiterConformance, run_stress

ROOT = Path(__file__).resolve().parents[1]
CHAINS = Path(__file__).parent / "data" / "chains"


def _leftover_rows(path: Path) -> list[str]:
    with sqlite3.connect(path) as conn:
        rows = conn.execute(
            "SELECT 'holder ' || key || ' ' || member FROM ck_holders "
            "UNION ALL SELECT 'ticket ' || key || ' ' || member FROM ck_queue"
        ).fetchall()
    return [r[0] for r in rows]


class TestSQLiteLimiter(LimiterConformance):
    """Every conformance test, on a fresh SQLiteLimiter over a fresh file."""

    @pytest.fixture
    async def limiter(self, tmp_path: Path) -> AsyncIterator[Limiter]:
        lim = SQLiteLimiter(tmp_path / "ck.db", lease_ttl_s=3.0)
        yield lim
        await lim.close()

    @pytest.fixture
    def leftovers(self, tmp_path: Path) -> Leftovers:
        async def scan() -> list[str]:
            return _leftover_rows(tmp_path / "ck.db")

        return scan


async def test_instances_on_one_file_share_the_limits(tmp_path: Path) -> None:
    """Three instances (stand-ins for processes) under the randomised stress of the suite."""
    path = tmp_path / "shared.db"
    doors = [SQLiteLimiter(path, lease_ttl_s=3.0) for _ in range(3)]
    try:
        limits = {"s:1": 1, "s:2": 2}
        report = await run_stress(doors[0], limits, ops=600, seed=16, via=doors)
        assert report.granted > 30, report
        assert report.rejected > 0, report
        assert report.cancelled > 0, report
        assert all(0 < report.peak[k] <= limits[k] for k in limits), report.peak
        assert _leftover_rows(path) == []
    finally:
        for door in doors:
            await door.close()


async def test_a_release_in_one_instance_serves_the_line_of_another(tmp_path: Path) -> None:
    path = tmp_path / "line.db"
    a, b = SQLiteLimiter(path), SQLiteLimiter(path)
    key = KeyRequest("session:s", 1)
    try:
        first = await a.acquire([key], timeout_s=1, holder="first")
        waiter = asyncio.create_task(b.acquire([key], timeout_s=5, holder="second"))
        while (await a.snapshot("session:s")).waiting != ("second",):
            await asyncio.sleep(0.005)
        with pytest.raises(Exception, match="slots held"):  # held, and one already in line
            await a.acquire([key], timeout_s=0, holder="newcomer")
        await first.release()
        second = await asyncio.wait_for(waiter, 5)
        assert (await a.snapshot("session:s")).holders == ("second",)
        await second.release()
    finally:
        await a.close()
        await b.close()


async def test_close_gives_back_what_the_instance_held(tmp_path: Path) -> None:
    path = tmp_path / "close.db"
    doomed, other = SQLiteLimiter(path), SQLiteLimiter(path)
    try:
        await doomed.acquire([KeyRequest("gpu:0", 1)], timeout_s=1, holder="doomed")
        await doomed.close()
        holding = await other.acquire([KeyRequest("gpu:0", 1)], timeout_s=0, holder="heir")
        await holding.release()
    finally:
        await other.close()


async def test_open_limiter_on_the_embedded_store(tmp_path: Path) -> None:
    lim = open_limiter(f"sqlite:///{tmp_path}/store.db", lease_ttl_s=2.0)
    try:
        assert isinstance(lim, SQLiteLimiter)
        assert lim.path == tmp_path / "store.db"
        assert lim.lease_ttl_s == 2.0
    finally:
        await lim.close()
    assert isinstance(open_limiter("sqlite:///:memory:"), LocalLimiter)  # nothing to share


# ---------------------------------------------------------------------- real chainrt processes


class Runs:
    """``chainrt run`` processes on one SQLite store; none outlives the test."""

    def __init__(self, home: Path, log: Path) -> None:
        self.home = home
        self.env = {
            **os.environ,
            "PYTHONPATH": f"{ROOT}{os.pathsep}{os.environ.get('PYTHONPATH', '')}",
            "CHAINRT_TEST_LOG": str(log),
            "CHAINRT_LEASE_TTL_S": "1.5",
        }
        self.env.pop("CHAINRT_STORE", None)  # the default: sqlite:///.chainrt/chainrt.db
        self.procs: list[subprocess.Popen[str]] = []

    def start(self, run_id: str, chain: str = "user_limited.yaml") -> subprocess.Popen[str]:
        proc = subprocess.Popen(
            [sys.executable, "-m", "chainrt", "run", str(CHAINS / chain), "--run-id", run_id,
             "--input", '{"user": "u1"}', "--json"],
            cwd=self.home, env=self.env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        )  # fmt: skip
        self.procs.append(proc)
        return proc

    def close(self) -> None:
        for proc in self.procs:
            if proc.poll() is None:
                proc.kill()
            proc.communicate()


@pytest.fixture
def runs(tmp_path: Path) -> Iterator[Runs]:
    procs = Runs(tmp_path, tmp_path / "holds.jsonl")
    yield procs
    procs.close()


async def _until_waiting(limiter: SQLiteLimiter, key: str, n: int, proc: object) -> None:
    deadline = time.monotonic() + 60  # a CLI process starts in seconds on a loaded machine
    while len((await limiter.snapshot(key)).waiting) < n:
        assert time.monotonic() < deadline, f"run never queued for {key} ({proc})"
        await asyncio.sleep(0.02)


def _max_overlap(intervals: list[tuple[float, float]]) -> int:
    events = sorted([(a, 1) for a, _ in intervals] + [(b, -1) for _, b in intervals])
    current = peak = 0
    for _, delta in events:  # at equal times the exit (-1) sorts first
        current += delta
        peak = max(peak, current)
    return peak


@pytest.mark.slow
async def test_three_cli_runs_on_the_default_store_never_overlap(
    runs: Runs, tmp_path: Path
) -> None:
    """Finding 16: three `chainrt run` with `user:u1` (limit 1) used to overlap on SQLite."""
    store = tmp_path / ".chainrt" / "chainrt.db"
    gate = SQLiteLimiter(store)
    try:
        # Hold the key first so that all three processes are in line together: without a limit
        # that holds across processes they would run at once as soon as it is released.
        held = await gate.acquire([KeyRequest("user:u1", 1)], timeout_s=1, holder="gate")
        procs = []
        for i in range(3):
            procs.append(runs.start(f"r{i}"))
            await _until_waiting(gate, "user:u1", i + 1, procs[-1].args)
        await held.release()
        results = []
        for proc in procs:
            out, err = await asyncio.to_thread(proc.communicate, timeout=120)
            assert proc.returncode == 0, err
            results.append(json.loads(out))
    finally:
        await gate.close()
    assert [r["status"] for r in results] == ["completed"] * 3
    entries = [json.loads(line) for line in (tmp_path / "holds.jsonl").read_text().splitlines()]
    assert len({e["pid"] for e in entries}) == 3
    assert _max_overlap([(e["entered"], e["left"]) for e in entries]) == 1
    # First come, first served: in the order the runs joined the line.
    assert [e["tool"] for e in sorted(entries, key=lambda e: e["entered"])] == ["r0", "r1", "r2"]
    assert _leftover_rows(store) == []


@pytest.mark.slow
async def test_a_killed_run_frees_its_key_within_the_lease(runs: Runs, tmp_path: Path) -> None:
    store = tmp_path / ".chainrt" / "chainrt.db"
    proc = runs.start("doomed", chain="user_limited_long.yaml")
    observer = SQLiteLimiter(store)
    try:
        deadline = time.monotonic() + 60
        while (await observer.snapshot("user:u1")).holders == ():
            assert time.monotonic() < deadline, "the run never took its key"
            await asyncio.sleep(0.02)
        await asyncio.sleep(3.0)  # two lease TTLs: only renewal keeps the slot
        assert (await observer.snapshot("user:u1")).holders == ("doomed:run",)
        os.kill(proc.pid, signal.SIGKILL)
        await asyncio.to_thread(proc.wait)
        killed = time.monotonic()
        holding = await observer.acquire([KeyRequest("user:u1", 1)], timeout_s=10, holder="heir")
        freed_after = time.monotonic() - killed
        await holding.release()
    finally:
        await observer.close()
    # Freed by the lease lapsing (TTL 1.5 s), not before; within it plus slack for a busy machine
    # (the last renewal came at most TTL/3 before the kill; a waiter looks every 20 ms).
    assert 0.5 < freed_after < 1.5 + 1.0, freed_after


# ---------------------------------------------------------------- the multiprocess tests, on SQLite


class Workers(LimiterWorkers):
    """``limiter_worker.py`` processes on one SQLite file, started together by a file."""

    def __init__(self, path: Path) -> None:
        self.go = path.parent / "go"
        super().__init__(f"sqlite:///{path}", "--start-file", str(self.go))

    def run_all(self) -> None:
        """Wait until every worker is ready, start them at once, wait for them to finish."""
        for proc in self.procs:
            assert proc.stdout is not None
            line = proc.stdout.readline().strip()
            assert line == "ready", f"worker said {line!r} (exit code {proc.poll()})"
        self.go.touch()
        for proc in self.procs:
            assert proc.wait(timeout=120) == 0


@pytest.fixture
def workers(tmp_path: Path) -> Iterator[Workers]:
    pool = Workers(tmp_path / "shared.db")
    yield pool
    pool.close()


@pytest.mark.slow
def test_four_processes_never_exceed_the_limit(workers: Workers, tmp_path: Path) -> None:
    """The Redis limiter's multiprocess test, on one SQLite file (finding 16)."""
    outs = [tmp_path / f"w{i}.jsonl" for i in range(4)]
    for i, out in enumerate(outs):
        workers.start("contend", "model:m", "--limit", "2", "--iterations", "12",
                      "--hold-ms", "15", "--name", f"w{i}", "--out", str(out))  # fmt: skip
    workers.run_all()
    intervals = []
    for out in outs:
        for line in out.read_text().splitlines():
            record = json.loads(line)
            intervals.append((record["enter"], record["exit"]))
    assert len(intervals) == 4 * 12
    assert _max_overlap(intervals) == 2  # the limit was reached, and never exceeded
    assert _leftover_rows(tmp_path / "shared.db") == []


@pytest.mark.slow
def test_rate_holds_within_ten_percent_across_processes(workers: Workers, tmp_path: Path) -> None:
    """5/s shared by four processes: ~25 grants in 5 s, whichever process asks."""
    outs = [tmp_path / f"r{i}.jsonl" for i in range(4)]
    for i, out in enumerate(outs):
        workers.start("rate", "api:shared", "--limit", "100", "--rate", "5", "--seconds", "6",
                      "--name", f"r{i}", "--out", str(out))  # fmt: skip
    workers.run_all()
    grants = sorted(
        json.loads(line)["grant"] for out in outs for line in out.read_text().splitlines()
    )
    per_process = [len(out.read_text().splitlines()) for out in outs]
    assert all(n > 0 for n in per_process), per_process  # every process got its turns
    in_window = sum(1 for t in grants if grants[0] <= t < grants[0] + 5.0)
    # The same bounds as on Redis: a burst of at most 1 plus 5/s over 5 s, ±10 %.
    assert 22.5 <= in_window <= 27.5, in_window
