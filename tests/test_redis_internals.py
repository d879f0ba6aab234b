"""Every redis-py and asyncio internal that chainrt's Redis wire layer relies on, checked on the
installed redis-py against a real redis-server.

The hot path (``chainrt/redis/_lean.py``, ``_pipe.py``, ``_resp.py``, ``_resp_parse.py``,
``_cluster_lean.py``, ``_cluster_asking.py``, ``_cluster.py``; ``chainrt/store/_redis_client.py``,
``chainrt/concurrency/_redis_calls.py``, ``chainrt/_bus.py``) uses redis-py's connections without
its command layer: the private stream attributes of a connection, its error parser, the cluster
client's slot map and its nodes' connection pools, and it swaps the transport's protocol. None of
that is redis-py's public API. ``pyproject.toml`` pins the range of redis-py releases these checks
passed on; when a release changes one of them, the check fails naming the attribute and the
module that uses it (``scripts/test --latest-deps`` runs them against the newest release allowed).
"""

from __future__ import annotations

import asyncio
import inspect
from collections import deque
from collections.abc import AsyncIterator
from typing import Any

import pytest
import redis
import redis.asyncio as aioredis
from redis import exceptions as rx
from redis.asyncio.cluster import ClusterNode
from redis.crc import key_slot

from chainrt.redis import close_client, cluster_client

pytestmark = pytest.mark.redis

VERSION = f"redis-py {redis.__version__}"


def check(ok: bool, attribute: str, used_by: str, found: object = None) -> None:
    """Fail naming ``attribute`` and the chainrt module that uses it unless ``ok``."""
    if not ok:
        pytest.fail(
            f"{VERSION} changed {attribute} (used by {used_by}); found: {found!r}. "
            "Adapt that module or narrow the redis range in pyproject.toml.",
            pytrace=False,
        )


def attr(obj: object, name: str, where: str, used_by: str) -> Any:
    """``obj.name``, or a failure naming ``where.name`` and its user."""
    if not hasattr(obj, name):
        check(False, f"{where}.{name}", used_by, f"no attribute {name!r} on {type(obj).__name__}")
    return getattr(obj, name)


# -- module-level names ---------------------------------------------------------------------------


def test_module_level_names() -> None:
    from redis import backoff, crc
    from redis.asyncio import retry

    slot = attr(crc, "key_slot", "redis.crc", "redis/_cluster_lean.py, redis/keys.py")
    slots = attr(crc, "REDIS_CLUSTER_HASH_SLOTS", "redis.crc", "redis/keys.py")
    check(slots == 16384, "redis.crc.REDIS_CLUSTER_HASH_SLOTS", "redis/keys.py", slots)
    tagged, bare = slot(b"{run-1}:steps"), slot(b"run-1")
    check(tagged == bare, "redis.crc.key_slot (hash tags)", "redis/keys.py", (tagged, bare))

    retry_cls = attr(retry, "Retry", "redis.asyncio.retry", "redis/_lean.py")
    no_backoff = attr(backoff, "NoBackoff", "redis.backoff", "redis/_lean.py")
    attr(backoff, "ExponentialBackoff", "redis.backoff", "concurrency/_redis_calls.py")
    retry_cls(no_backoff(), 0)  # no retry: the callers retry


@pytest.mark.parametrize(
    ("name", "base"),
    [
        ("MovedError", "AskError"),  # REDIRECTED lists AskError for both
        ("AskError", "ResponseError"),
        ("TryAgainError", "ResponseError"),
        ("ClusterDownError", "ResponseError"),
        ("ReadOnlyError", "ResponseError"),
        ("NoScriptError", "ResponseError"),
        ("BusyLoadingError", "ConnectionError"),  # raised, not returned, by _resp_parse
        ("InvalidResponse", "RedisError"),
        ("TimeoutError", "RedisError"),
    ],
)
def test_error_classes(name: str, base: str) -> None:
    used_by = "redis/_cluster_lean.py (REDIRECTED, LOST), redis/_resp_parse.py"
    cls = attr(rx, name, "redis.exceptions", used_by)
    parent = attr(rx, base, "redis.exceptions", used_by)
    check(issubclass(cls, parent), f"redis.exceptions.{name} (a {base})", used_by, cls.__mro__)


# -- a plain client's connections -----------------------------------------------------------------


@pytest.fixture(params=[2, 3], ids=["resp2", "resp3"])
async def connected(redis_url: str, request: pytest.FixtureRequest) -> AsyncIterator[Any]:
    """A connected connection built as LeanRedis builds its own (the pool's class and kwargs)."""
    client = aioredis.Redis.from_url(redis_url, protocol=request.param)
    pool = client.connection_pool
    cls = attr(pool, "connection_class", "Redis.connection_pool", "redis/_lean.py")
    kwargs = attr(pool, "connection_kwargs", "Redis.connection_pool", "redis/_lean.py")
    check(isinstance(kwargs, dict), "ConnectionPool.connection_kwargs", "redis/_lean.py", kwargs)
    conn = cls(**{**kwargs, "socket_timeout": None})
    try:
        await conn.connect()
        yield conn
    finally:
        await conn.disconnect(nowait=True)
        await client.aclose()


async def test_make_connection_builds_without_connecting(redis_url: str) -> None:
    client = aioredis.Redis.from_url(redis_url)
    make = attr(client.connection_pool, "make_connection", "ConnectionPool",
                "store/_redis_client.py")  # fmt: skip
    conn = make()
    check(not conn.is_connected, "ConnectionPool.make_connection (no connect)",
          "store/_redis_client.py", conn)  # fmt: skip
    await client.aclose()


async def test_connection_streams(connected: Any) -> None:
    used_by = "redis/_resp.py, redis/_pipe.py"
    check(connected.is_connected is True, "Connection.is_connected", "redis/_lean.py",
          connected.is_connected)  # fmt: skip
    reader = attr(connected, "_reader", "Connection", used_by)
    writer = attr(connected, "_writer", "Connection", used_by)
    check(isinstance(reader, asyncio.StreamReader), "Connection._reader (a StreamReader)",
          used_by, type(reader))  # fmt: skip
    check(isinstance(writer, asyncio.StreamWriter), "Connection._writer (a StreamWriter)",
          used_by, type(writer))  # fmt: skip
    buffer = attr(reader, "_buffer", "asyncio.StreamReader", "redis/_pipe.py")
    check(isinstance(buffer, bytearray), "StreamReader._buffer (a bytearray)", "redis/_pipe.py",
          type(buffer))  # fmt: skip
    # The pipe takes the connection over right after connect: the handshake's replies (HELLO,
    # CLIENT SETINFO, ...) must all have been read by then.
    check(len(buffer) == 0, "Connection.connect (handshake replies read)", "redis/_pipe.py",
          bytes(buffer))  # fmt: skip
    writer.write(b"*1\r\n$4\r\nPING\r\n")
    await writer.drain()
    reply = await reader.read(65536)
    check(reply == b"+PONG\r\n", "Connection._reader/_writer (raw RESP)", used_by, reply)


async def test_the_transport_protocol_can_be_swapped(connected: Any) -> None:
    used_by = "redis/_pipe.py (_Replies)"
    transport = attr(connected._writer, "transport", "Connection._writer", used_by)
    stream = transport.get_protocol()
    for name in ("connection_lost", "pause_writing", "resume_writing"):
        attr(stream, name, "the connection's stream protocol", used_by)
    got: asyncio.Queue[bytes] = asyncio.Queue()

    class Recording(asyncio.Protocol):
        def data_received(self, data: bytes) -> None:
            got.put_nowait(data)

    transport.set_protocol(Recording())
    try:
        connected._writer.write(b"*2\r\n$4\r\nECHO\r\n$2\r\nhi\r\n")
        data = await asyncio.wait_for(got.get(), 10)
        check(data.endswith(b"hi\r\n"), "transport.set_protocol (replies to the new protocol)",
              used_by, data)  # fmt: skip
    finally:
        transport.set_protocol(stream)


async def test_the_encoder_decodes_as_the_client_asks(redis_url: str) -> None:
    used_by = "redis/_resp_parse.py"
    for decode, want in ((False, b"caf\xc3\xa9"), (True, "café")):
        client = aioredis.Redis.from_url(redis_url, decode_responses=decode)
        conn = attr(client.connection_pool, "make_connection", "ConnectionPool", used_by)()
        encoder = attr(conn, "encoder", "Connection", used_by)
        got = encoder.decode(b"caf\xc3\xa9")
        check(got == want, f"Connection.encoder.decode (decode_responses={decode})", used_by, got)
        await client.aclose()


@pytest.mark.parametrize(
    ("reply", "name"),
    [
        ("NOSCRIPT No matching script", "NoScriptError"),
        ("MOVED 3999 127.0.0.1:6381", "MovedError"),
        ("ASK 3999 127.0.0.1:6381", "AskError"),
        ("TRYAGAIN Multiple keys request during rehashing of slot", "TryAgainError"),
        ("CLUSTERDOWN The cluster is down", "ClusterDownError"),
        ("READONLY You can't write against a read only replica.", "ReadOnlyError"),
        ("LOADING Redis is loading the dataset in memory", "BusyLoadingError"),
        ("WRONGTYPE Operation against a key holding the wrong kind of value", "ResponseError"),
    ],
)
async def test_the_error_parser_makes_redis_pys_exceptions(
    connected: Any, reply: str, name: str
) -> None:
    used_by = "redis/_resp_parse.py (error_reply), redis/_cluster_lean.py (REDIRECTED)"
    parser = attr(connected, "_parser", "Connection", used_by)
    parse_error = attr(parser, "parse_error", "Connection._parser", used_by)
    error = parse_error(reply)
    check(type(error) is getattr(rx, name), f"Connection._parser.parse_error({reply.split()[0]})",
          used_by, type(error))  # fmt: skip


async def test_disconnect_nowait(connected: Any) -> None:
    params = inspect.signature(connected.disconnect).parameters
    check("nowait" in params, "Connection.disconnect(nowait=)", "redis/_lean.py, redis/_pipe.py",
          list(params))  # fmt: skip
    await connected.disconnect(nowait=True)
    check(not connected.is_connected, "Connection.disconnect", "redis/_lean.py",
          connected.is_connected)  # fmt: skip


async def test_pubsub(redis_url: str) -> None:
    used_by = "chainrt/_bus.py, concurrency/_redis_wakeups.py"
    client = aioredis.Redis.from_url(redis_url)
    pubsub = client.pubsub(ignore_subscribe_messages=True)
    try:
        await pubsub.subscribe("chainrt-internals")
        await client.publish("chainrt-internals", b"x")
        message = None
        for _ in range(50):  # the subscribe reply is skipped; the message follows
            message = await pubsub.get_message(timeout=1.0)
            if message is not None:
                break
        check(isinstance(message, dict) and message.get("data") == b"x",
              "PubSub.get_message (a dict with 'data')", used_by, message)  # fmt: skip
    finally:
        await attr(pubsub, "aclose", "PubSub", used_by)()
        await client.aclose()


# -- the cluster client ---------------------------------------------------------------------------


def test_cluster_node_pool() -> None:
    used_by = "redis/_lean.py (of_node), redis/_cluster_asking.py"
    node = ClusterNode("127.0.0.1", 7000)
    check(attr(node, "name", "ClusterNode", used_by) == "127.0.0.1:7000", "ClusterNode.name",
          used_by, node.name)  # fmt: skip
    check((node.host, node.port) == ("127.0.0.1", 7000), "ClusterNode.host/.port",
          "concurrency/_redis_calls.py", (node.host, node.port))  # fmt: skip
    check(isinstance(attr(node, "connection_class", "ClusterNode", used_by), type),
          "ClusterNode.connection_class", used_by, node.connection_class)  # fmt: skip
    check(isinstance(attr(node, "connection_kwargs", "ClusterNode", used_by), dict),
          "ClusterNode.connection_kwargs", used_by, node.connection_kwargs)  # fmt: skip
    # AskingSafeCluster turns the free connections last-in-first-out: redis-py must take them
    # with _free.popleft() and give them back with _free.append().
    free = getattr(node, "_free", None)
    check(type(free) is deque, "ClusterNode._free (a deque)", "redis/_cluster_asking.py",
          type(free))  # fmt: skip
    source = inspect.getsource(ClusterNode)
    check("_free.popleft()" in source and "_free.append(" in source,
          "ClusterNode acquires with _free.popleft() and releases with _free.append()",
          "redis/_cluster_asking.py", None)  # fmt: skip


@pytest.mark.cluster
async def test_cluster_client_slot_map(cluster_url: str) -> None:
    used_by = "redis/_cluster_lean.py, redis/_cluster_asking.py, redis/_cluster.py"
    client = cluster_client(cluster_url)
    try:
        await client.initialize()
        manager = attr(client, "nodes_manager", "RedisCluster", used_by)
        slots = attr(manager, "slots_cache", "RedisCluster.nodes_manager", used_by)
        check(isinstance(slots, dict) and len(slots) == 16384,
              "nodes_manager.slots_cache (slot -> nodes)", used_by, type(slots))  # fmt: skip
        master = slots[0][0]
        check(isinstance(master, ClusterNode), "nodes_manager.slots_cache[slot][0] (a ClusterNode)",
              used_by, master)  # fmt: skip
        for name in ("startup_nodes", "nodes_cache", "connection_kwargs"):
            found = attr(manager, name, "RedisCluster.nodes_manager", used_by)
            check(isinstance(found, dict), f"nodes_manager.{name} (a dict)", used_by, type(found))
        params = inspect.signature(manager.aclose).parameters
        check("attr" in params, "nodes_manager.aclose(attr)", "redis/_cluster.py", list(params))
        node = client.get_node_from_key("k")
        node_name = None if node is None else node.name
        check(node_name == slots[key_slot(b"k")][0].name, "RedisCluster.get_node_from_key",
              "store/_redis_client.py", node)  # fmt: skip
        check(master in client.get_primaries(), "RedisCluster.get_primaries",
              "concurrency/_redis_calls.py", client.get_primaries())  # fmt: skip
        # AskingSafeCluster took over every node's free connections.
        free = [type(getattr(n, "_free", None)).__name__ for n in manager.nodes_cache.values()]
        check(set(free) == {"LastInFirstOut"}, "ClusterNode._free (replaced after initialize)",
              "redis/_cluster_asking.py", free)  # fmt: skip
    finally:
        await close_client(client)
