"""``chainrt-worker serve``: one process serving one model engine over an OpenAI-compatible API.

    chainrt-worker serve --engine local --port 8001
    chainrt-worker serve --engine vllm --model /models/qwen3-8b --uds /run/chainrt/w1.sock
    chainrt-worker serve --engine local --port 8001 --enable-fault-injection   # tests, drills
    chainrt-worker doctor [--json]       # driver / CUDA / torch / vLLM: a known-bad combination?

Engines are imported only when chosen: ``--engine local`` never imports vLLM or torch.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import os
import stat
import sys
from collections.abc import Sequence
from typing import TYPE_CHECKING

from pydantic import ValidationError

from chainrt.engines import ENGINES, Engine, create_engine, engine_class
from chainrt.errors import WorkerError

if TYPE_CHECKING:
    from workers.server import RequestObserver

__all__ = ["build_parser", "check_uds_path", "main", "make_engine", "option_error"]

_DEFAULT_SLOTS = {"local": 1, "vllm": 16, "torch": 4}
"""Concurrent requests inside each kind of engine unless ``--slots`` says otherwise: llama.cpp
runs one request at a time, vLLM batches."""


def build_parser() -> argparse.ArgumentParser:
    """The argument parser (exposed for tests and docs)."""
    from chainrt import __version__

    parser = argparse.ArgumentParser(prog="chainrt-worker", description=__doc__.split("\n")[0])
    parser.add_argument("--version", action="version", version=f"chainrt-worker {__version__}")
    commands = parser.add_subparsers(dest="command", required=True)
    serve = commands.add_parser("serve", help="serve one engine over HTTP")
    serve.add_argument("--engine", choices=sorted(ENGINES), required=True)
    serve.add_argument("--model", help="model to load: GGUF file (local), HF dir or id (vllm)")
    serve.add_argument(
        "--served-model-name",
        action="append",
        dest="served_model_names",
        metavar="NAME",
        help="a model name clients use (repeatable; default: the engine's own name)",
    )
    where = serve.add_mutually_exclusive_group(required=True)
    where.add_argument("--port", type=int, help="TCP port to listen on")
    where.add_argument("--uds", metavar="PATH", help="Unix socket to listen on")
    serve.add_argument("--host", default="127.0.0.1", help="address to bind (default 127.0.0.1)")
    serve.add_argument("--max-model-len", type=int, help="context window in tokens")
    serve.add_argument("--watermark", type=float, default=0.85, help="KV memory share (0.85)")
    serve.add_argument("--slots", type=int, help="requests inside the engine at once")
    serve.add_argument("--max-waiting", type=int, default=256, help="queue bound (256)")
    serve.add_argument("--max-body-bytes", type=int, default=1 << 20, help="body limit (1 MiB)")
    serve.add_argument("--health-interval", type=float, default=15.0, help="seconds (15)")
    serve.add_argument(
        "--recovery-wait",
        type=float,
        default=2.0,
        help="seconds a request waits for an engine recovery before 503, within its deadline (2)",
    )
    serve.add_argument(
        "--enable-fault-injection",
        action="store_true",
        help="serve POST /admin/faults (tests and drills only; never in production)",
    )
    serve.add_argument(
        "--admin-token",
        metavar="TOKEN",
        help="serve POST /admin/reload for callers sending this bearer token "
        "(default: $CHAINRT_ADMIN_TOKEN; neither: no admin routes)",
    )
    serve.add_argument(
        "--vllm-standby",
        action=argparse.BooleanOptionalAction,
        default=False,
        help="vllm: keep a warm standby engine core for recovery and reload (default off: it "
        "doubles the engine's memory)",
    )
    serve.add_argument(
        "--dtype",
        choices=["auto", "bfloat16", "float16", "float32"],
        default="auto",
        help="vllm/torch: weights and KV dtype (auto: float32 on a CPU, bfloat16 on a GPU)",
    )
    serve.add_argument("--log-level", default="info", choices=["debug", "info", "warning"])
    serve.add_argument("--access-log", action="store_true", help="log every request")
    doctor = commands.add_parser(
        "doctor", help="check the driver / CUDA / torch / vLLM versions against known-bad ones"
    )
    doctor.add_argument("--json", action="store_true", help="print one JSON object")
    return parser


def make_engine(
    kind: str,
    model: str | None = None,
    *,
    served_model_name: str | None = None,
    max_model_len: int | None = None,
    standby: bool = False,
    dtype: str = "auto",
) -> Engine:
    """Create (not start) an engine of ``kind``, importing only that engine's module.

    ``standby`` (vllm only) keeps a warm standby engine core. ``dtype`` (vllm, torch): ``auto``
    is float32 on a CPU and bfloat16 on a GPU.
    """
    if standby and kind != "vllm":
        raise WorkerError(f"--vllm-standby applies to --engine vllm only, not {kind}")
    if dtype != "auto" and kind == "local":
        raise WorkerError("--dtype applies to --engine vllm or torch; a GGUF fixes its own types")
    try:
        engine_class(kind)  # the import alone, so that a missing extra is one clear line
    except ImportError as exc:
        raise WorkerError(
            f"the {kind} engine cannot be imported ({exc}); install its extra "
            f"(pip install -e '.[{kind}]' in the chainrt repository) or run scripts/setup"
        ) from exc
    return create_engine(
        kind,
        model,
        model_name=served_model_name,
        max_model_len=max_model_len,
        standby=standby,
        dtype=dtype,
    )


def _tracing_observer(engine: str) -> RequestObserver | None:
    """The worker's tracing observer when ``OTEL_*`` turn tracing on (None: tracing off)."""
    try:
        from workers.server._tracing import observer_from_env
    except ImportError:  # the otel extra is not installed: no tracing
        return None
    return observer_from_env(engine)


def check_uds_path(path: str) -> None:
    """Refuse a Unix socket path the worker could not bind, before any model is loaded."""
    folder = os.path.dirname(os.path.abspath(path))
    if not os.path.isdir(folder):
        raise WorkerError(
            f"--uds {path}: folder {folder} does not exist (create it first, e.g. mkdir -p {folder})"
        )
    if not os.access(folder, os.W_OK | os.X_OK):
        raise WorkerError(f"--uds {path}: folder {folder} is not writable by this user")
    if os.path.lexists(path) and not stat.S_ISSOCK(os.lstat(path).st_mode):
        raise WorkerError(f"--uds {path}: a file that is not a socket is already there")


_FLAGS = {
    "served_model_names": "--served-model-name",
    "health_interval_s": "--health-interval",
    "recovery_wait_s": "--recovery-wait",
    "admin_token": "--admin-token",
}


def option_error(exc: ValidationError) -> str:
    """One line for the first problem in the worker's options: the flag it came from (when the
    problem has one; a check across options has none) and what is wrong."""
    errors = exc.errors(include_url=False)
    if not errors:
        return "bad options"
    first = errors[0]
    message = str(first.get("msg", "invalid")).removeprefix("Value error, ")
    loc = first.get("loc") or ()
    if not loc:
        return f"bad options: {message}"
    name = str(loc[0])
    flag = _FLAGS.get(name, "--" + name.replace("_", "-"))
    return f"bad option {flag}: {message}"


async def _serve(args: argparse.Namespace) -> int:
    import uvicorn

    from workers.server import WorkerConfig, create_app

    try:
        config = WorkerConfig(
            served_model_names=args.served_model_names or [],
            watermark=args.watermark,
            slots=args.slots or _DEFAULT_SLOTS[args.engine],
            max_waiting=args.max_waiting,
            max_body_bytes=args.max_body_bytes,
            enable_fault_injection=args.enable_fault_injection,
            health_interval_s=args.health_interval,
            recovery_wait_s=args.recovery_wait,
            admin_token=args.admin_token or os.environ.get("CHAINRT_ADMIN_TOKEN") or None,
        )
    except ValidationError as exc:
        raise WorkerError(option_error(exc)) from None
    engine = make_engine(
        args.engine,
        args.model,
        served_model_name=(args.served_model_names or [None])[0],
        max_model_len=args.max_model_len,
        standby=args.vllm_standby,
        dtype=args.dtype,
    )
    await engine.start()  # here, so a model that cannot load is one clear line, not a traceback

    def reload_engine(model: str | None, name: str | None) -> Engine:
        return make_engine(
            args.engine,
            model,
            served_model_name=name,
            max_model_len=args.max_model_len,
            standby=args.vllm_standby,
            dtype=args.dtype,
        )

    app = create_app(
        engine,
        config,
        observer=_tracing_observer(engine.name),
        engine_factory=reload_engine,
        model=args.model,
    )
    server = uvicorn.Server(
        uvicorn.Config(
            app,
            host=args.host,
            port=args.port or 0,
            uds=args.uds,
            log_level=args.log_level,
            access_log=args.access_log,
            lifespan="on",
            timeout_graceful_shutdown=10,
        )
    )
    await server.serve()
    return 0 if server.started else 1


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of ``chainrt-worker``; returns the exit code."""
    args = build_parser().parse_args(argv)
    if args.command == "doctor":
        from workers.doctor import run

        return run(as_json=args.json)
    logging.basicConfig(
        level=args.log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s"
    )
    try:
        if args.uds:
            check_uds_path(args.uds)
        loop_factory = None
        try:
            import uvloop  # faster HTTP when present (uvicorn[standard] brings it)

            loop_factory = uvloop.new_event_loop
        except ImportError:
            pass
        with asyncio.Runner(loop_factory=loop_factory) as runner:
            return runner.run(_serve(args))
    except WorkerError as exc:
        print(f"chainrt-worker: {exc.message}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main())
