"""Shared fixtures: a private redis-server and a private Redis Cluster per test session (each
started on first use), flushed per test.

``--reverse-order`` runs the collected tests last to first: no test may depend on state that an
earlier one left behind, and this is the cheap way to see that it does not.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING

import pytest

pytest.register_assert_rewrite("chainrt.testing")

from chainrt.testing.redis_cluster import LocalCluster  # noqa: E402  (after assert rewrite)
from chainrt.testing.redis_server import RedisServer  # noqa: E402

if TYPE_CHECKING:
    from worker_fixtures import WorkerProcess


def pytest_addoption(parser: pytest.Parser) -> None:
    """``--reverse-order``: run the tests in the reverse of their collection order."""
    parser.addoption(
        "--reverse-order",
        action="store_true",
        help="run tests last to first (to find tests that depend on earlier tests' state)",
    )


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Apply ``--reverse-order``."""
    if config.getoption("--reverse-order"):
        items.reverse()


@pytest.fixture(scope="session")
def redis_server() -> Iterator[RedisServer]:
    """A redis-server started for this test session on a free port."""
    with RedisServer() as server:
        yield server


@pytest.fixture
def redis_url(redis_server: RedisServer) -> str:
    """URL of the session's redis-server, flushed before each test."""
    import redis

    client = redis.Redis.from_url(redis_server.url)
    client.flushall()
    client.close()
    return redis_server.url


@pytest.fixture(params=["sqlite", "redis"])
def store_url(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    """A store URL, once for a SQLite file and once for the session's Redis (a test file that
    needs only SQLite defines its own ``store_url``)."""
    if request.param == "sqlite":
        return f"sqlite:///{tmp_path / 'runs.db'}"
    url: str = request.getfixturevalue("redis_url")
    return url


@pytest.fixture(scope="session")
def redis_cluster() -> Iterator[LocalCluster]:
    """A local Redis Cluster (3 masters, 3 replicas) started once for this test session.

    ``cluster-node-timeout`` is Redis's default, 15 s: no test kills one of its nodes (a failover
    drill starts a cluster of its own). With 2 s, a master stalled for 3.5 s (SIGSTOP, standing
    in for a starved process on a loaded machine) was failed over in the middle of a test, and a
    failover may lose an acknowledged write (asynchronous replication).
    """
    with LocalCluster(node_timeout_ms=15_000) as cluster:
        yield cluster


@pytest.fixture
def cluster_url(redis_cluster: LocalCluster) -> str:
    """URL of one node of the session's Redis Cluster, every master flushed before each test.

    A test that kills a node (a failover drill) starts a cluster of its own instead.
    """
    redis_cluster.wait_ok()
    redis_cluster.flushall()
    return redis_cluster.url


@pytest.fixture
def chainrt_home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> str:
    """Run the test with a fresh working directory (so `.chainrt/` lands in a temp dir)."""
    monkeypatch.chdir(str(tmp_path))
    return os.fspath(tmp_path)


@pytest.fixture(scope="module")
def worker_engine() -> str:
    """The engine of ``fault_workers`` (a test module overrides this fixture to change it)."""
    return "local"


@pytest.fixture(scope="module")
def fault_workers(worker_engine: str) -> Iterator[tuple[WorkerProcess, WorkerProcess]]:
    """Two real worker processes with fault injection on, started once per test module."""
    from worker_fixtures import fault_worker

    a = fault_worker(worker_engine)
    try:
        b = fault_worker(worker_engine)
    except BaseException:
        a.stop()
        raise
    try:
        yield a, b
    finally:
        a.stop()
        b.stop()


@pytest.fixture
def workers(
    fault_workers: tuple[WorkerProcess, WorkerProcess],
) -> Iterator[tuple[WorkerProcess, WorkerProcess]]:
    """The module's ``fault_workers``, their injected faults reset after each test."""
    yield fault_workers
    for worker in fault_workers:
        if worker.alive:
            worker.post("/admin/faults", json={"reset": True})
