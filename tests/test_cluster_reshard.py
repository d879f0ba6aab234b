"""Resharding and a cluster that stays down, on a real local Redis Cluster.

Slots holding live run keys, the run index and limiter keys move between masters while 2 runner
processes run 60 runs of a 10-step chain and limiter actors acquire and release: the clients meet
real ``MOVED``, ``ASK`` and ``TRYAGAIN`` replies, and every run still completes right, no step runs
twice, no key ever has more holders than its limit. A cluster that lost a master and its replica
answers ``CLUSTERDOWN``: the store retries for its window, then says so in one line.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from chainrt._errors import StoreUnavailable
from chainrt.store import RedisStore
from chainrt.testing.redis_cluster import LocalCluster
from chainrt.testing.reshard import reshard_drill
from chainrt.testing.store_conformance import make_run

pytestmark = [pytest.mark.redis, pytest.mark.cluster, pytest.mark.slow]

CHAIN = Path(__file__).parent / "data" / "drill" / "ten.yaml"


@pytest.fixture
def cluster() -> Iterator[LocalCluster]:
    """A cluster of this test's own: its slot map is changed. Node timeout 15 s (Redis's default):
    no failover may start on a loaded machine in the middle of the resharding."""
    with LocalCluster(node_timeout_ms=15_000) as cluster:
        yield cluster


def test_slots_move_under_live_runs_and_limiter(cluster: LocalCluster, tmp_path: Path) -> None:
    report = reshard_drill(cluster, chain=CHAIN, log_dir=tmp_path, runs=60, processes=2)
    message = "\n".join(report.lines() + report.problems[:20] + report.runs.problems[:20])
    print(message)  # the figures, with -s
    assert report.ok, message
    assert report.runs.completed == 60, message
    assert (report.runs.steps_rerun, report.runs.missing_records) == (0, 0), message
    assert report.runs.wrong_outputs == 0, message
    assert report.slots_moved > 0, message
    assert report.keys_moved > 0, message
    assert report.limiter_granted > 0, message
    # The clients met the replies of a migration (counted by the masters themselves).
    assert min(report.replies.values()) > 0, message  # MOVED, ASK and TRYAGAIN each


def test_a_cluster_down_is_one_clear_line_within_the_retry_window() -> None:
    # 3 masters, no replicas: a killed master's slots have no one to take them over, and after
    # cluster-node-timeout (1 s) every other node answers CLUSTERDOWN to every command.
    with LocalCluster(replicas=0, node_timeout_ms=1000) as cluster:
        masters = cluster.masters()
        victim = min(masters)
        survivor = next(p for p in masters if p != victim)

        async def main() -> None:
            store = RedisStore(cluster.url + "?retry_for_s=2", retry_for_s=30.0)
            assert store.retry_for_s == 2.0  # the URL's window wins
            run_id = next(
                f"down-{i}" for i in range(1000) if _on(cluster, f"down-{i}", survivor, masters)
            )
            await store.create_run(make_run(run_id))
            cluster.kill(victim)
            _wait_state(survivor, "fail", timeout_s=60)
            started = time.monotonic()
            with pytest.raises(StoreUnavailable) as caught:
                await store.get_run(run_id)
            took = time.monotonic() - started
            text = str(caught.value)
            print(f"{text} ({took:.1f}s)")  # the line, with -s
            assert "\n" not in text
            assert "CLUSTERDOWN" in text, text
            assert "gave up after 2s" in text, text
            # It retried for its window, then stopped: not before 2 s; the upper bound carries a
            # margin (10 s) that a loaded 2-core machine cannot use up in a few round trips.
            assert 2.0 <= took < 12.0, took
            await store.close()

        asyncio.run(main())


def _on(
    cluster: LocalCluster, run_id: str, port: int, masters: dict[int, list[tuple[int, int]]]
) -> bool:
    return cluster.master_of(f"chainrt:{{{run_id}}}:run", masters) == port


def _wait_state(port: int, state: str, timeout_s: float) -> None:
    import redis

    node = redis.Redis(host="127.0.0.1", port=port)
    try:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if node.cluster("INFO").get("cluster_state") == state:
                return
            time.sleep(0.1)
    finally:
        node.close()
    raise AssertionError(f"node {port} did not reach cluster_state:{state} in {timeout_s:g}s")
