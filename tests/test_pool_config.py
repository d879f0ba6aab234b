"""The pool file: what it accepts, and one clear SpecError with file:line for what it does not."""

from __future__ import annotations

from pathlib import Path

import pytest

from chainrt import SpecError
from chainrt.dispatch import HttpBackend, LocalBackend, make_dispatcher
from chainrt.dispatch._breaker import DEFAULT_POLICIES, BreakerPolicy
from chainrt.dispatch._client import base_url
from chainrt.dispatch._pool import load_pool_config, parse_pool_config, pool_backends

FULL = """\
models:
  primary:
    served_model: qwen3-8b
    endpoints:
      - {url: "http://gpu-node-1:8000", capacity: 128000}
      - {url: "unix:///run/chainrt/w1.sock", capacity: 64000}
  local:
    endpoints:
      - url: http://127.0.0.1:9000/
health: {interval: 2s, timeout: 250ms}
breakers:
  connect: {min_requests: 3, cooldown: 500ms}
connect_timeout: 300ms
latency_window: 50
"""


def test_full_file_parses_with_typed_values() -> None:
    config = parse_pool_config(FULL, file="pool.yaml")
    primary = config.models["primary"]
    assert primary.served_model == "qwen3-8b"
    assert [(e.url, e.capacity) for e in primary.endpoints] == [
        ("http://gpu-node-1:8000", 128000.0),
        ("unix:///run/chainrt/w1.sock", 64000.0),
    ]
    assert config.models["local"].endpoints[0].url == "http://127.0.0.1:9000"  # slash dropped
    assert config.models["local"].endpoints[0].capacity == 1.0
    assert (config.health.interval, config.health.timeout) == (2000.0, 250.0)
    assert config.connect_timeout == 300.0
    assert config.latency_window == 50
    policies = config.breaker_policies()
    assert policies["connect"] == BreakerPolicy(
        window=DEFAULT_POLICIES["connect"].window,
        min_requests=3,
        failure_rate=DEFAULT_POLICIES["connect"].failure_rate,
        cooldown_s=0.5,
    )
    assert policies["5xx"] == DEFAULT_POLICIES["5xx"]


def test_minimal_file_gets_defaults() -> None:
    config = parse_pool_config("models:\n  m:\n    endpoints: [{url: 'http://h:1'}]\n")
    assert config.health.enabled
    assert config.health.interval == 1000.0
    assert config.breakers == {}
    assert config.models["m"].served_model is None


@pytest.mark.parametrize(
    ("text", "line", "field", "message"),
    [
        (
            "models:\n  m:\n    endpoints:\n      - {url: 'http://h:1', weight: 3}\n",
            4,
            "models.m.endpoints[0].weight",
            "unknown key 'weight'",
        ),
        (
            "models:\n  m:\n    endpoints:\n      - url: ftp://h/x\n",
            4,
            "models.m.endpoints[0].url",
            "must start with http://, https:// or unix:///",
        ),
        (
            "models:\n  m:\n    endpoints:\n      - url: unix://relative.sock\n",
            4,
            "models.m.endpoints[0].url",
            "unix:///absolute/path.sock",
        ),
        (
            "models:\n  m:\n    endpoints:\n      - url: http://h:99999\n",
            4,
            "models.m.endpoints[0].url",
            "invalid port",
        ),
        (
            "models:\n  m:\n    endpoints:\n      - {url: 'http://h:1', capacity: 0}\n",
            4,
            "models.m.endpoints[0].capacity",
            "greater than 0",
        ),
        (
            "models:\n  m:\n    endpoints:\n      - url: http://h:1\n      - url: http://h:1\n",
            3,
            "models.m.endpoints",
            "listed twice",
        ),
        ("models:\n  m:\n    endpoints: []\n", 3, "models.m.endpoints", "at least 1 item"),
        ("models:\n  m:\n    served_model: x\n", 2, "models.m.endpoints", "required key"),
        (
            "models:\n  static:\n    endpoints: [{url: 'http://h:1'}]\n",
            1,
            "models",
            "reserved for the static answer",
        ),
        (
            "models:\n  m:\n    endpoints: [{url: 'http://h:1'}]\nbreakers:\n  connect:\n    window: 2\n    min_requests: 5\n",
            5,
            "breakers.connect",
            "self.min_requests=5 must be between 1 and window=2",
        ),
        (
            "models:\n  m:\n    endpoints: [{url: 'http://h:1'}]\nbreakers:\n  teapot: {window: 2}\n",
            5,
            "breakers.teapot",
            "'connect', 'timeout', '5xx', 'oom', 'overloaded', 'low_confidence' or 'auth'",
        ),
        (
            "models:\n  m:\n    endpoints: [{url: 'http://h:1'}]\nhealth:\n  interval: 0s\n",
            5,
            "health.interval",
            "greater than zero",
        ),
        (
            "models:\n  m:\n    endpoints: [{url: 'http://h:1'}]\nconnect_timeout: soon\n",
            4,
            "connect_timeout",
            "duration",
        ),
        (
            "models:\n  m:\n    endpoints: [{url: 'http://h:1'}]\npool: {}\n",
            4,
            "pool",
            "unknown key 'pool'",
        ),
        (
            "models:\n  m:\n    endpoints: [{url: 'http://h:1'}]\n  m:\n    endpoints: []\n",
            4,
            "models.m",
            "duplicate key 'm'",
        ),
    ],
)
def test_errors_name_file_line_and_field(text: str, line: int, field: str, message: str) -> None:
    with pytest.raises(SpecError) as caught:
        parse_pool_config(text, file="pool.yaml")
    err = caught.value
    assert err.file == "pool.yaml"
    assert err.line == line, str(err)
    assert err.field == field, str(err)
    assert message in str(err)
    assert str(err).startswith(f"pool.yaml:{line}: ")


def test_several_problems_are_counted_in_one_error() -> None:
    with pytest.raises(SpecError, match=r"\(and 1 more problem\(s\)\)"):
        parse_pool_config("models:\n  m:\n    endpoints: [{url: 'x'}]\nextra: 1\n", file="p.yaml")


def test_missing_file_is_a_spec_error(tmp_path: Path) -> None:
    with pytest.raises(SpecError, match="no such file"):
        load_pool_config(tmp_path / "nope.yaml")


async def test_make_dispatcher_maps_models_and_keeps_local_in_process(tmp_path: Path) -> None:
    path = tmp_path / "pool.yaml"
    path.write_text("models:\n  primary:\n    endpoints: [{url: 'http://127.0.0.1:1'}]\n")
    dispatcher = make_dispatcher(str(path))
    try:
        assert dispatcher.models == ["local", "primary"]
        assert isinstance(dispatcher.backend("local"), LocalBackend)
        primary = dispatcher.backend("primary")
        assert isinstance(primary, HttpBackend)
        assert primary.served_model == "primary"  # default: the key
    finally:
        await dispatcher.close()
    path.write_text(FULL)
    dispatcher = make_dispatcher(path)
    try:
        local = dispatcher.backend("local")
        assert isinstance(local, HttpBackend)  # the pool maps local elsewhere
        assert dispatcher.latency.size == 50
    finally:
        await dispatcher.close()


def test_unix_endpoints_get_a_stable_host_that_cannot_resolve() -> None:
    one = base_url("unix:///run/chainrt/w1.sock")
    assert one == base_url("unix:///run/chainrt/w1.sock")
    assert one != base_url("unix:///run/chainrt/w2.sock")
    assert one.startswith("http://")
    assert one.endswith(".uds.chainrt.invalid")
    assert base_url("http://h:1") == "http://h:1"


def test_dispatch_public_names_are_pinned() -> None:
    import chainrt.dispatch

    assert sorted(chainrt.dispatch.__all__) == [
        "BackendAnswer",
        "BackendError",
        "DispatchFailed",
        "Dispatcher",
        "HttpBackend",
        "LatencyTracker",
        "LlmAnswer",
        "LlmCall",
        "LocalBackend",
        "ModelBackend",
        "PoolConfig",
        "Priority",
        "TextSink",
        "load_pool_config",
        "make_dispatcher",
        "parse_pool_config",
        "pool_backends",
    ]
    for name in chainrt.dispatch.__all__:
        assert getattr(chainrt.dispatch, name) is not None


def test_context_window_reaches_the_backend() -> None:
    config = parse_pool_config(
        "models:\n  big:\n    context_window: 8192\n    endpoints: [{url: 'http://h:1'}]\n"
        "  plain:\n    endpoints: [{url: 'http://h:2'}]\n"
    )
    backends = pool_backends(config)
    assert backends["big"].context_window() == 8192
    assert backends["plain"].context_window() is None
    with pytest.raises(SpecError, match="context_window"):
        parse_pool_config(
            "models:\n  m:\n    context_window: 0\n    endpoints: [{url: 'http://h:1'}]\n"
        )


def test_timeout_breaker_overrides_keep_its_hung_endpoint_fields() -> None:
    base = "models:\n  m:\n    endpoints: [{url: 'http://h:1'}]\nbreakers:\n  timeout: "
    policy = parse_pool_config(base + "{cooldown: 1s}\n").breaker_policies()["timeout"]
    assert (policy.cooldown_s, policy.trip_unproven, policy.max_cooldown_s) == (1.0, 1, 30.0)
    # A cool-down longer than the default cap raises the cap with it (no inconsistent policy).
    policy = parse_pool_config(base + "{cooldown: 60s}\n").breaker_policies()["timeout"]
    assert (policy.cooldown_s, policy.max_cooldown_s) == (60.0, 60.0)
    text = base + "{trip_unproven: 0, max_cooldown: 10s}\n"
    policy = parse_pool_config(text).breaker_policies()["timeout"]
    assert (policy.trip_unproven, policy.max_cooldown_s) == (0, 10.0)
