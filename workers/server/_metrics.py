"""Prometheus metrics of one worker, in a registry of its own (so apps and tests never collide)."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest

__all__ = ["WorkerMetrics"]

_LATENCY_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60)
_RECOVERY_BUCKETS = (0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120)


class WorkerMetrics:
    """Every metric the worker exports; names start with ``chainrt_worker_``."""

    def __init__(self, engine: str, model: str) -> None:
        self.registry = CollectorRegistry(auto_describe=True)
        r = self.registry
        self.requests = Counter(
            "chainrt_worker_requests", "Requests answered, by endpoint and HTTP status.",
            ["endpoint", "status"], registry=r,
        )  # fmt: skip
        self.admission_rejects = Counter(
            "chainrt_worker_admission_rejects",
            "Requests refused before the engine: insufficient_memory (429), never_fits (413), "
            "queue_full (429), not_ready (503), deadline (504).",
            ["reason"], registry=r,
        )  # fmt: skip
        self.oom_events = Counter(
            "chainrt_worker_oom_events", "Out-of-memory errors raised by the engine.", registry=r
        )
        self.engine_dead_events = Counter(
            "chainrt_worker_engine_dead_events", "Times the engine died.", registry=r
        )
        self.recoveries = Counter(
            "chainrt_worker_recoveries", "Completed in-process recoveries, by cause.",
            ["cause"], registry=r,
        )  # fmt: skip
        self.recovery_seconds = Histogram(
            "chainrt_worker_recovery_seconds",
            "Seconds from an engine failure to ready again (recover + readiness generation).",
            buckets=_RECOVERY_BUCKETS, registry=r,
        )  # fmt: skip
        self.reloads = Counter(
            "chainrt_worker_reloads", "Hot reloads (POST /admin/reload), by outcome.",
            ["outcome"], registry=r,
        )  # fmt: skip
        self.reload_seconds = Histogram(
            "chainrt_worker_reload_seconds",
            "Seconds from a reload request to the new engine serving (load + readiness).",
            buckets=_RECOVERY_BUCKETS, registry=r,
        )  # fmt: skip
        self.latency = Histogram(
            "chainrt_worker_request_seconds", "Latency of generation requests (whole answer).",
            ["endpoint"], buckets=_LATENCY_BUCKETS, registry=r,
        )  # fmt: skip
        self.queue_depth = Gauge(
            "chainrt_worker_queue_depth", "Requests waiting for an engine slot.", registry=r
        )
        self.slots_in_use = Gauge(
            "chainrt_worker_slots_in_use", "Requests inside the engine.", registry=r
        )
        self.prompt_tokens = Counter(
            "chainrt_worker_prompt_tokens", "Prompt tokens processed.", registry=r
        )
        self.completion_tokens = Counter(
            "chainrt_worker_completion_tokens", "Tokens generated.", registry=r
        )
        self.tokens_per_second = Gauge(
            "chainrt_worker_tokens_per_second",
            "Generation speed of the last finished request (completion tokens / seconds).",
            registry=r,
        )
        self.memory_watermark = Gauge(
            "chainrt_worker_memory_watermark", "Admission watermark (share of KV memory).",
            registry=r,
        )  # fmt: skip
        self.memory_used_ratio = Gauge(
            "chainrt_worker_memory_used_ratio",
            "KV memory in use or reserved by admitted requests, as a share of the total.",
            registry=r,
        )
        self.ready = Gauge(
            "chainrt_worker_ready", "1 when the last readiness generation passed.", registry=r
        )
        info = Gauge(
            "chainrt_worker_info", "The engine and model served.", ["engine", "model"], registry=r
        )
        info.labels(engine=engine, model=model).set(1)

    def render(self) -> bytes:
        """The exposition text for ``GET /metrics``."""
        return generate_latest(self.registry)
