"""A real CUDA out-of-memory error fails one request, and the torch engine is ready again fast.

    python bench/gpu_oom.py --random-model            # on a GPU host: nothing to carry
    python bench/gpu_oom.py --model DIR               # an HF model directory (e.g. SmolLM2's)
    python bench/gpu_oom.py --random-model --dry-run  # anywhere: CPU, injected OOM (no ballast)

What it does, per episode (default 5): small requests keep running concurrently in a loop; GPU
memory has been filled with ballast tensors until only ``--margin-mb`` is free; one request whose
prompt cannot fit (its KV cache alone needs ~3x the free memory) is sent and must fail with
``EngineOOM`` from a *real* ``torch.OutOfMemoryError``; the engine's ``recover()`` (empty the
cache + a verifying one-token generation) then makes it ready again. It prints whether the OOM
was caught, how many small requests succeeded/failed during the episodes, and the time from
the OOM (the moment the engine caught it) to ready again, p50 over the episodes.

That figure is **engine-level**: the torch engine's in-process ``recover()`` on this model, with
no HTTP server in front. The published figures (2.3 s for a hardened service, 47 s for a
restarted stock vLLM) are service-level — time until the service answers again over HTTP — so
they are printed as context, not as a comparison; the worker's HTTP readiness after an OOM is
for ``bench/gpu_worker.py`` to measure. With ``--random-model`` the model is a small random-weight
Llama, not a production model. ``--dry-run`` injects the OOM on the CPU: its figures say the code
path works, nothing about a GPU, and they are labelled so (no published figures beside them).

Needs torch + transformers only (no pydantic, no vLLM): a GPU host may have nothing else.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import sys
import tempfile
import time
import types
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
PUBLISHED = {"hardened service": 2.3, "restarted stock vLLM": 47.0}
GOAL_S = 0.5
DRY_DEVICE = "cpu (dry run)"
CHATML = (
    "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n"
    "{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)


def import_engine() -> types.SimpleNamespace:
    """TorchEngine, GenerationRequest, EngineOOM and ContextLengthExceeded, without pydantic.

    ``chainrt/__init__`` and ``chainrt/engines/__init__`` import pydantic-based modules; where
    pydantic is missing (a bare GPU host) those packages are registered bare, so that only the
    stdlib-only modules the torch engine needs are loaded.
    """
    if str(ROOT) not in sys.path:
        sys.path.insert(0, str(ROOT))
    try:
        import pydantic  # noqa: F401
    except ImportError:
        for name, folder in (
            ("chainrt", "chainrt"),
            ("chainrt.engines", "chainrt/engines"),
        ):
            if name not in sys.modules:
                package = types.ModuleType(name)
                package.__path__ = [str(ROOT / folder)]
                sys.modules[name] = package
    from chainrt._errors import EngineOOM
    from chainrt.engines._base import ContextLengthExceeded, GenerationRequest
    from chainrt.engines._torch import TorchEngine

    return types.SimpleNamespace(
        TorchEngine=TorchEngine,
        GenerationRequest=GenerationRequest,
        EngineOOM=EngineOOM,
        ContextLengthExceeded=ContextLengthExceeded,
    )


def build_random_model(folder: Path, *, layers: int = 8, hidden: int = 512) -> Path:
    """A random-weights Llama with a byte-level tokenizer, saved as an HF directory.

    Big context (128k positions) and 16 KiB of KV per token (bf16), so one long prompt can
    need more memory than is left while short requests need almost none.
    """
    import torch
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

    alphabet = sorted(pre_tokenizers.ByteLevel.alphabet())
    backend = Tokenizer(models.BPE(vocab={ch: i for i, ch in enumerate(alphabet)}, merges=[]))
    backend.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
    backend.decoder = decoders.ByteLevel()
    # Any: transformers leaves these constructors untyped.
    fast_tokenizer: Any = PreTrainedTokenizerFast
    llama: Any = LlamaForCausalLM
    tokenizer = fast_tokenizer(
        tokenizer_object=backend,
        bos_token="<|im_start|>",
        eos_token="<|im_end|>",
        pad_token="<|im_end|>",
    )
    tokenizer.chat_template = CHATML
    config = LlamaConfig(
        vocab_size=len(tokenizer),
        hidden_size=hidden,
        intermediate_size=hidden * 3,
        num_hidden_layers=layers,
        num_attention_heads=hidden // 128,
        num_key_value_heads=hidden // 128,
        head_dim=128,
        max_position_embeddings=131072,
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
        tie_word_embeddings=True,
    )
    torch.manual_seed(0)
    model = llama(config).to(torch.bfloat16)
    model.save_pretrained(str(folder))
    tokenizer.save_pretrained(str(folder))
    return folder


@dataclass
class Episode:
    """One OOM episode."""

    oom_caught: bool
    error: str
    big_prompt_tokens: int
    recovery_s: float
    """From the moment the engine caught the OOM to recover() returning (ready again)."""
    error_delivered_s: float
    """From the OOM to the failed request's caller getting EngineOOM (its memory freed)."""
    small_ok: int
    small_failed: int
    allocated_delta_mb: float


@dataclass
class Report:
    """What the bench prints (and writes with --json)."""

    device: str
    model: str
    mode: str
    ballast_gib: float
    free_after_ballast_mb: float
    episodes: list[Episode] = field(default_factory=list)

    def summary(self) -> dict[str, Any]:
        """The headline figures."""
        times = [e.recovery_s for e in self.episodes if e.oom_caught]
        return {
            "level": "engine (in-process recover(), no HTTP)",
            "dry_run": self.device == DRY_DEVICE,
            "oom_caught": f"{sum(e.oom_caught for e in self.episodes)}/{len(self.episodes)}",
            "small_ok": sum(e.small_ok for e in self.episodes),
            "small_failed": sum(e.small_failed for e in self.episodes),
            "recovery_p50_s": round(statistics.median(times), 4) if times else None,
            "recovery_max_s": round(max(times), 4) if times else None,
        }


def fill_ballast(torch: Any, device: str, margin: int) -> list[Any]:
    """Allocate tensors until the device has about ``margin`` bytes free; returns them."""
    ballast = []
    chunk = 1 << 30
    while chunk >= 1 << 20:
        free, _total = torch.cuda.mem_get_info(device)
        if free - chunk < margin:
            chunk //= 2
            continue
        ballast.append(torch.empty(chunk, dtype=torch.uint8, device=device))
    return ballast


@dataclass
class Traffic:
    """Shared state of the small-request loops."""

    stop: asyncio.Event = field(default_factory=asyncio.Event)
    gate: asyncio.Event = field(default_factory=asyncio.Event)
    """Open: loops send requests. Closed: they park (only the dry run closes it)."""
    parked: int = 0
    ok: int = 0
    failed: int = 0


async def small_traffic(engine: Any, request_cls: Any, traffic: Traffic) -> None:
    """Send short requests back to back until ``traffic.stop``, counting ok/failed."""
    i = 0
    while not traffic.stop.is_set():
        if not traffic.gate.is_set():
            traffic.parked += 1
            await traffic.gate.wait()
            traffic.parked -= 1
        i += 1
        try:
            await engine.generate(request_cls(prompt=f"Small request {i}:", max_tokens=8))
            traffic.ok += 1
        except Exception as exc:
            traffic.failed += 1
            print(f"  small request failed: {type(exc).__name__}: {exc}", flush=True)


async def run(args: argparse.Namespace) -> Report:
    """Run the episodes and return the report."""
    import torch

    api = import_engine()
    dry = args.dry_run
    if not dry and not torch.cuda.is_available():
        raise SystemExit("no CUDA device: run on a GPU host, or pass --dry-run (CPU, injected OOM)")
    device = "cpu" if dry else "cuda"
    with tempfile.TemporaryDirectory() as scratch:
        model_dir: Path | None
        if args.random_model:
            model_dir = build_random_model(Path(scratch) / "random-llama")
            label = "random Llama (8 layers, hidden 512, 16 KiB KV/token)"
        else:
            model_dir = None if args.model is None else Path(args.model)
            label = str(model_dir or "SmolLM2-135M-Instruct (HF cache)")
        engine = api.TorchEngine(model_dir, device=device, max_model_len=args.max_model_len)
        await engine.start()
        try:
            return await run_episodes(api, engine, torch, label, args)
        finally:
            await engine.close()


async def run_episodes(
    api: types.SimpleNamespace, engine: Any, torch: Any, label: str, args: argparse.Namespace
) -> Report:
    """Warm up, fill the GPU, run the episodes; the ballast is freed on the way out."""
    dry = args.dry_run
    for _ in range(3):  # warm-up: kernels, cuBLAS workspaces, allocator pools
        await engine.generate(api.GenerationRequest(prompt="Warm up the engine.", max_tokens=8))
    stats = engine.memory()
    per_token = stats.kv_bytes_per_token
    context = engine.context_tokens
    ballast: list[Any] = []
    if dry:
        free_after = float(stats.free_bytes)
        big_tokens = min(context - 1, 512)
    else:
        big_tokens = context - 1
        margin = min(args.margin_mb << 20, big_tokens * per_token // 3)
        ballast = fill_ballast(torch, engine.device, margin)
        free_after = float(torch.cuda.mem_get_info(engine.device)[0])
    report = Report(
        device=torch.cuda.get_device_name(0) if not dry else DRY_DEVICE,
        model=label,
        mode="injected OOM through the real OOM path (dry run)" if dry else "real CUDA OOM",
        ballast_gib=round(sum(b.numel() for b in ballast) / 2**30, 2),
        free_after_ballast_mb=round(free_after / 2**20, 1),
    )
    print(
        f"gpu_oom: device={report.device} model={label} ballast={report.ballast_gib} GiB "
        f"free={report.free_after_ballast_mb} MiB big prompt={big_tokens} tokens "
        f"(KV {big_tokens * per_token / 2**20:.0f} MiB)",
        flush=True,
    )
    big_prompt = fit_prompt(api, engine, big_tokens)
    try:
        for n in range(1, args.episodes + 1):
            e = await episode(api, engine, torch, big_prompt, args)
            report.episodes.append(e)
            print(
                f"episode {n}: OOM caught={'yes' if e.oom_caught else 'no'} ({e.error}); "
                f"error delivered {e.error_delivered_s:.4f} s, ready again {e.recovery_s:.4f} s "
                f"after the OOM; small ok={e.small_ok} failed={e.small_failed}; "
                f"allocated delta {e.allocated_delta_mb:+.1f} MiB",
                flush=True,
            )
    finally:
        ballast.clear()
    return report


def fit_prompt(api: types.SimpleNamespace, engine: Any, tokens: int) -> str:
    """A prompt of about ``tokens`` tokens that still fits the engine's context."""
    unit = "x "
    per_unit = engine.count_tokens(api.GenerationRequest(prompt=unit * 100)) / 100
    prompt = unit * int(tokens / per_unit)
    while True:
        try:
            engine.count_tokens(api.GenerationRequest(prompt=prompt))
            return prompt
        except api.ContextLengthExceeded:  # a little too long still
            prompt = prompt[: int(len(prompt) * 0.98)]


async def episode(
    api: types.SimpleNamespace, engine: Any, torch: Any, big_prompt: str, args: argparse.Namespace
) -> Episode:
    """Small traffic + one request that cannot fit + recovery."""
    dry = args.dry_run
    allocated_before = torch.cuda.memory_allocated() if not dry else 0
    traffic = Traffic()
    traffic.gate.set()
    workers = [
        asyncio.create_task(small_traffic(engine, api.GenerationRequest, traffic))
        for _ in range(args.concurrency)
    ]
    await asyncio.sleep(0.3)
    big = api.GenerationRequest(prompt=big_prompt, max_tokens=1, request_id="too-big", priority=-1)
    if dry:
        # The injected fault hits the next generation the engine runs: park the small loops
        # so that it is this one, and let them go again once the fault is taken.
        traffic.gate.clear()
        while traffic.parked < args.concurrency:
            await asyncio.sleep(0.01)
        engine.faults.arm_oom(1)
    outcome = asyncio.create_task(engine.generate(big))
    while dry and engine.faults.pending_oom:
        await asyncio.sleep(0.001)
    traffic.gate.set()
    caught, error = False, "no error"
    try:
        await outcome
    except api.EngineOOM as exc:
        caught, error = True, str(engine.last_oom_error or exc.message)[:160]
    except Exception as exc:
        error = f"{type(exc).__name__}: {exc}"[:200]
    recovery = delivered = float("nan")
    if caught:
        delivered = time.monotonic() - engine.last_oom_at
        await engine.recover()
        recovery = time.monotonic() - engine.last_oom_at
    await asyncio.sleep(0.3)  # small traffic goes on after recovery
    traffic.stop.set()
    await asyncio.gather(*workers)
    allocated_after = torch.cuda.memory_allocated() if not dry else 0
    return Episode(
        oom_caught=caught,
        error=error,
        big_prompt_tokens=engine.count_tokens(big),
        recovery_s=recovery,
        error_delivered_s=delivered,
        small_ok=traffic.ok,
        small_failed=traffic.failed,
        allocated_delta_mb=(allocated_after - allocated_before) / 2**20,
    )


def main(argv: list[str] | None = None) -> int:
    """Parse the arguments, run the bench, print the figures."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    source = parser.add_mutually_exclusive_group()
    source.add_argument("--model", help="HF model directory (default: the SmolLM2 HF cache)")
    source.add_argument("--random-model", action="store_true", help="random-weights Llama")
    parser.add_argument("--episodes", type=int, default=5)
    parser.add_argument("--concurrency", type=int, default=4, help="small-request loops")
    parser.add_argument("--margin-mb", type=int, default=256, help="GPU memory left free")
    parser.add_argument("--max-model-len", type=int, default=65536)
    parser.add_argument("--dry-run", action="store_true", help="CPU, injected OOM, no ballast")
    parser.add_argument("--json", type=Path, help="also write the report as JSON here")
    args = parser.parse_args(argv)
    report = asyncio.run(run(args))
    summary = report.summary()
    label = "DRY RUN on CPU, injected OOM (not a GPU figure)" if args.dry_run else "real CUDA OOM"
    line = (
        f"summary [{label}; {report.model}]: OOM caught {summary['oom_caught']}; small requests "
        f"during the episodes ok={summary['small_ok']} failed={summary['small_failed']}; "
        f"engine-level time from OOM to ready (in-process recover(), no HTTP) "
        f"p50={summary['recovery_p50_s']} s (max {summary['recovery_max_s']} s; goal <= "
        f"{GOAL_S} s)"
    )
    if not args.dry_run:
        line += (
            f"; for context only, service-level (HTTP readiness) published figures: "
            f"{PUBLISHED['hardened service']} s hardened service, "
            f"{PUBLISHED['restarted stock vLLM']} s restarted stock vLLM"
        )
    print(line)
    if args.json:
        args.json.write_text(json.dumps({**asdict(report), "summary": summary}, indent=2))
    ok = summary["small_failed"] == 0 and all(e.oom_caught for e in report.episodes)
    return 0 if ok else 1


if __name__ == "__main__":
    raise SystemExit(main())
