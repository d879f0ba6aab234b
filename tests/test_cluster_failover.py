"""Failover on a real local Redis Cluster: a master killed with ``kill -9`` in the middle of 200
runs of a 10-step chain, shared by 4 runner processes; its replica takes over and every run
completes with the right output, every step recorded once and run once."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from pathlib import Path

import pytest

from chainrt._errors import StoreUnavailable
from chainrt.store import RedisStore
from chainrt.testing.failover import failover_drill
from chainrt.testing.redis_cluster import LocalCluster
from chainrt.testing.store_conformance import make_run

pytestmark = [pytest.mark.redis, pytest.mark.cluster, pytest.mark.slow]

CHAIN = Path(__file__).parent / "data" / "drill" / "ten.yaml"


@pytest.fixture
def cluster() -> Iterator[LocalCluster]:
    """A cluster of this test's own (a node gets killed); failover after 1 s without a master."""
    with LocalCluster(node_timeout_ms=1000) as cluster:
        yield cluster


def test_a_master_killed_mid_drill_loses_no_run(cluster: LocalCluster, tmp_path: Path) -> None:
    report = failover_drill(cluster, chain=CHAIN, log_dir=tmp_path, runs=200, processes=4)
    message = "\n".join(report.lines() + report.problems[:20])
    print(message)  # the figures, with -s
    assert report.ok, message
    assert report.completed == 200, message
    assert report.runs_in_flight_on_it > 0, message  # the kill caught runs on that master
    assert report.promoted_port != report.killed_port, message
    assert (report.steps_rerun, report.missing_records, report.wrong_outputs) == (0, 0, 0)


def test_a_cluster_that_stays_down_is_one_clear_line(cluster: LocalCluster) -> None:
    async def main() -> None:
        store = RedisStore(cluster.url, retry_for_s=1.0)
        await store.create_run(make_run("before"))  # the cluster is known to the store
        for port in cluster.live_ports():
            cluster.kill(port)
        with pytest.raises(StoreUnavailable) as caught:
            await store.get_run("before")
        text = str(caught.value)
        assert "\n" not in text
        assert "Redis Cluster store" in text, text
        assert "gave up after 1s" in text, text
        await store.close()

    asyncio.run(main())
