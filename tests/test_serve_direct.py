"""The hot routes answered directly (chainrt/serve/_direct.py): a plain submit or read is
answered without reaching FastAPI, and every answer is the one the FastAPI routes give: the same
requests against the same service, with and without the direct layer, get the same answers."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from fastapi import FastAPI

from chainrt.serve import ServeConfig, Service, create_app
from chainrt.serve._direct import Direct

CHAINS = Path(__file__).parent / "data" / "serve"
JSON = {"content-type": "application/json"}


@pytest.fixture
async def service(tmp_path: Path) -> AsyncIterator[Service]:
    config = ServeConfig(chains=str(CHAINS), store=f"sqlite:///{tmp_path / 'runs.db'}")
    config.max_budget_ms = 600_000
    served = Service(config)
    await served.start()
    try:
        yield served
    finally:
        await served.stop()


def _client(app: Any) -> httpx.AsyncClient:
    transport = httpx.ASGITransport(app=app)
    return httpx.AsyncClient(transport=transport, base_url="http://127.0.0.1")


def _without_direct(service: Service) -> FastAPI:
    app = create_app(service, manage=False)
    app.user_middleware = [m for m in app.user_middleware if m.cls is not Direct]  # type: ignore[comparison-overlap]
    return app


class Behind:
    """An ASGI app standing for FastAPI behind :class:`Direct`: records what reaches it."""

    def __init__(self) -> None:
        self.bodies: list[bytes] = []

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        body = b""
        if scope["method"] == "POST":
            body = (await receive())["body"]
        self.bodies.append(body)
        await send({"type": "http.response.start", "status": 299, "headers": []})
        await send({"type": "http.response.body", "body": b"behind"})


async def test_plain_requests_are_answered_directly_and_refusals_go_behind(
    service: Service,
) -> None:
    behind = Behind()
    async with _client(Direct(behind, service)) as c:
        made = await c.post("/v1/runs", json={"chain": "five", "input": {}, "run_id": "d1"})
        assert (made.status_code, made.json()) == (202, {"run_id": "d1", "status": "queued"})
        again = await c.post("/v1/runs", json={"chain": "five", "input": {}, "run_id": "d1"})
        assert again.status_code == 200
        other = await c.post("/v1/runs", json={"chain": "five", "input": {"x": 1}, "run_id": "d1"})
        assert (other.status_code, other.json()["error"]["type"]) == (409, "run_id_conflict")
        unknown = await c.post("/v1/runs", json={"chain": "nope", "input": {}})
        assert (unknown.status_code, unknown.json()["error"]["field"]) == (404, "chain")
        final = await c.get("/v1/runs/d1", params={"wait": "30s"})
        assert (final.status_code, final.json()["status"]) == (200, "completed")
        missing = await c.get("/v1/runs/no-such-run")
        assert (missing.status_code, missing.json()["error"]["type"]) == (404, "run_not_found")
        assert behind.bodies == []  # all of those were answered directly
        refused = [
            b'{"chain": "five", "input": {}',  # not JSON
            b'["five"]',  # not an object
            b'{"chain": "five", "input": {}, "budget": "2h"}',  # over --max-budget
            b'{"chain": "five", "input": {}, "priority": "urgent"}',  # not a priority
        ]
        for body in refused:
            answer = await c.post("/v1/runs", content=body, headers=JSON)
            assert answer.status_code == 299
        text = await c.post("/v1/runs", content=b"{}", headers={"content-type": "text/plain"})
        assert text.status_code == 299
        assert behind.bodies == [*refused, b"{}"]  # each handed on whole
        for path in ("/v1/runs/d1?wait=soon", "/v1/runs/d1/record", "/v1/runs/"):
            assert (await c.get(path)).status_code == 299


REQUESTS: list[tuple[str, str, dict[str, Any]]] = [
    ("POST", "/v1/runs", {"json": {"chain": "five", "input": {}, "run_id": "p1"}}),
    ("POST", "/v1/runs", {"json": {"chain": "five", "input": {}, "run_id": "p1"}}),
    ("POST", "/v1/runs", {"json": {"chain": "five", "input": {}, "run_id": "p1", "budget": "9s"}}),
    ("POST", "/v1/runs", {"json": {"chain": "nope", "input": {}}}),
    ("POST", "/v1/runs", {"json": {"chain": "nap", "input": {"seconds": "x"}}}),
    ("POST", "/v1/runs", {"json": {"chain": "five", "input": {}, "budget": "2h"}}),
    ("POST", "/v1/runs", {"json": {"chain": "five", "input": {}, "budget": -1}}),
    ("POST", "/v1/runs", {"json": {"chain": "five"}}),
    ("POST", "/v1/runs", {"json": ["five"]}),
    ("POST", "/v1/runs", {"content": b'{"chain": "five", "chain": "ten"}', "headers": JSON}),
    ("POST", "/v1/runs", {"content": b"{", "headers": JSON}),
    ("POST", "/v1/runs", {"content": b"", "headers": JSON}),
    ("GET", "/v1/runs/p1?wait=30s", {}),
    ("GET", "/v1/runs/p1?wait=0s&wait=1s", {}),
    ("GET", "/v1/runs/p1?wait=soon", {}),
    ("GET", "/v1/runs/none-such", {}),
    ("GET", "/v1/runs/none-such?wait=10ms", {}),
]


def _comparable(answer: httpx.Response) -> tuple[int, Any]:
    body: Any = answer.content
    if answer.headers.get("content-type") == "application/json":
        body = answer.json()
        if isinstance(body, dict):  # a run's times and ids differ from one service to the other
            for key in ("created_at", "updated_at", "started_at", "ended_at", "steps", "budget"):
                body.pop(key, None)
    return answer.status_code, body


async def test_every_answer_is_the_one_the_fastapi_routes_give(tmp_path: Path) -> None:
    answers: list[list[tuple[int, Any]]] = []
    db = tmp_path / "runs.db"  # one path for both (error messages name it); emptied between
    for direct in (True, False):
        for stale in tmp_path.glob("runs.db*"):
            stale.unlink()
        config = ServeConfig(chains=str(CHAINS), store=f"sqlite:///{db}")
        config.max_budget_ms = 600_000
        service = Service(config)
        await service.start()
        try:
            app = create_app(service, manage=False) if direct else _without_direct(service)
            async with _client(app) as c:
                got = []
                for method, url, kwargs in REQUESTS:
                    got.append(_comparable(await c.request(method, url, **kwargs)))
            answers.append(got)
        finally:
            await service.stop()
    for request, with_direct, without in zip(REQUESTS, *answers, strict=True):
        assert with_direct == without, (request, json.dumps(with_direct, default=str)[:300])
    assert answers[0][0][0] == 202
    assert answers[0][2][0] == 409
    assert answers[0][12][1]["status"] == "completed"
