"""``chainrt signal RUN_ID NAME --payload JSON``: the signal that continues a waiting run.

It works on the store directly, like ``chainrt cancel``: the payload is checked against the
wait's schema and kept (a bad one is refused, exit 2, and the run keeps waiting); when the run
was parked at that wait, it continues in this process (``--no-resume``: only keep the signal,
for a run that ``chainrt serve`` or another process continues). The exit code is the run's, as
for ``chainrt run``: 0 completed or partial, 4 waiting (at its next wait), 1 failed. With
``--server URL`` it asks that ``chainrt serve`` instead (``POST /v1/runs/{id}/signal``, scope
``operate``): the server keeps it and queues the run for its runners; exit 0 once accepted.
"""

from __future__ import annotations

import argparse
import json
import shlex
from typing import TYPE_CHECKING, Any

from ._access import add_client_options

if TYPE_CHECKING:
    from .._result import RunResult
    from ..spec._wait import WaitSpec
    from ..store import CheckpointStore

__all__ = ["EXIT_WAITING", "add_command", "signal_command", "waiting_hint"]

EXIT_WAITING = 4
"""The exit code of ``run``, ``resume`` and ``signal`` when the run is parked at a wait."""


def add_command(sub: Any, common: Any) -> None:
    """Add ``signal`` to the CLI's subcommands (``common``: adds --store, --pool, --json ...)."""
    parser = sub.add_parser(
        "signal",
        help="send a signal to a run (continues a run waiting for it)",
        description="Keep signal NAME for run RUN_ID (checked against the wait's schema); a "
        "run waiting for it continues here unless --no-resume.",
    )
    parser.add_argument("run_id")
    parser.add_argument("name", help="the signal's name (the wait's `signal:`)")
    parser.add_argument(
        "--payload", default="null", help="the payload as JSON, or @file.json (default: null)"
    )
    parser.add_argument(
        "--no-resume",
        action="store_true",
        help="only keep the signal; do not continue the run in this process",
    )
    parser.add_argument(
        "--server", help="send it through this chainrt serve's API instead (it continues the run)"
    )
    common(parser)
    add_client_options(parser)


def read_payload(raw: str) -> Any:
    """The ``--payload`` value: JSON text, or ``@path`` of a JSON file (InputError if not)."""
    from pathlib import Path

    from ..errors import InputError

    text = raw
    if raw.startswith("@"):
        try:
            text = Path(raw[1:]).read_text(encoding="utf-8")
        except OSError as exc:
            raise InputError(f"--payload: cannot read {raw[1:]!r}: {exc.strerror}") from None
    try:
        return json.loads(text)
    except ValueError as exc:
        raise InputError(f"--payload is not JSON: {exc}") from None


def signal_command(
    run_id: str, wait: WaitSpec, *, store: str | None, pool: str | None, chains: list[str]
) -> str:
    """The ``chainrt signal`` line that continues run ``run_id``, parked at ``wait``."""
    from ..runs._signals import example_payload

    payload = json.dumps(example_payload(wait), separators=(",", ":"))
    words = ["chainrt", "signal", run_id, wait.signal, "--payload", payload]
    if store:
        words += ["--store", store]
    if pool:
        words += ["--pool", pool]
    for folder in chains:
        words += ["--chains", folder]
    return shlex.join(words)


async def waiting_hint(
    store: CheckpointStore, result: RunResult, args: argparse.Namespace
) -> str | None:
    """For a run that ended ``waiting``: the command that continues it, else None."""
    from .._errors import ChainRTError
    from ..runs._signals import parked_wait

    if result.status != "waiting":
        return None
    try:
        record = await store.get_run(result.run_id)
        wait = await parked_wait(store, record)
    except ChainRTError:
        return None
    if wait is None:
        return None
    return signal_command(
        result.run_id,
        wait,
        store=args.store,
        pool=getattr(args, "pool", None),
        chains=_chains(args, record.source),
    )


def _chains(args: argparse.Namespace, source: str | None) -> list[str]:
    """The --chains a new process needs to continue the run: those given, and the chain's
    folder when it lies outside CHAINRT_CHAIN_ROOTS and them (as ``resume with:`` says)."""
    import os
    from pathlib import Path

    from .._settings import Settings
    from ..spec._roots import inside_roots, parse_chain_roots

    chains = list(args.chains or ())
    if source:
        folder = Path(source)
        roots = [*parse_chain_roots(Settings().chain_roots), *map(Path, chains)]
        if inside_roots(folder, roots) is None:
            here = folder.is_relative_to(Path.cwd())
            chains.append(os.path.relpath(folder) if here else str(folder))
    return chains


async def signal(args: argparse.Namespace, emit: Any) -> int:
    """Run ``chainrt signal``; ``emit(result, as_json, hint)`` prints the run as ``run`` does."""
    from .._runtime import open_runtime
    from ..spec import add_chain_root
    from ._printer import LivePrinter

    payload = read_payload(args.payload)
    if args.server:
        return await _through_server(args, payload)
    for folder in args.chains or ():
        add_chain_root(folder)
    progress = LivePrinter() if not args.json else None
    options: dict[str, Any] = {"store": args.store, "pool": args.pool, "trace": args.trace}
    if progress is not None:
        options["progress"] = progress
    async with open_runtime(**options) as runtime:
        result = await runtime.signal(args.run_id, args.name, payload, resume=not args.no_resume)
        hint = await waiting_hint(runtime.store, result, args)
    code: int = emit(result, args.json, hint)
    return code


async def _through_server(args: argparse.Namespace, payload: Any) -> int:
    """``chainrt signal --server URL``: POST /v1/runs/{id}/signal with the API token."""
    import sys
    from urllib.parse import quote

    import httpx

    from .._errors import ChainRTError
    from ._access import auth_headers
    from ._service import _payload

    server = args.server.rstrip("/")
    body = {"name": args.name, "payload": payload}
    try:
        async with httpx.AsyncClient(
            base_url=server, timeout=30.0, headers=auth_headers(args)
        ) as client:
            path = f"/v1/runs/{quote(args.run_id, safe='')}/signal"
            answer = _payload(await client.post(path, json=body), server)
    except httpx.HTTPError as exc:
        raise ChainRTError(f"cannot reach chainrt serve at {server}: {exc}") from None
    if args.json:
        print(json.dumps(answer, ensure_ascii=False))
    else:
        then = "queued for a runner" if answer.get("queued") else f"run is {answer.get('status')}"
        print(f"run {answer['run_id']}: signal {answer['signal']} kept; {then}", file=sys.stdout)
    return 0
