"""Prometheus metrics of ``chainrt serve`` (one registry per service, not the global one).

Runs by status, runs in flight, queue depth and age per priority, run and step latency, budget
used and overshoot, tokens (and their cost) by chain, model and kind. Run and step figures come from the run events of this runner's runs; queue
figures are read from the queue when ``/metrics`` is scraped.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest

from .._events import RunEvent

if TYPE_CHECKING:
    from ._accept import ConnectionGate
    from ._streams import StreamSlots

__all__ = ["ConnectionMetrics", "ServeMetrics"]

_MAX_RUNS_KNOWN = 100_000
"""Runs whose chain is remembered for their attempts' token counts (oldest forgotten first)."""

_LATENCY_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120)


class ServeMetrics:
    """The service's metrics; ``observe`` is a run-event sink."""

    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        r = self.registry
        self.runs = Counter(
            "chainrt_runs",
            "Runs this runner ended, by final status (and runs it parked: waiting).",
            ["status"],
            registry=r,
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
        self.tokens = Counter(
            "chainrt_tokens",
            "Tokens the servers reported, by chain, model and kind (prompt, completion, cached).",
            ["chain", "model", "kind"],
            registry=r,
        )
        self.cost = Counter(
            "chainrt_cost",
            "What those tokens cost at the pool's price (the price's own unit), by chain and model.",
            ["chain", "model"],
            registry=r,
        )
        self._chains: dict[str, str] = {}
        """run id -> chain, for the runs in flight (attempt events carry no chain)."""
        self.overshoot = Histogram(
            "chainrt_run_budget_overshoot_seconds",
            "How far past its budget a run ended (0 when inside).",
            buckets=(0.0, 0.005, 0.01, 0.02, 0.05, 0.1, 0.5, 1, 5),
            registry=r,
        )

    def observe(self, event: RunEvent) -> None:
        """Count a run event of this runner."""
        data: dict[str, Any] = event.data
        if event.type == "run_started":
            if len(self._chains) >= _MAX_RUNS_KNOWN:  # runs that never finished here (a crash)
                self._chains.pop(next(iter(self._chains)))
            self._chains[event.run_id] = str(data.get("chain") or "")
        elif event.type == "attempt":
            self._count_usage(event.run_id, data)
        elif event.type == "step_finished":
            self.step_seconds.observe(float(data.get("elapsed_ms") or 0.0) / 1000)
        elif event.type == "run_finished":
            self._chains.pop(event.run_id, None)
            self.runs.labels(status=str(data.get("status"))).inc()
            if data.get("status") == "waiting":
                return  # parked, not ended: its budget is observed when it ends
            budget = data.get("budget") or {}
            used = float(budget.get("used_ms") or 0.0)
            total = float(budget.get("total_ms") or 0.0)
            self.run_seconds.observe(used / 1000)
            if total > 0:
                self.budget_ratio.observe(used / total)
                self.overshoot.observe(max(0.0, used - total) / 1000)

    def _count_usage(self, run_id: str, data: dict[str, Any]) -> None:
        usage = data.get("usage")
        if not isinstance(usage, dict):
            return
        chain = self._chains.get(run_id, "")
        model = str(data.get("model") or "")
        for kind in ("prompt", "completion", "cached"):
            count = usage.get(f"{kind}_tokens")
            if isinstance(count, int) and not isinstance(count, bool) and count > 0:
                self.tokens.labels(chain=chain, model=model, kind=kind).inc(count)
        cost = usage.get("cost")
        if isinstance(cost, int | float) and not isinstance(cost, bool) and cost > 0:
            self.cost.labels(chain=chain, model=model).inc(cost)

    def render(self) -> bytes:
        """The Prometheus text format."""
        data: bytes = generate_latest(self.registry)
        return data


class ConnectionMetrics:
    """Connections and event streams (``--max-connections``, ``--max-streams``,
    ``--body-timeout``), read from the gate and the stream slots at scrape time."""

    def __init__(self, registry: CollectorRegistry) -> None:
        r = registry
        self.open = Gauge("chainrt_serve_connections", "HTTP connections open now.", registry=r)
        self.limit = Gauge(
            "chainrt_serve_connections_limit", "The cap on open connections.", registry=r
        )
        self.waited = Counter(
            "chainrt_serve_connections_cap_reached",
            "Times accepting stopped at the cap (new connections waited in the backlog).",
            registry=r,
        )
        self.starved = Counter(
            "chainrt_serve_accept_failures",
            "Accepts that failed for lack of file descriptors (accepting paused a while).",
            registry=r,
        )
        self.body_timeouts = Counter(
            "chainrt_serve_body_timeouts",
            "Requests answered 408: their body did not arrive within --body-timeout.",
            registry=r,
        )
        self.streams = Gauge("chainrt_serve_streams", "Event streams open now.", registry=r)
        self.streams_refused = Counter(
            "chainrt_serve_streams_refused",
            "Event streams answered 429 (--max-streams open).",
            registry=r,
        )
        self._counted: dict[str, int] = {}

    def update(self, gate: ConnectionGate | None, streams: StreamSlots) -> None:
        """Read the gate (None: the app is served some other way) and the stream slots."""
        if gate is not None:
            self.open.set(gate.open)
            self.limit.set(gate.limit)
            self._bump(self.waited, "waited", gate.paused_at_limit)
            self._bump(self.starved, "starved", gate.starved)
            self._bump(self.body_timeouts, "body", gate.body_timeouts)
        self.streams.set(streams.open)
        self._bump(self.streams_refused, "refused", streams.refused)

    def _bump(self, counter: Counter, key: str, total: int) -> None:
        seen = self._counted.get(key, 0)
        if total > seen:
            counter.inc(total - seen)
            self._counted[key] = total
