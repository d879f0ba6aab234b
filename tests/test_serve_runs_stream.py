"""``GET /v1/events/runs`` over HTTP against real ``chainrt serve`` processes: a run submitted
after the stream opened is told created → running → completed, on SQLite and across two runners
sharing Redis; a reconnect with ``Last-Event-ID`` catches up; a cancel is told; SIGTERM ends the
stream cleanly."""

from __future__ import annotations

import json
import threading
import time
from pathlib import Path
from typing import Any

import httpx
import pytest

from chainrt.testing.redis_server import RedisServer
from chainrt.testing.serve_process import ServeProcess

CHAINS = Path(__file__).parent / "data" / "dashboard"
pytestmark = pytest.mark.slow


class Listener:
    """Reads the stream in a thread; ``frames`` holds each event as it arrives."""

    def __init__(self, base: str, last_event_id: str | None = None) -> None:
        self.frames: list[dict[str, Any]] = []
        self.ended = threading.Event()
        self.error: BaseException | None = None
        self.status_code = 0
        headers = {"Last-Event-ID": last_event_id} if last_event_id else {}
        self._thread = threading.Thread(target=self._read, args=(base, headers), daemon=True)
        self._stop = threading.Event()
        self._thread.start()

    def _read(self, base: str, headers: dict[str, str]) -> None:
        try:
            timeout = httpx.Timeout(10.0, read=60.0)
            with httpx.stream(
                "GET", f"{base}/v1/events/runs", headers=headers, timeout=timeout
            ) as r:
                self.status_code = r.status_code
                self.content_type = r.headers.get("content-type", "")
                frame: dict[str, Any] = {}
                for line in r.iter_lines():
                    if self._stop.is_set():
                        return
                    if line == "":
                        if "event" in frame:
                            frame["data"] = json.loads(frame["data"])
                            self.frames.append(frame)
                        frame = {}
                    elif not line.startswith(":") and ": " in line:
                        key, value = line.split(": ", 1)
                        frame[key] = value
        except BaseException as exc:  # reported by the test
            self.error = exc
        finally:
            self.ended.set()

    def wait_for(self, check: Any, within_s: float = 60.0) -> list[dict[str, Any]]:
        """Wait (generously: a busy machine) until ``check(frames)`` is true."""
        deadline = time.monotonic() + within_s
        while not check(self.frames):
            assert self.error is None, repr(self.error)
            assert time.monotonic() < deadline, f"not seen in {within_s}s: {self.frames}"
            time.sleep(0.02)
        return list(self.frames)

    def statuses(self, run_id: str) -> list[tuple[str, str]]:
        return [
            (f["data"]["change"], f["data"]["status"])
            for f in self.frames
            if f["event"] == "run" and f["data"]["run_id"] == run_id
        ]

    def close(self) -> None:
        self._stop.set()


def submit(server: ServeProcess, run_id: str, seconds: float) -> None:
    body = {"chain": "steps", "input": {"a": seconds, "b": 0.0, "c": 0.0}, "run_id": run_id}
    answer = server.post("/v1/runs", json=body)
    assert answer.status_code == 202, answer.text


def until_final(listener: Listener, run_id: str) -> Any:
    return lambda _: listener.statuses(run_id)[-1:] == [("status", "completed")]


def test_sqlite_stream_tells_each_change_and_catches_up(tmp_path: Path) -> None:
    store = f"sqlite:///{tmp_path / 'runs.db'}"
    with ServeProcess(store=store, chains=CHAINS, drain="1s") as server:
        listener = Listener(server.url)
        frames = listener.wait_for(lambda f: len(f) >= 1)
        assert listener.content_type.startswith("text/event-stream")
        assert frames[0]["event"] == "reload"  # a new stream: read the list now
        submit(server, "s-1", 0.3)
        listener.wait_for(until_final(listener, "s-1"))
        assert listener.statuses("s-1") == [
            ("created", "queued"),
            ("status", "running"),
            ("status", "completed"),
        ]
        row = listener.frames[-1]["data"]
        listed = server.get("/v1/runs", params={"run_id": "s-1"}).json()[0]
        assert {k: row[k] for k in listed} == listed  # the fields of a list row, as listed
        seen = listener.frames[-1]["id"]
        listener.close()

        # A client that lost its connection comes back with Last-Event-ID: what it missed.
        submit(server, "s-2", 0.0)
        assert server.get("/v1/runs/s-2", params={"wait": "30s"}).json()["status"] == "completed"
        back = Listener(server.url, last_event_id=seen)
        back.wait_for(until_final(back, "s-2"))
        assert back.statuses("s-2") == [
            ("created", "queued"),
            ("status", "running"),
            ("status", "completed"),
        ]
        assert [f["event"] for f in back.frames] == ["run"] * 3  # no reload: nothing was lost
        assert back.statuses("s-1") == []  # nor told again
        back.close()

        # Cancelling a queued run is a change too (no run event stands for it).
        listener = Listener(server.url)
        listener.wait_for(lambda f: len(f) >= 1)
        submit(server, "s-3", 600.0)
        listener.wait_for(lambda _: ("status", "running") in listener.statuses("s-3"))
        assert server.post("/v1/runs/s-3/cancel").status_code == 202
        listener.wait_for(lambda _: ("status", "cancelled") in listener.statuses("s-3"))

        # SIGTERM: the runner drains and the stream ends cleanly (not a cut connection).
        server.terminate()
        assert listener.ended.wait(30)
        assert listener.error is None, repr(listener.error)
        assert server.wait(30) == 0


def test_redis_stream_hears_runs_of_another_runner(
    redis_url: str, redis_server: RedisServer
) -> None:
    with (
        ServeProcess(store=redis_url, chains=CHAINS, drain="1s", max_runs=1) as watched,
        ServeProcess(store=redis_url, chains=CHAINS, drain="1s") as other,
    ):
        # ``watched`` is kept busy, so the run below runs on ``other``: every change of it is
        # made in the other process and must reach ``watched``'s stream.
        submit(watched, "busy", 600.0)
        deadline = time.monotonic() + 60
        while watched.get("/v1/runs/busy").json()["status"] != "running":
            assert time.monotonic() < deadline
            time.sleep(0.05)
        listener = Listener(watched.url)
        listener.wait_for(lambda f: len(f) >= 1)
        submit(other, "r-1", 0.3)
        listener.wait_for(until_final(listener, "r-1"))
        assert listener.statuses("r-1") == [
            ("created", "queued"),
            ("status", "running"),
            ("status", "completed"),
        ]
        assert watched.get("/v1/runs/busy").json()["status"] == "running"  # its one slot: busy
        assert watched.post("/v1/runs/busy/cancel").status_code == 202
        listener.wait_for(lambda _: ("status", "cancelled") in listener.statuses("busy"))
        listener.close()
