"""The guard around one backend attempt (``chainrt/dispatch/_checks.bounded``): a backend that
does not stop at the attempt's end is cut a little after it, and the cut names the endpoint the
attempt went to, as the backend's own timeout would."""

from __future__ import annotations

import asyncio
import time

import pytest

from chainrt.dispatch._backend import BackendAnswer
from chainrt.dispatch._checks import bounded
from chainrt.errors import BackendError


async def stuck() -> BackendAnswer:
    await asyncio.sleep(30)
    raise AssertionError("not cut")


async def quick() -> BackendAnswer:
    return BackendAnswer(
        text="ok", finish_reason="stop", prompt_tokens=1, completion_tokens=1, endpoint="http://a"
    )


async def test_a_cut_names_the_endpoint_the_attempt_went_to() -> None:
    went = ["http://a", "http://b"]
    with pytest.raises(BackendError) as cut:
        await bounded(stuck(), time.time() + 0.05, went)
    assert cut.value.error_class == "timeout"
    assert cut.value.endpoint == "http://b"


async def test_a_cut_before_any_endpoint_was_picked_names_none() -> None:
    with pytest.raises(BackendError) as cut:
        await bounded(stuck(), time.time() + 0.05)
    assert cut.value.error_class == "timeout"
    assert cut.value.endpoint is None


async def test_an_answer_in_time_passes_through() -> None:
    got = await bounded(quick(), time.time() + 5, ["http://a"])
    assert got.text == "ok"
