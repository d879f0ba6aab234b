"""The fleet's commands: ``chainrt serve``, ``chainrt submit`` and ``chainrt cancel`` (§9, §12)."""

from __future__ import annotations

import argparse
import json
import os
import sys
from typing import Any

from .._durations import parse_duration_ms
from ..errors import ChainRTError, InputError
from ._access import add_client_options, add_serve_options, auth_headers, serve_options

__all__ = ["add_commands", "cancel", "serve", "submit", "tune_gc"]

_DEFAULT_SERVER = "http://127.0.0.1:8080"
_FINAL = ("completed", "partial", "rejected", "failed", "cancelled", "waiting")
"""Where ``submit --wait`` stops waiting (``waiting``: parked until a signal, exit 4)."""


def add_commands(sub: Any) -> None:
    """Add ``serve``, ``submit`` and ``cancel`` to the ``chainrt`` parser."""
    serve_p = sub.add_parser("serve", help="run a runner: HTTP API + a share of the run queue")
    serve_p.add_argument("--host", default="127.0.0.1")
    serve_p.add_argument("--port", type=int, default=8080)
    serve_p.add_argument("--chains", default="chains", help="directory of the chains served")
    serve_p.add_argument("--store", help="store URL (default: CHAINRT_STORE)")
    serve_p.add_argument("--pool", help="worker pool YAML (default: CHAINRT_POOL)")
    serve_p.add_argument("--max-runs", type=int, default=16, help="runs executed at once")
    serve_p.add_argument(
        "--max-streams",
        type=int,
        help="event streams open at once; more are answered 429 (default: half of ulimit -n)",
    )
    serve_p.add_argument("--drain", default="10s", help="on SIGTERM, time runs get to stop")
    serve_p.add_argument(
        "--log-level",
        default="info",
        choices=["debug", "info", "warning", "error"],
        help="the server's own log lines (default info: start-up, outages, dead letters)",
    )
    serve_p.add_argument(
        "--access-log", action="store_true", help="log one line per HTTP request (off by default)"
    )
    serve_p.add_argument(
        "--max-deliveries",
        type=int,
        default=3,
        help="deliveries of a queue entry that fails for good before it is dead-lettered",
    )

    add_serve_options(serve_p)

    submit_p = sub.add_parser("submit", help="submit a run to a chainrt serve")
    submit_p.add_argument("chain", help="chain name (see GET /v1/chains)")
    submit_p.add_argument("--input", required=True, help="input as JSON, or @file.json")
    submit_p.add_argument("--run-id", help="idempotency: the same id and body is the same run")
    submit_p.add_argument("--budget", help="override the chain's budget, e.g. 8s")
    submit_p.add_argument(
        "--priority", choices=["critical", "high", "normal", "low"], default="normal"
    )
    submit_p.add_argument(
        "--server", help=f"server URL (default: CHAINRT_SERVER or {_DEFAULT_SERVER})"
    )
    submit_p.add_argument("--wait", action="store_true", help="wait until the run is final")
    submit_p.add_argument(
        "--timeout",
        default="10m",
        help="with --wait: give up after this long, saying what the run waits for (default 10m)",
    )
    submit_p.add_argument("--json", action="store_true", help="print one JSON object")
    add_client_options(submit_p)

    cancel_p = sub.add_parser(
        "cancel", help="cancel a run (on the store directly, or through --server)"
    )
    cancel_p.add_argument("run_id")
    cancel_p.add_argument("--store", help="store URL (default: CHAINRT_STORE)")
    cancel_p.add_argument("--server", help="cancel through this chainrt serve's API instead")
    add_client_options(cancel_p)
    cancel_p.add_argument("--json", action="store_true", help="print one JSON object")


def tune_gc(args: argparse.Namespace) -> None:
    """Tune the garbage collector when ``main()`` runs as the process's own command line."""
    if getattr(args, "own_process", False):
        from .._gc import tune_gc_for_runner

        tune_gc_for_runner()


async def serve(args: argparse.Namespace) -> int:
    """``chainrt serve``: serve until SIGTERM/SIGINT, then drain."""
    try:
        from ..serve import ServeConfig
        from ..serve import serve as run_server
    except ImportError as exc:
        raise ChainRTError(
            f"chainrt serve needs {exc.name}: pip install -e '.[serve]' in the chainrt repository"
        ) from None
    if args.max_runs < 1:
        raise InputError(f"--max-runs must be at least 1, got {args.max_runs}")
    if args.max_deliveries < 1:
        raise InputError(f"--max-deliveries must be at least 1, got {args.max_deliveries}")
    if args.max_streams is not None and args.max_streams < 1:
        raise InputError(f"--max-streams must be at least 1, got {args.max_streams}")
    tune_gc(args)  # after the server's imports
    config = ServeConfig(
        host=args.host,
        port=args.port,
        chains=args.chains,
        store=args.store,
        pool=args.pool,
        max_runs=args.max_runs,
        drain_s=parse_duration_ms(args.drain, what="--drain") / 1000,
        log_level=args.log_level,
        access_log=args.access_log,
        max_deliveries=args.max_deliveries,
        max_streams=args.max_streams,
        **serve_options(args),
    )
    await run_server(config)
    return 0


async def submit(args: argparse.Namespace, read_input: Any) -> int:
    """``chainrt submit``: POST /v1/runs (and with --wait, GET until final)."""
    import httpx

    server = (args.server or os.environ.get("CHAINRT_SERVER") or _DEFAULT_SERVER).rstrip("/")
    body: dict[str, Any] = {
        "chain": args.chain,
        "input": read_input(args.input),
        "priority": args.priority,
    }
    if args.run_id:
        body["run_id"] = args.run_id
    if args.budget:
        body["budget"] = args.budget
    timeout_s = parse_duration_ms(args.timeout, what="--timeout") / 1000
    try:
        headers = auth_headers(args)
        async with httpx.AsyncClient(base_url=server, timeout=30.0, headers=headers) as client:
            answer = await client.post("/v1/runs", json=body)
            payload = _payload(answer, server)
            if args.wait:
                payload = await _wait_final(client, server, payload, timeout_s)
    except httpx.HTTPError as exc:
        raise ChainRTError(f"cannot reach chainrt serve at {server}: {exc}") from None
    if args.json:
        print(json.dumps(payload, ensure_ascii=False))
    else:
        print(f"run {payload['run_id']}: {payload['status']}")
        if args.wait and payload.get("output") is not None:
            print(json.dumps(payload["output"], ensure_ascii=False, indent=2))
    if payload.get("status") in ("rejected", "failed", "cancelled"):
        reason = payload.get("error") or payload["status"]
        print(f"chainrt: run {payload['run_id']} {payload['status']}: {reason}", file=sys.stderr)
        return 1
    if payload.get("status") == "waiting":
        print(
            f"chainrt: run {payload['run_id']} waiting: {payload.get('error')}; continue it "
            f"with POST /v1/runs/{payload['run_id']}/signal or chainrt signal",
            file=sys.stderr,
        )
        return 4
    return 0


async def _wait_final(
    client: Any, server: str, payload: dict[str, Any], timeout_s: float
) -> dict[str, Any]:
    """GET the run until it is final; ChainRTError naming its status (and what it waits for,
    e.g. no live runner serving its chain) once ``timeout_s`` is up."""
    import time

    run_id = payload["run_id"]
    deadline = time.monotonic() + timeout_s
    while payload.get("status") not in _FINAL:
        left = deadline - time.monotonic()
        if left <= 0:
            waiting = payload.get("reason") or "no runner has finished it yet"
            raise ChainRTError(
                f"gave up waiting for run {run_id} after {timeout_s:g}s: it is still "
                f"{payload.get('status')} ({waiting}); it goes on in the fleet"
            )
        wait = f"{max(0.1, min(20.0, left)):.1f}s"
        answer = await client.get(f"/v1/runs/{run_id}", params={"wait": wait}, timeout=60.0)
        payload = _payload(answer, server)
    return payload


def _payload(answer: Any, server: str) -> dict[str, Any]:
    try:
        payload = answer.json()
    except ValueError:
        payload = None
    if answer.status_code >= 400 or not isinstance(payload, dict):
        error = payload.get("error", {}) if isinstance(payload, dict) else {}
        message = error.get("message") if isinstance(error, dict) else None
        text = f"{server} answered {answer.status_code}: {message or answer.text[:200]}"
        if answer.status_code in (404, 409, 422):  # the request was wrong: a usage error
            raise InputError(text)
        raise ChainRTError(text)
    return payload


async def cancel(args: argparse.Namespace) -> int:
    """``chainrt cancel``: mark the run cancelled in the store and tell its owner (with
    ``--server``: ask that server's API to)."""
    if args.server:
        return await _cancel_through(args)
    from .._settings import get_settings
    from ..runs._cancel import cancel_in_store
    from ..runs._lease import this_host
    from ..store import open_store

    settings = get_settings()
    store = open_store(args.store)
    try:
        record, did = await cancel_in_store(
            store, args.run_id, host=this_host(), ttl_s=settings.lease_ttl_s
        )
        if did and store.raw_url.split("://", 1)[0] in ("redis", "rediss"):
            from .._bus import CancelBus

            bus = CancelBus(store.raw_url)
            await bus.publish_cancel(args.run_id)
            await bus.close()
    finally:
        await store.close()
    if args.json:
        print(json.dumps({"run_id": record.run_id, "status": record.status, "cancelled": did}))
    elif did:
        print(f"run {record.run_id}: cancelled")
    else:
        print(f"run {record.run_id} had already ended: {record.status}")
    return 0


async def _cancel_through(args: argparse.Namespace) -> int:
    """``chainrt cancel --server URL``: POST /v1/runs/{id}/cancel with the API token."""
    from urllib.parse import quote

    import httpx

    server = args.server.rstrip("/")
    try:
        async with httpx.AsyncClient(
            base_url=server, timeout=30.0, headers=auth_headers(args)
        ) as client:
            path = f"/v1/runs/{quote(args.run_id, safe='')}/cancel"
            payload = _payload(await client.post(path, json={}), server)
    except httpx.HTTPError as exc:
        raise ChainRTError(f"cannot reach chainrt serve at {server}: {exc}") from None
    if args.json:
        print(json.dumps(payload, ensure_ascii=False))
    else:
        print(f"run {payload['run_id']}: {payload['status']}")
    return 0
