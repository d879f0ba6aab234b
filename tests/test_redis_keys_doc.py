"""``docs/redis-cluster.md``'s key table against ``chainrt/redis/keys.py``, the one builder of keys.

Every key or channel a builder of :mod:`chainrt.redis.keys` makes (each public function, method or
property annotated to return ``str`` or ``KeyNames``, called with ``<placeholder>`` arguments) must
be a row of the table, and every key the table lists must come out of a builder: a key added in
code without its row, or a row left behind by a key removed, fails here naming it.
"""

from __future__ import annotations

import inspect
import re
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from chainrt.redis import keys

DOC = Path(__file__).resolve().parent.parent / "docs" / "redis-cluster.md"

NOT_KEYS = {"check_run_id", "check_prefix", "slot_tag", "lists_tag", "wake_channel_prefix"}
"""Public names returning ``str`` that build no key: checks, hash tags, a channel's prefix."""

PLACEHOLDERS = {
    "run_id": "<run_id>",
    "name": "<name>",
    "chain": "<name>",
    "status": "<status>",
    "key": "<key>",
    "instance": "<instance>",
    "priority": "<priority>",
    "prefix": keys.LIMITER_PREFIX,  # (only the limiter's builders take it without a default)
    "slot": 0,
}


def _variants(fn: Callable[..., Any]) -> Iterator[dict[str, Any]]:
    """Keyword arguments for ``fn``: placeholders for what has no default, and for an optional
    ``None`` argument both without it and with its placeholder."""
    required: dict[str, Any] = {}
    optional: list[str] = []
    for param in inspect.signature(fn).parameters.values():
        if param.name == "self":
            continue
        if param.default is inspect.Parameter.empty:
            required[param.name] = PLACEHOLDERS[param.name]
        elif param.default is None:
            optional.append(param.name)
    yield required
    for name in optional:
        yield {**required, name: PLACEHOLDERS[name]}


def _returns_key(fn: Callable[..., Any]) -> bool:
    return inspect.signature(fn).return_annotation in ("str", "KeyNames")


def _built() -> set[str]:
    out: list[str] = []
    for name, obj in vars(keys).items():
        if name.startswith("_") or name in NOT_KEYS:
            continue
        fn = inspect.unwrap(obj) if callable(obj) else obj  # (key_names is cached)
        if inspect.isfunction(fn) and fn.__module__ == keys.__name__ and _returns_key(fn):
            for kwargs in _variants(fn):
                value = obj(**kwargs)
                out.extend(value if isinstance(value, tuple) else [value])
        elif inspect.isclass(obj) and obj.__module__ == keys.__name__ and obj is not keys.KeyNames:
            instance = obj()
            for attr, member in vars(obj).items():
                if attr.startswith("_") or attr in NOT_KEYS:
                    continue
                if isinstance(member, property) and member.fget and _returns_key(member.fget):
                    out.append(getattr(instance, attr))
                elif inspect.isfunction(member) and _returns_key(member):
                    out.extend(getattr(instance, attr)(**kw) for kw in _variants(member))
    tags = {keys.StoreKeys().lists_tag: "<ix>", keys.slot_tag(0): "<tag>"}
    return {re.sub(r"\{(ix[0-9a-f]+)\}", lambda m: "{" + tags[m[1]] + "}", k) for k in out}


def _documented() -> set[str]:
    text = DOC.read_text()
    table = text[text.index("| key | type | what |") :]
    lines = table.splitlines()
    rows = lines[: next((i for i, line in enumerate(lines) if not line.startswith("|")), None)]
    found: set[str] = set()
    for row in rows[2:]:  # past the header and its rule
        first = row.split("|")[1]
        found.update(re.findall(r"`([^`]+)`", first))
    return found


def test_every_key_built_is_documented() -> None:
    missing = sorted(_built() - _documented())
    assert not missing, (
        f"keys built by chainrt/redis/keys.py but missing from {DOC.name}'s key table: {missing}"
    )


def test_nothing_documented_that_keys_py_does_not_build() -> None:
    extra = sorted(_documented() - _built())
    assert not extra, (
        f"{DOC.name}'s key table lists keys chainrt/redis/keys.py never builds: {extra}"
    )


def test_the_composite_builders_use_the_documented_ones() -> None:
    store = keys.StoreKeys()
    statuses = keys.run_statuses()
    assert store.status_sets() == tuple(store.by_status(s) for s in statuses)
    assert store.chain_status_sets("c") == tuple(store.by_chain_status("c", s) for s in statuses)
    assert store.run_and_steps("r") == (store.run("r"), store.steps("r"))
    assert keys.stream_key("low", chain="c") == keys.QueueKeys().stream("low", "c")
    assert keys.wake_channel("p", "i") == keys.wake_channel_prefix("p") + "i"
