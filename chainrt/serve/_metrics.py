"""Prometheus metrics of ``chainrt serve`` (one registry per service, not the global one).

Runs by status, runs in flight, queue depth and age per priority, run and step latency, budget
used and overshoot. Run and step figures come from the run events of this runner's runs; queue
figures are read from the queue when ``/metrics`` is scraped.
"""

from __future__ import annotations

from typing import Any

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest

from .._events import RunEvent

__all__ = ["ServeMetrics"]

_LATENCY_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120)


class ServeMetrics:
    """The service's metrics; ``observe`` is a run-event sink."""

    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        r = self.registry
        self.runs = Counter(
            "chainrt_runs", "Runs this runner ended, by final status.", ["status"], registry=r
        )
        self.in_flight = Gauge("chainrt_runs_in_flight", "Runs executing now.", registry=r)
        self.queue_depth = Gauge(
            "chainrt_queue_depth", "Queue entries not yet taken.", ["priority"], registry=r
        )
        self.queue_age = Gauge(
            "chainrt_queue_oldest_age_seconds",
            "Age of the oldest entry not yet taken.",
            ["priority"],
            registry=r,
        )
        self.run_seconds = Histogram(
            "chainrt_run_budget_used_seconds",
            "Budget a run used (its own running time, resumes included).",
            buckets=_LATENCY_BUCKETS,
            registry=r,
        )
        self.step_seconds = Histogram(
            "chainrt_step_seconds", "Elapsed time of a step.", buckets=_LATENCY_BUCKETS, registry=r
        )
        self.budget_ratio = Histogram(
            "chainrt_run_budget_used_ratio",
            "Budget used / budget total of a finished run.",
            buckets=(0.1, 0.25, 0.5, 0.75, 0.9, 1.0, 1.05, 1.25),
            registry=r,
        )
        self.overshoot = Histogram(
            "chainrt_run_budget_overshoot_seconds",
            "How far past its budget a run ended (0 when inside).",
            buckets=(0.0, 0.005, 0.01, 0.02, 0.05, 0.1, 0.5, 1, 5),
            registry=r,
        )

    def observe(self, event: RunEvent) -> None:
        """Count a run event of this runner."""
        data: dict[str, Any] = event.data
        if event.type == "step_finished":
            self.step_seconds.observe(float(data.get("elapsed_ms") or 0.0) / 1000)
        elif event.type == "run_finished":
            self.runs.labels(status=str(data.get("status"))).inc()
            budget = data.get("budget") or {}
            used = float(budget.get("used_ms") or 0.0)
            total = float(budget.get("total_ms") or 0.0)
            self.run_seconds.observe(used / 1000)
            if total > 0:
                self.budget_ratio.observe(used / total)
                self.overshoot.observe(max(0.0, used - total) / 1000)

    def render(self) -> bytes:
        """The Prometheus text format."""
        data: bytes = generate_latest(self.registry)
        return data
