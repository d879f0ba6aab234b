"""The resharding drill: hash slots that hold live keys move between masters while runs commit
steps and limiter actors acquire and release.

Shared by ``tests/test_cluster_reshard.py``::

    with LocalCluster(node_timeout_ms=15_000) as cluster:
        report = reshard_drill(cluster, chain=Path("tests/data/drill/ten.yaml"), log_dir=tmp)
    assert report.ok, report.problems

A slot moves the way ``redis-cli --cluster reshard`` moves it, by hand so that the clients meet
every reply of a migration: ``CLUSTER SETSLOT <slot> IMPORTING`` on the target,
``MIGRATING`` on the source, then ``MIGRATE`` one key at a time with a pause in between (a run's
two keys are then split between the masters for a moment: a script touching both is answered
``TRYAGAIN``; a key already moved is answered ``ASK``), and at last ``SETSLOT <slot> NODE`` on
every master (a client with the old map is answered ``MOVED``). The slots moved are those of runs
in flight (read from their step logs), of the run index and of the limiter's keys, round after
round until every run has finished. Runs are judged as in the failover drill (right output,
every step recorded, no step run twice); the limiter actors check that no key ever had more
holders than its limit (:func:`.limiter_conformance.run_stress`).
"""

from __future__ import annotations

import asyncio
import os
import subprocess
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import redis
from redis.crc import key_slot

from ..concurrency import RedisLimiter
from ..redis.keys import key_names
from ._limiter_stress import run_stress
from .failover import FailoverReport, _judge, collect_results, start_runners, stop_runners
from .redis_cluster import LocalCluster

__all__ = ["ReshardReport", "error_counts", "migrate_slot", "reshard_drill"]

LIMITS = {"k0": 1, "k1": 2, "k2": 3}
"""The limiter keys of the drill and their limits."""

_REDIRECTS = ("MOVED", "ASK", "TRYAGAIN")


@dataclass
class ReshardReport:
    """What the drill saw: the runs' judgement, the slots moved, the limiter's actors."""

    runs: FailoverReport
    slots_moved: int = 0
    keys_moved: int = 0
    limiter_ops: int = 0
    limiter_granted: int = 0
    limiter_peak: dict[str, int] = field(default_factory=dict)
    replies: dict[str, int] = field(default_factory=dict)
    """Redirections and refusals the masters sent during the drill (``INFO errorstats``)."""
    problems: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        """Every run right, no limiter invariant broken, no other problem."""
        return self.runs.ok and not self.problems

    def lines(self) -> list[str]:
        """The figures, one per line."""
        replies = ", ".join(f"{k} {v}" for k, v in sorted(self.replies.items()))
        return [
            f"runs                      {self.runs.runs}",
            f"completed                 {self.runs.completed}",
            f"wrong outputs             {self.runs.wrong_outputs}",
            f"steps run twice           {self.runs.steps_rerun}",
            f"step records missing      {self.runs.missing_records}",
            f"slots moved               {self.slots_moved} ({self.keys_moved} keys)",
            f"replies seen              {replies}",
            f"limiter ops               {self.limiter_ops} ({self.limiter_granted} granted), "
            f"peak holders {self.limiter_peak} of limits {LIMITS}",
            f"wall time                 {self.runs.wall_s:.1f}s",
            f"problems                  {len(self.runs.problems) + len(self.problems)}",
        ]


def _client(port: int) -> redis.Redis:
    return redis.Redis(host="127.0.0.1", port=port, socket_timeout=10)


def _cmd(node: redis.Redis, *args: str | int) -> Any:
    """One raw command (redis-py leaves ``execute_command`` untyped)."""
    return node.execute_command(*args)  # type: ignore[no-untyped-call]


def migrate_slot(
    cluster: LocalCluster, slot: int, target: int, *, pause_s: float = 0.03
) -> int | None:
    """Move hash slot ``slot`` to the master on port ``target``, one key per ``MIGRATE`` with
    ``pause_s`` between keys; returns how many keys moved (None if ``target`` had it already)."""
    masters = cluster.masters()
    source = next(p for p, ranges in masters.items() if any(a <= slot <= b for a, b in ranges))
    if source == target:
        return None
    src, dst = _client(source), _client(target)
    try:
        src_id = _cmd(src, "CLUSTER", "MYID").decode()
        dst_id = _cmd(dst, "CLUSTER", "MYID").decode()
        _cmd(dst, "CLUSTER", "SETSLOT", slot, "IMPORTING", src_id)
        _cmd(src, "CLUSTER", "SETSLOT", slot, "MIGRATING", dst_id)
        moved = 0
        while keys := _cmd(src, "CLUSTER", "GETKEYSINSLOT", slot, 1):
            _cmd(src, "MIGRATE", "127.0.0.1", target, "", 0, 5000, "KEYS", keys[0])
            moved += 1
            time.sleep(pause_s)
        # The target first, then the source (as redis-cli does), then every other master.
        for port in [target, source, *(p for p in masters if p not in (source, target))]:
            node = _client(port)
            try:
                _cmd(node, "CLUSTER", "SETSLOT", slot, "NODE", dst_id)
            finally:
                node.close()
        return moved
    finally:
        src.close()
        dst.close()


def error_counts(cluster: LocalCluster) -> dict[str, int]:
    """``MOVED``, ``ASK`` and ``TRYAGAIN`` replies sent so far, summed over the live nodes."""
    total = dict.fromkeys(_REDIRECTS, 0)
    for port in cluster.live_ports():
        node = _client(port)
        try:
            stats = node.info("errorstats")
        finally:
            node.close()
        for name in _REDIRECTS:
            total[name] += int(stats.get(f"errorstat_{name}", {}).get("count", 0))
    return total


def reshard_drill(
    cluster: LocalCluster,
    *,
    chain: Path,
    log_dir: Path,
    runs: int = 60,
    processes: int = 2,
    concurrency: int = 5,
    retry_for_s: float = 30.0,
    slots_per_round: int = 4,
) -> ReshardReport:
    """Run the drill (see the module docstring) and judge every run and the limiter."""
    report = ReshardReport(runs=FailoverReport(runs=runs))
    url = f"{cluster.url}?retry_for_s={retry_for_s:g}"
    ids = [f"rs-{os.getpid()}-{i}" for i in range(runs)]
    before = error_counts(cluster)
    stop = threading.Event()
    limiter_thread = threading.Thread(
        target=_limiter_actors, args=(cluster.url, stop, report), daemon=True
    )
    limiter_thread.start()
    t0 = time.monotonic()
    procs = start_runners(chain, url, log_dir, concurrency, ids, processes)
    try:
        _move_live_slots(cluster, report, ids, log_dir, procs, slots_per_round)
        results = collect_results(procs, report.problems)
    finally:
        stop.set()
        stop_runners(procs)
        limiter_thread.join(timeout=120)
    report.runs.wall_s = time.monotonic() - t0
    after = error_counts(cluster)
    report.replies = {name: after[name] - before[name] for name in _REDIRECTS}
    asyncio.run(_judge(cluster.url, ids, results, log_dir, 10, report.runs))
    return report


def _move_live_slots(
    cluster: LocalCluster,
    report: ReshardReport,
    ids: list[str],
    log_dir: Path,
    procs: list[subprocess.Popen[str]],
    per_round: int,
) -> None:
    """Until every runner has exited: move the slots of up to ``per_round`` runs in flight, of
    the run index and of one limiter key, each to the next master along."""
    limiter_slots = [key_slot(key_names("chainrt:ck", k).holders.encode()) for k in LIMITS]
    index_slot = key_slot(b"chainrt:runs")
    turn = 0
    while any(proc.poll() is None for proc in procs):
        in_flight = [r for r in ids if _in_flight(log_dir / f"{r}.jsonl")]
        slots = [key_slot(f"chainrt:{{{r}}}:run".encode()) for r in in_flight[:per_round]]
        slots += [index_slot, limiter_slots[turn % len(limiter_slots)]]
        ports = sorted(cluster.masters())
        for n, slot in enumerate(dict.fromkeys(slots)):
            target = ports[(turn + n) % len(ports)]
            try:
                moved = migrate_slot(cluster, slot, target)
            except redis.RedisError as exc:
                report.problems.append(f"moving slot {slot} to {target}: {exc}")
                return
            if moved is not None:
                report.slots_moved += 1
                report.keys_moved += moved
        turn += 1
        time.sleep(0.05)


def _in_flight(path: Path) -> bool:
    """Whether the run whose step log is ``path`` has started and not logged its last step."""
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        return False
    return '"step": "s09"' not in text


def _limiter_actors(url: str, stop: threading.Event, report: ReshardReport) -> None:
    """Stress rounds over two limiter instances (standing in for two processes) until ``stop``;
    a broken invariant (over-admission, a leftover holder) becomes a problem of the report."""

    async def main() -> None:
        doors = [RedisLimiter.from_url(url, lease_ttl_s=10.0) for _ in range(2)]
        for door in doors:
            door.cluster_retry_s = 30.0  # the runs' store window (retry_for_s), not 10 s
        seed = 0
        try:
            while not stop.is_set():
                stress = await run_stress(doors[0], LIMITS, ops=200, seed=seed, via=doors)
                seed += 1
                report.limiter_ops += 200
                report.limiter_granted += stress.granted
                for key, peak in stress.peak.items():
                    report.limiter_peak[key] = max(report.limiter_peak.get(key, 0), peak)
        finally:
            for door in doors:
                await door.close()

    try:
        asyncio.run(main())
    except BaseException as exc:  # an AssertionError of run_stress, or the limiter's error
        report.problems.append(f"limiter actors: {type(exc).__name__}: {exc}")
