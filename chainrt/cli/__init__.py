"""The ``chainrt`` command line (README.md, Using it).

Errors are one line on stderr and a non-zero exit, never a traceback. Exit codes: 0 completed or
partial; 1 failed or rejected; 2 bad usage, bad input or an invalid chain; 3 store or runtime
error (a refused stored run included); 4 the run is waiting for a signal (the ``chainrt signal``
that continues it is printed); 130 stopped by SIGINT, 143 stopped by SIGTERM (the run was
checkpointed and released: ``chainrt resume`` continues it, see :mod:`._signals`); 141 stdout
closed early (``chainrt runs | head -3``: quiet, like a Unix tool ended by SIGPIPE).

Each command imports what it needs when it runs (the runtime, the store, the chain-spec models),
so ``--help`` loads none of it and ``validate`` and ``runs`` load no HTTP client or dispatcher
(``bench/cli_startup.py`` measures it; ``tests/test_imports.py`` pins it).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from .._durations import parse_budget_ms
from .._hooks import NO_HOOKS
from .._progress import NO_PROGRESS, Progress
from ..errors import (
    BudgetError,
    ChainRTError,
    InputError,
    SignalRefused,
    SpecError,
    TemplateError,
)
from . import _dlq, _service, _signal_cmd
from ._access import add_token_command, token
from ._input import read_input
from ._service import add_commands

if TYPE_CHECKING:
    from .._result import RunResult
    from .._runtime import Runtime
    from ._signals import RunWatch

__all__ = ["main"]

EXIT_OK, EXIT_RUN_FAILED, EXIT_USAGE, EXIT_RUNTIME, EXIT_INTERRUPTED = 0, 1, 2, 3, 130
EXIT_BROKEN_PIPE = 141


class _UsageError(Exception):
    pass


def _nonempty(what: str) -> Callable[[str], str]:
    """An argparse ``type`` that refuses an empty value instead of silently using the default."""

    def check(value: str) -> str:
        if not value.strip():
            raise argparse.ArgumentTypeError(
                f"{what} must not be empty (leave the option out for the default)"
            )
        return value

    return check


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> Any:  # one line, no usage dump
        raise _UsageError(f"{self.prog}: {message} (see --help)")


def _parser() -> argparse.ArgumentParser:
    from .. import __version__

    parser = _Parser(prog="chainrt", description="Run agent chains inside their latency budget.")
    parser.add_argument("--version", action="version", version=f"chainrt {__version__}")
    sub = parser.add_subparsers(dest="command", required=True, parser_class=_Parser)

    run = sub.add_parser("run", help="run a chain")
    run.add_argument("chain", help="chain YAML file")
    run.add_argument("--input", required=True, help="input as JSON, or @file.json")
    run.add_argument(
        "--run-id", type=_nonempty("--run-id"), help="use this run id (default: a new uuid)"
    )
    run.add_argument("--budget", help="override the chain's budget, e.g. 8s")
    _common(run)

    resume = sub.add_parser("resume", help="resume a run from its last checkpoint")
    resume.add_argument("run_id", type=_nonempty("the run id"))
    resume.add_argument(
        "--budget", help="give the run this much more time (default: what it had left)"
    )
    resume.add_argument(
        "--no-wait", action="store_true", help="refuse instead of waiting for a live owner's lease"
    )
    _common(resume)

    runs = sub.add_parser("runs", help="list runs")
    runs.add_argument(
        "--status",
        choices=[
            "queued",
            "running",
            "waiting",
            "completed",
            "partial",
            "rejected",
            "failed",
            "cancelled",
        ],
    )
    runs.add_argument("--limit", type=int, default=50)
    runs.add_argument(
        "--store",
        type=_nonempty("--store"),
        help="store URL (default: CHAINRT_STORE or sqlite:///.chainrt/chainrt.db)",
    )
    runs.add_argument("--json", action="store_true")

    inspect = sub.add_parser("inspect", help="show one run, its steps and attempts")
    inspect.add_argument("run_id", type=_nonempty("the run id"))
    inspect.add_argument("--store", type=_nonempty("--store"))
    inspect.add_argument("--json", action="store_true")
    inspect.add_argument(
        "--full", action="store_true", help="print every step's output whole (default: 200 chars)"
    )

    validate = sub.add_parser(
        "validate",
        help="validate chain and pool files (folders are searched recursively)",
    )
    validate.add_argument("paths", nargs="+")

    schema = sub.add_parser("schema", help="print the JSON Schema of the chain format")
    schema.add_argument(
        "--tools", metavar="CHAIN", help="print the JSON Schemas of CHAIN's agent tools instead"
    )
    add_commands(sub)  # serve, submit, cancel
    add_token_command(sub)  # token new
    _dlq.add_command(sub)  # dlq list|show|retry|drop
    _signal_cmd.add_command(sub, _common)  # signal RUN NAME --payload JSON
    return parser


def _common(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--store",
        type=_nonempty("--store"),
        help="store URL (default: CHAINRT_STORE or sqlite:///.chainrt/chainrt.db)",
    )
    parser.add_argument(
        "--pool", type=_nonempty("--pool"), help="worker pool YAML (default: CHAINRT_POOL)"
    )
    parser.add_argument("--json", action="store_true", help="print one JSON object")
    parser.add_argument("--trace", action="store_true", help="send OpenTelemetry traces (OTLP)")
    parser.add_argument(
        "--chains",
        action="append",
        metavar="DIR",
        help="a chain root: a folder whose tool files a resumed run may execute (repeatable; "
        "adds to CHAINRT_CHAIN_ROOTS, default chains/; see docs/security.md)",
    )


def _add_roots(args: argparse.Namespace) -> None:
    from ..spec import add_chain_root

    for folder in args.chains or ():
        add_chain_root(folder)


def _budget(raw: str | None) -> float | None:
    if raw is None:
        return None
    return parse_budget_ms(raw, what="--budget")


def _resume_hint(args: argparse.Namespace, result: RunResult, chain_dir: Path | None) -> str | None:
    """The ``chainrt resume`` line for ``result`` (None for a run with nothing to resume): its
    budget, the --store/--pool given, and the chain roots a new process needs (--chains given,
    plus the chain's folder when it lies outside CHAINRT_CHAIN_ROOTS and them)."""
    if result.status in ("completed", "running"):
        return None
    from .._settings import Settings
    from ..spec._roots import inside_roots, parse_chain_roots
    from ._printer import resume_command

    chains = list(args.chains or ())
    if chain_dir is not None:
        roots = [*parse_chain_roots(Settings().chain_roots), *map(Path, chains)]
        if inside_roots(chain_dir, roots) is None:
            here = chain_dir.is_relative_to(Path.cwd())
            chains.append(os.path.relpath(chain_dir) if here else str(chain_dir))
    return resume_command(
        result.run_id,
        budget_ms=result.budget.total_ms,
        store=args.store,
        pool=args.pool,
        chains=chains,
    )


def _emit(
    result: RunResult, as_json: bool, trace_url: str | None = None, resume: str | None = None
) -> int:
    from ._printer import print_result

    if as_json:
        payload = result.model_dump(mode="json")
        if trace_url:
            payload["trace_url"] = trace_url
        print(json.dumps(payload, ensure_ascii=False))
    else:
        print_result(result, sys.stdout, resume=resume)
        if trace_url:
            print(f"trace: {trace_url}")
    if result.status == "waiting":
        then = f"; continue it with: {resume}" if resume else ""
        print(f"chainrt: run {result.run_id} waiting: {result.error}{then}", file=sys.stderr)
        return _signal_cmd.EXIT_WAITING
    if not result.ok:
        print(f"chainrt: run {result.run_id} {result.status}: {result.error}", file=sys.stderr)
        return EXIT_RUN_FAILED
    return EXIT_OK


async def _trace_url(runtime: Runtime, run_id: str) -> str | None:
    """The Jaeger link of the run's trace, when tracing is on."""
    if runtime.hooks is NO_HOOKS:
        return None
    try:
        trace_id = (await runtime.store.get_run(run_id)).trace.get("trace_id")
    except ChainRTError:
        return None
    if not isinstance(trace_id, str):
        return None
    import asyncio

    # None when the trace never reached a collector: no link to a page that does not exist.
    # trace_url flushes the exporter first (bounded), so it runs off the event loop.
    return await asyncio.to_thread(runtime.hooks.trace_url, trace_id)


async def _run(args: argparse.Namespace, watch: RunWatch) -> int:
    from .._runtime import open_runtime
    from ..spec import load_spec
    from ._printer import LivePrinter

    _add_roots(args)
    loaded = load_spec(args.chain)
    inputs = read_input(args.input)
    watch.inner = NO_PROGRESS if args.json else LivePrinter()
    progress: Progress = watch
    async with open_runtime(
        store=args.store, pool=args.pool, progress=progress, trace=args.trace
    ) as runtime:
        _service.tune_gc(args)
        result = await runtime.runner.run(
            loaded.spec,
            inputs,
            source_dir=loaded.source_dir,
            run_id=args.run_id,
            budget_ms=_budget(args.budget),
        )
        trace_url = await _trace_url(runtime, result.run_id)
        waiting = await _signal_cmd.waiting_hint(runtime.store, result, args)
    return _emit(
        result, args.json, trace_url, waiting or _resume_hint(args, result, loaded.source_dir)
    )


async def _resume(args: argparse.Namespace, watch: RunWatch) -> int:
    from .._runtime import open_runtime
    from ._printer import LivePrinter

    _add_roots(args)
    watch.inner = NO_PROGRESS if args.json else LivePrinter()
    progress: Progress = watch
    async with open_runtime(
        store=args.store, pool=args.pool, progress=progress, trace=args.trace
    ) as runtime:
        _service.tune_gc(args)
        result = await runtime.runner.resume(
            args.run_id, budget_ms=_budget(args.budget), wait=not args.no_wait
        )
        trace_url = await _trace_url(runtime, result.run_id)
        chain_dir = None if result.ok else await _chain_dir(runtime, result.run_id)
        waiting = await _signal_cmd.waiting_hint(runtime.store, result, args)
    return _emit(result, args.json, trace_url, waiting or _resume_hint(args, result, chain_dir))


async def _chain_dir(runtime: Runtime, run_id: str) -> Path | None:
    """The folder a stored run's chain came from (None when unknown or unreadable)."""
    try:
        source = (await runtime.store.get_run(run_id)).source
    except ChainRTError:
        return None
    return Path(source) if source else None


async def _runs(args: argparse.Namespace) -> int:
    from ..store import open_store
    from ._printer import print_runs

    # None: CHAINRT_STORE or the embedded default. Read-only: a file this user may not write
    # (or one that does not exist yet) lists fine, and nothing is created or purged.
    store = open_store(args.store, read_only=True)
    try:
        runs = await store.list_runs(status=args.status, limit=max(1, args.limit))
    finally:
        await store.close()
    if args.json:
        print(json.dumps([_run_summary(r) for r in runs]))
    else:
        print_runs(runs, sys.stdout)
    return EXIT_OK


async def _inspect(args: argparse.Namespace) -> int:
    from .._result import RunResult
    from .._settings import get_settings
    from ..store import open_store
    from ._printer import print_inspect

    settings = get_settings()
    store = open_store(args.store, read_only=True)
    try:
        run = await store.get_run(args.run_id)
        steps = await store.get_steps(args.run_id)
    finally:
        await store.close()
    trace_id = run.trace.get("trace_id")
    trace_url = (
        f"{settings.jaeger_url.rstrip('/')}/trace/{trace_id}" if isinstance(trace_id, str) else None
    )
    if args.json:
        payload = RunResult.from_records(run, steps).model_dump(mode="json")
        payload["trace_url"] = trace_url
        payload["waits_ms"] = run.waits_ms
        payload["records"] = {k: v.model_dump(mode="json", by_alias=True) for k, v in steps.items()}
        print(json.dumps(payload, ensure_ascii=False))
    else:
        print_inspect(run, steps, trace_url, sys.stdout, full=args.full)
    return EXIT_OK


def _run_summary(run: Any) -> dict[str, Any]:
    """A ``chainrt runs --json`` row: the API's list row (``reason``: the run's error, e.g. why
    a refused or dead-lettered run failed; the store alone cannot tell which chains are served)."""
    return {
        "run_id": run.run_id,
        "chain": run.chain,
        "status": run.status,
        "budget": {"total_ms": run.budget_total_ms, "used_ms": run.budget_used_ms},
        "created_at": run.created_at,
        "updated_at": run.updated_at,
        "reason": run.error,
    }


def _validate_command(args: argparse.Namespace) -> int:
    from ._validate import validate

    report = validate(args.paths)
    for error in report.errors:
        print(str(error), file=sys.stderr)
    if report.errors:
        return EXIT_USAGE
    print(report.summary())
    return EXIT_OK


def _log_to_stderr() -> None:
    """chainrt's own log lines (e.g. "traces not exported") as ``chainrt: message`` on stderr."""
    import logging

    logger = logging.getLogger("chainrt")
    if not logger.handlers and not logging.getLogger().handlers:  # an embedder's config wins
        handler = logging.StreamHandler(sys.stderr)
        handler.setFormatter(logging.Formatter("chainrt: %(message)s"))
        logger.addHandler(handler)  # level stays WARNING (the root's), propagation unchanged


def _drop_stdout() -> None:
    """The reader of stdout went away: send what is left to /dev/null so exit stays quiet."""
    import os

    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        os.close(devnull)
    except (OSError, ValueError):  # no real stdout (embedded): nothing will be flushed to it
        pass


def _run_stoppable(args: argparse.Namespace) -> int:
    """``run`` or ``resume`` with SIGINT and SIGTERM stopping the run cleanly (one line, 130/143)."""
    import asyncio

    from ._signals import RunWatch, Stopped, stoppable, stopped_message

    watch = RunWatch(NO_PROGRESS)
    handler = _run if args.command == "run" else _resume
    try:
        code: int = asyncio.run(stoppable(handler(args, watch)))
    except Stopped as stop:
        run_id = args.run_id if args.command == "resume" else None
        print(stopped_message(stop, watch, args.command, run_id), file=sys.stderr)
        return stop.exit_code
    return code


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the ``chainrt`` console script; returns the exit code.

    Called without ``argv`` (the console script, ``python -m chainrt``) it owns the process:
    ``run``, ``resume`` and ``serve`` then tune its garbage collector (``chainrt/_gc.py``,
    ``CHAINRT_GC_TUNING``). Called with ``argv`` (a test, an embedding) it leaves it alone.
    """
    _log_to_stderr()
    try:
        args = _parser().parse_args(argv)
        args.own_process = argv is None  # the command line's own process, not an embedding
        if args.command == "schema" and args.tools:
            from ._tools_schema import print_tool_schemas

            status = print_tool_schemas(args.tools)
            sys.stdout.flush()
            return status
        if args.command == "schema":
            from ..spec import chain_json_schema

            print(json.dumps(chain_json_schema(), indent=2))
            sys.stdout.flush()
            return EXIT_OK
        if args.command == "validate":
            status = _validate_command(args)
            sys.stdout.flush()
            return status
        import asyncio  # here, not at the top: --help, validate and schema never need it

        if args.command in ("run", "resume"):
            code = _run_stoppable(args)
        else:
            handler = {
                "runs": _runs,
                "inspect": _inspect,
                "serve": _service.serve,
                "submit": lambda a: _service.submit(a, read_input),
                "cancel": _service.cancel,
                "dlq": _dlq.dlq,
                "signal": lambda a: _signal_cmd.signal(
                    a, lambda result, as_json, hint: _emit(result, as_json, None, hint)
                ),
                "token": token,
            }[args.command]
            code = asyncio.run(handler(args))
        sys.stdout.flush()  # here, where a closed pipe is still caught below
        return code
    except BrokenPipeError:
        _drop_stdout()
        return EXIT_BROKEN_PIPE
    except _UsageError as exc:
        print(str(exc), file=sys.stderr)
        return EXIT_USAGE
    except (SpecError, InputError, BudgetError, TemplateError, SignalRefused) as exc:
        print(f"chainrt: {exc}", file=sys.stderr)
        return EXIT_USAGE
    except ChainRTError as exc:
        print(f"chainrt: {exc}", file=sys.stderr)
        return EXIT_RUNTIME
    except KeyboardInterrupt:  # outside a run: nothing was started or held
        print("chainrt: interrupted", file=sys.stderr)
        return EXIT_INTERRUPTED
    except SystemExit as exc:  # --help and --version
        return int(exc.code or 0) if not isinstance(exc.code, str) else EXIT_USAGE
    except Exception as exc:  # last line of defence: one line, never a traceback
        print(f"chainrt: internal error: {type(exc).__name__}: {exc}", file=sys.stderr)
        return EXIT_RUNTIME


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
