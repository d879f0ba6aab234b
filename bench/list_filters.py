"""Filtered ``list_runs`` pages against an unfiltered one, with many runs (issue 36).

Writes ``--runs`` runs (default 100,000) through the store API (``create_run`` and a final
``commit`` for four of five: statuses completed / partial / failed / cancelled / running, chains
c0..c9; chain c<k> holds one status only), then times pages of ``--limit`` runs: unfiltered,
each filter alone (a status, a chain, and one of each that no run has), both filters (matching,
matching none though each alone matches 10,000 or 20,000 runs, and with an unknown chain or
status) and deep keyset pages. Both filters walk one index of their own (SQLite
``runs_by_chain_status``, Redis a sorted set per chain and status): a page that no run matches
reads none. The pages take turns (one of each per round, ``--repeat`` rounds), so that a busy
machine slows them alike. Prints p50 / p90 per page and the ratio of each p50 to the unfiltered
one (the goal: within 2x), then the worst ratio.

    .venv/bin/python bench/list_filters.py [--store sqlite|redis|both] [--runs 100000]
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from chainrt._records import OwnerLease, RunProgress, RunRecord  # noqa: E402
from chainrt.store import open_store  # noqa: E402
from chainrt.testing.redis_server import RedisServer  # noqa: E402

FINAL = ("completed", "partial", "failed", "cancelled")


async def _fill(store: Any, runs: int) -> float:
    started = time.perf_counter()
    base = time.time() - runs

    async def one(i: int) -> None:
        run_id = f"bench-{i:06d}"
        owner = OwnerLease(host="bench", pid=1, token=1, expires_at=time.time() + 3600)
        record = RunRecord(
            run_id=run_id,
            chain=f"c{i % 10}",
            spec={"name": f"c{i % 10}", "steps": []},
            input={"i": i},
            budget_total_ms=1000.0,
            owner=owner,
            fencing_token=1,
            created_at=base + i,
            updated_at=base + i,
        )
        await store.create_run(record)
        if i % 5 < 4:
            status: Any = FINAL[i % 5]
            await store.commit(run_id, 1, RunProgress(status=status, budget_used_ms=1.0))

    batch = 500
    for start in range(0, runs, batch):
        await asyncio.gather(*(one(i) for i in range(start, min(runs, start + batch))))
    return time.perf_counter() - started


async def _time(
    store: Any, repeat: int, limit: int, queries: list[tuple[str, dict[str, Any]]]
) -> dict[str, tuple[float, float, int]]:
    """p50 and p90 ms and the runs found, per query. The queries take turns, one page each per
    round: a machine busy with other work for a while slows every query alike, and the ratios
    to the unfiltered page hold."""
    times: dict[str, list[float]] = {name: [] for name, _ in queries}
    found: dict[str, int] = {}
    for _ in range(repeat):
        for name, query in queries:
            t0 = time.perf_counter()
            page = await store.list_runs(limit=limit, **query)
            times[name].append((time.perf_counter() - t0) * 1000)
            found[name] = len(page)
    out = {}
    for name, ms in times.items():
        ms.sort()
        out[name] = (statistics.median(ms), ms[max(0, int(len(ms) * 0.9) - 1)], found[name])
    return out


async def _bench(url: str, runs: int, limit: int, repeat: int) -> None:
    store = open_store(url)
    try:
        await store.list_runs(limit=1)  # connected once, before 500 calls at a time
        filled = await _fill(store, runs)
        print(f"store {url.split(':', 1)[0]}: {runs} runs written in {filled:.1f} s")
        await store.list_runs("failed", 1)  # a first filtered page (Redis: finds the marker)
        deep = await store.list_runs("failed", 1, before=None)
        middle = (deep[0].created_at - runs / 2, "bench-zzzz") if deep else None
        queries: list[tuple[str, dict[str, Any]]] = [
            ("unfiltered", {}),
            ("status=failed", {"status": "failed"}),
            ("status=nope", {"status": "nope"}),
            ("chain=c3", {"chain": "c3"}),
            ("chain=nope", {"chain": "nope"}),
            ("chain=c2&status=failed", {"chain": "c2", "status": "failed"}),
            ("chain=c3&status=failed (none)", {"chain": "c3", "status": "failed"}),
            ("chain=c0&status=running (none)", {"chain": "c0", "status": "running"}),
            ("chain=nope&status=failed", {"chain": "nope", "status": "failed"}),
            ("chain=c3&status=nope", {"chain": "c3", "status": "nope"}),
            ("unfiltered, deep cursor", {"before": middle}),
            ("status=failed, deep cursor", {"status": "failed", "before": middle}),
            ("chain=c2, deep cursor", {"chain": "c2", "before": middle}),
            ("chain=c2&status=failed, deep", {"chain": "c2", "status": "failed", "before": middle}),
        ]
        worst = ("", 0.0)
        print(
            f"{'page (limit ' + str(limit) + ')':32} {'p50 ms':>8} {'p90 ms':>8} {'runs':>6} ratio"
        )
        timed = await _time(store, repeat, limit, queries)
        base = timed["unfiltered"][0]
        for name, (p50, p90, found) in timed.items():
            print(f"{name:32} {p50:8.2f} {p90:8.2f} {found:6d} {p50 / base:5.2f}x")
            if p50 / base > worst[1]:
                worst = (name, p50 / base)
        print(f"worst: {worst[0]} at {worst[1]:.2f}x the unfiltered page (goal: 2x)")
    finally:
        await store.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--store", choices=["sqlite", "redis", "both"], default="both")
    parser.add_argument("--runs", type=int, default=100_000)
    parser.add_argument("--limit", type=int, default=50)
    parser.add_argument("--repeat", type=int, default=30)
    args = parser.parse_args()
    if args.store in ("sqlite", "both"):
        with tempfile.TemporaryDirectory() as tmp:
            asyncio.run(_bench(f"sqlite:///{tmp}/runs.db", args.runs, args.limit, args.repeat))
    if args.store in ("redis", "both"):
        with RedisServer() as server:
            asyncio.run(_bench(server.url, args.runs, args.limit, args.repeat))


if __name__ == "__main__":
    main()
