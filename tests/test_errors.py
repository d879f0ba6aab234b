"""The error tree drawn in ``chainrt.errors`` is the real class hierarchy, and each error is raised
where its situation occurs."""

from __future__ import annotations

import importlib
import json
import re
import time

import pytest

import chainrt
import chainrt.errors as errors
from chainrt import wire
from chainrt.dispatch import LlmCall, make_dispatcher
from chainrt.dispatch._http_wire import error_from_response

_NODE = re.compile(r"^(?P<prefix>[ │├└─]*)(?P<name>[A-Z][A-Za-z]+)\s+(?P<doc>.*)$")
_WHERE = re.compile(r"^\((?P<module>[a-z_.]+)\)")

# Where chainrt defines or re-exports errors: importing them registers every subclass.
_MODULES = (
    "chainrt",
    "chainrt.dispatch",
    "chainrt.store",
    "chainrt.spec",
    "chainrt.concurrency",
    "chainrt.langchain",
    "chainrt.tracing",
    "chainrt.cli",
    "chainrt.serve",
    "chainrt.engines",
    "workers.server",
)


def _drawn_tree() -> list[tuple[int, str, str]]:
    """(depth, class name, module hint or "") for each line of the docstring's tree."""
    doc = errors.__doc__ or ""
    block = doc.split("The tree::", 1)[1].strip("\n").split("\n\n", 1)[0]
    nodes = []
    for line in block.splitlines():
        match = _NODE.match(line.strip("\n")[4:])  # the block is indented by 4
        assert match, f"unreadable tree line: {line!r}"
        prefix = match["prefix"]
        assert len(prefix) % 4 == 0, f"misaligned tree line: {line!r}"
        where = _WHERE.match(match["doc"])
        nodes.append((len(prefix) // 4, match["name"], where["module"] if where else ""))
    return nodes


def _class(name: str, module: str) -> type[BaseException]:
    cls = getattr(importlib.import_module(module or "chainrt.errors"), name)
    assert isinstance(cls, type), name
    assert issubclass(cls, BaseException), name
    return cls


def _public_subclasses(root: type[BaseException]) -> set[type[BaseException]]:
    found: set[type[BaseException]] = set()
    todo = [root]
    while todo:
        for sub in todo.pop().__subclasses__():
            todo.append(sub)
            if sub.__module__.split(".")[0] in (
                "chainrt",
                "workers",
            ) and not sub.__name__.startswith("_"):
                found.add(sub)
    return found


def test_the_drawn_tree_is_the_class_hierarchy() -> None:
    parents: list[type[BaseException]] = []
    drawn: dict[type[BaseException], type[BaseException] | None] = {}
    defined_here = set()
    for depth, name, module in _drawn_tree():
        cls = _class(name, module)
        if not module:
            defined_here.add(cls)
        del parents[depth:]
        assert len(parents) == depth, f"{name} is drawn deeper than its parent"
        drawn[cls] = parents[-1] if parents else None
        parents.append(cls)
    for cls, parent in drawn.items():
        expected = (parent,) if parent is not None else (Exception,)
        assert cls.__bases__ == expected, f"{cls.__name__} derives from {cls.__bases__}"
    root = errors.ChainRTError
    assert drawn[root] is None
    for module in _MODULES:
        importlib.import_module(module)
    missing = _public_subclasses(root) - set(drawn)
    assert not missing, f"errors missing from the drawn tree: {sorted(c.__name__ for c in missing)}"
    # chainrt.errors exports exactly the classes drawn without a "(module)" note.
    assert {getattr(errors, name) for name in errors.__all__} == defined_here


def test_every_error_is_one_class_wherever_it_is_imported_from() -> None:
    import chainrt._errors as compat
    import chainrt.dispatch as dispatch
    import chainrt.engines as engines
    from chainrt.engines import _base

    for name in errors.__all__:
        assert getattr(chainrt, name) is getattr(errors, name)
        assert getattr(compat, name) is getattr(errors, name)
    assert sorted(compat.__all__) == sorted(errors.__all__)
    assert dispatch.BackendError is errors.BackendError
    assert dispatch.DispatchFailed is errors.DispatchFailed
    assert engines.ContextLengthExceeded is _base.ContextLengthExceeded
    assert engines.ContextLengthExceeded is errors.ContextLengthExceeded


def test_retry_semantics_are_data() -> None:
    assert errors.StoreUnavailable("x").retryable
    assert not errors.RunNotFound("x").retryable
    assert errors.ChainRTError("x", retryable=True).retryable
    assert not errors.DispatchFailed("x", []).retryable
    assert not errors.NoEndpoint("x", []).retryable
    assert not errors.ContextLengthExceeded("x", prompt_tokens=9, context_tokens=8).retryable
    memory = errors.InsufficientMemory("full", advice_max_tokens=12, retry_after_s=0.5)
    assert (memory.retryable, memory.error_class) == (True, "overloaded")
    assert (memory.advice_max_tokens, memory.retry_after_s) == (12, 0.5)


def test_a_workers_memory_refusal_is_insufficient_memory_with_its_advice() -> None:
    body = wire.insufficient_memory_body("no room", max_tokens=40, retry_after_s=1.5)
    err = error_from_response(
        429, {"retry-after": "2"}, json.dumps(body).encode(), "http://worker:8000"
    )
    assert isinstance(err, errors.InsufficientMemory)
    assert (err.advice_max_tokens, err.retry_after_s, err.endpoint) == (
        40,
        1.5,
        "http://worker:8000",
    )
    assert err.message == "HTTP 429 insufficient_memory: no room"
    # Any other 429 (a full queue, a plain vLLM server) is overloaded, not a memory refusal.
    queue_full = json.dumps(wire.error_body(wire.QUEUE_FULL, "busy")).encode()
    other = error_from_response(429, {"retry-after": "2"}, queue_full, "http://w")
    assert type(other) is errors.BackendError
    assert (other.error_class, other.retry_after_s) == ("overloaded", 2.0)


async def test_no_endpoint_when_no_model_of_the_step_can_be_tried() -> None:
    dispatcher = make_dispatcher(None)  # only the in-process "local" model
    try:
        with pytest.raises(errors.NoEndpoint) as info:
            await dispatcher.complete(
                LlmCall(model="absent", messages=[("user", "hi")], fallbacks=["gone"]),
                time.time() + 5,
            )
    finally:
        await dispatcher.close()
    assert [(a.model, a.status) for a in info.value.attempts] == [
        ("absent", "skipped"),
        ("gone", "skipped"),
    ]
    assert "has an endpoint to try" in info.value.message
    assert "'absent' is not in the pool" in info.value.message


async def test_a_model_that_was_tried_and_failed_is_dispatch_failed_not_no_endpoint() -> None:
    dispatcher = make_dispatcher(None)
    try:
        # The deadline has passed: "local" exists and is tried, but gets no time.
        with pytest.raises(errors.DispatchFailed) as info:
            await dispatcher.complete(
                LlmCall(model="local", messages=[("user", "hi")]), time.time() - 1
            )
    finally:
        await dispatcher.close()
    assert type(info.value) is errors.DispatchFailed
    assert info.value.attempts[0].detail == "no time left"
