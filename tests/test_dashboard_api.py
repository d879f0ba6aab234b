"""The API the dashboard reads, over HTTP against a real ``chainrt serve`` (SQLite store):
``GET /v1/runs/{id}/record``, ``GET /v1/runs?run_id=`` and the ``/ui/`` pages themselves."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from chainrt.testing.serve_process import ServeProcess

CHAINS = Path(__file__).parent / "data" / "dashboard"


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServeProcess]:
    store = f"sqlite:///{tmp_path_factory.mktemp('dashboard') / 'runs.db'}"
    with ServeProcess(store=store, chains=CHAINS, drain="1s") as runner:
        body = {"chain": "steps", "input": {"a": 0.01, "b": 0.03, "c": 0.02}, "run_id": "r1"}
        assert runner.post("/v1/runs", json=body).status_code == 202
        assert runner.get("/v1/runs/r1", params={"wait": "30s"}).json()["status"] == "completed"
        yield runner


def test_record_has_what_the_waterfall_draws(server: ServeProcess) -> None:
    detail = server.get("/v1/runs/r1/record").json()
    assert detail["status"] == "completed"
    assert detail["input"] == {"a": 0.01, "b": 0.03, "c": 0.02}
    assert detail["plan"] == [
        {"id": "first", "kind": "tool", "optional": False},
        {"id": "second", "kind": "tool", "optional": False},
        {"id": "third", "kind": "tool", "optional": False},
        {"id": "extra", "kind": "tool", "optional": True},
    ]
    records = detail["records"]
    assert records["extra"]["status"] == "skipped"
    first, second = records["first"], records["second"]
    assert first["output"] == "rested"
    assert first["started_at"] < first["finished_at"] <= second["started_at"]
    assert second["elapsed_ms"] >= 30  # it slept 0.03 s
    assert [a["status"] for a in first["attempt_log"]] == ["ok"]
    assert detail["trace"] == {"trace_id": None, "url": None}  # tracing is off here
    missing = server.get("/v1/runs/nope/record")
    assert missing.status_code == 404
    assert missing.json()["error"]["type"] == "run_not_found"


def test_list_search_by_run_id_keeps_the_filters(server: ServeProcess) -> None:
    assert [r["run_id"] for r in server.get("/v1/runs", params={"run_id": "r1"}).json()] == ["r1"]
    assert server.get("/v1/runs", params={"run_id": "nope"}).json() == []
    other_status = {"run_id": "r1", "status": "failed"}
    assert server.get("/v1/runs", params=other_status).json() == []
    assert server.get("/v1/runs", params={"run_id": "r1", "chain": "solo"}).json() == []
    assert len(server.get("/v1/runs", params={"run_id": "r1", "chain": "steps"}).json()) == 1


def test_pages_and_assets(server: ServeProcess) -> None:
    index = server.get("/ui/")
    assert index.status_code == 200
    assert index.headers["content-type"].startswith("text/html")
    assert "default-src 'self'" in index.headers["content-security-policy"]
    assert "://" not in index.text  # nothing from another origin
    run_page = server.get("/ui/runs/r1")
    assert '<script src="/ui/static/run.js"' in run_page.text
    for name in ("common.js", "list.js", "run.js"):
        script = server.get(f"/ui/static/{name}")
        assert script.headers["content-type"].startswith("text/javascript")
        for writes_html in ("innerHTML", "outerHTML", "insertAdjacentHTML", "document.write"):
            assert writes_html not in script.text  # values from runs are written as text
    assert server.get("/ui/static/nope.js").status_code == 404
    assert server.get("/ui/static/..%2F_app.py").status_code == 404
    redirect = server.get("/ui", follow_redirects=False)
    assert (redirect.status_code, redirect.headers["location"]) == (307, "/ui/")
