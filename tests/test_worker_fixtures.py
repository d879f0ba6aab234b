"""The test helpers themselves: a leak in a shared fixture shows up in whichever test runs later."""

from __future__ import annotations

import threading

from openai import OpenAI
from worker_fixtures import WorkerProcess


def test_openai_client_is_one_per_worker_when_threads_ask_at_once() -> None:
    # The vLLM reload and standby tests start 4 client threads that each call worker.openai():
    # clients built by a race were never closed, and their sockets were reported later as
    # "unclosed socket" (PytestUnraisableExceptionWarning) against some other test.
    worker = WorkerProcess("--engine", "local")  # not started: openai() only builds a client
    got: list[OpenAI] = []
    start = threading.Barrier(8)

    def take() -> None:
        start.wait()
        got.append(worker.openai())

    threads = [threading.Thread(target=take) for _ in range(8)]
    try:
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(30)
    finally:
        worker.stop()
    assert len(got) == 8
    assert len({id(client) for client in got}) == 1
    assert got[0].is_closed()  # the one client was closed with the worker
