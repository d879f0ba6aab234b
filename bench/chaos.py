"""The crash drill, many times: runners killed with ``kill -9`` at random moments, runs resumed.

    .venv/bin/python bench/chaos.py [--runs 1000] [--store redis://...] [--jobs 2]
        [--chain straight|flow] [--cli-every 0] [--lease-ttl 10] [--foreign-hosts] [--seed N]

Each run is the 60-step drill chain (tests/data/drill/chain.yaml) on the store (``--chain flow``:
tests/data/drill/flow.yaml, a switch whose branch the seed picks, parallel groups joined on all
and on any, a map; then inner steps are judged by their paths and the switch's recorded choice
must never change); its runner process is killed after a random delay, resumed by a new
process (killed too, at times) until
the run completes; then the run is verified (see chainrt.testing.drill). Prints the counts: runs,
kills, resumes, completed, wrong outputs, steps re-run after their record was written, the most
runs of one step, and every problem found. Without --store it starts a private redis-server
(AOF with fsync every second, as docker-compose runs it; ``--no-persistence`` turns that off).
Exit status 1 if any run broke an invariant.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from _redis import add_persistence_flag

from chainrt.store import redact_url
from chainrt.testing.drill import Drill, DrillOptions, DrillStats

DRILL = Path(__file__).resolve().parent.parent / "tests" / "data" / "drill"
CHAINS = {"straight": DRILL / "chain.yaml", "flow": DRILL / "flow.yaml"}


_LOCK = threading.Lock()  # guards the shared DrillStats


def _worker(
    job: int, runs: int, options: DrillOptions, args: argparse.Namespace, total: DrillStats
) -> None:
    """One drill thread: its own fork server and store connection, ``runs`` runs."""
    with Drill(options, seed=args.seed * 1000 + job) as drill:
        for i in range(runs):
            cli = args.cli_every > 0 and (i * args.jobs + job) % args.cli_every == 0
            report = drill.run_one(cli=cli)
            with _LOCK:
                total.add(report)
                if total.runs % 100 == 0:
                    print(f"... {total.runs} runs, {len(total.problems)} problems", file=sys.stderr)


def _drill(store_url: str, args: argparse.Namespace, log_dir: Path) -> DrillStats:
    options = DrillOptions(
        chain=CHAINS[args.chain],
        flow=args.chain == "flow",
        store_url=store_url,
        log_dir=log_dir,
        lease_ttl_s=args.lease_ttl,
        foreign_hosts=args.foreign_hosts,
        max_kills=args.max_kills,
        resume_kill_chance=args.resume_kill_chance,
    )
    total = DrillStats()
    shares = [args.runs // args.jobs + (j < args.runs % args.jobs) for j in range(args.jobs)]
    threads = [
        threading.Thread(target=_worker, args=(j, n, options, args, total))
        for j, n in enumerate(shares)
    ]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    return total


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--runs", type=int, default=1000)
    parser.add_argument(
        "--chain",
        choices=sorted(CHAINS),
        default="straight",
        help="straight: 60 steps in a row; flow: a switch, parallel groups (join all, any), a map",
    )
    parser.add_argument("--store", help="store URL (default: a private redis-server)")
    parser.add_argument("--jobs", type=int, default=2, help="runs drilled in parallel")
    parser.add_argument(
        "--cli-every", type=int, default=0, help="every Nth run uses the real CLI (0: none)"
    )
    parser.add_argument("--lease-ttl", type=float, default=10.0, help="CHAINRT_LEASE_TTL_S")
    parser.add_argument(
        "--foreign-hosts",
        action="store_true",
        help="each process poses as another host: takeovers wait for lease expiry",
    )
    parser.add_argument("--max-kills", type=int, default=6)
    parser.add_argument("--resume-kill-chance", type=float, default=0.5)
    parser.add_argument("--seed", type=int, default=int(time.time()))
    add_persistence_flag(parser)
    args = parser.parse_args()
    started = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="chainrt-chaos-") as tmp:
        if args.store is None:
            from _redis import persistence_label, private_server

            print(f"private redis-server, {persistence_label(args)}", flush=True)
            with private_server(args) as server:
                stats = _drill(server.url, args, Path(tmp))
                store = server.url
        else:
            stats = _drill(args.store, args, Path(tmp))
            store = args.store
    elapsed = time.perf_counter() - started
    print(f"store                      {redact_url(store)}")
    print(
        f"seed                       {args.seed} ({args.chain} chain, jobs {args.jobs}, "
        f"lease TTL {args.lease_ttl:g}s"
        f"{', foreign hosts' if args.foreign_hosts else ''})"
    )
    print("\n".join(stats.lines()))
    print(f"elapsed                    {elapsed:.1f}s ({stats.runs / elapsed:.1f} runs/s)")
    for problem in stats.problems[:50]:
        print(f"  {problem}")
    return 0 if stats.ok else 1


if __name__ == "__main__":
    sys.exit(main())
