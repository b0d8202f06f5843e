"""The one store: conversation state in Redis through ``redis.asyncio``.

Every data method either succeeds within ``op_timeout`` seconds or raises
``StoreUnavailable``; the server catches that and degrades (DESIGN invariant 7). Every
write sets a TTL. Keys come from ``proxy.store.keys``: one conversation shares one hash
tag, so each script below touches a single slot and the same code runs on Redis Cluster
(``?cluster=1`` in the URL, or ``cluster=True``).
"""

from __future__ import annotations

import asyncio
import logging
import math
import secrets
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar, cast
from urllib.parse import parse_qsl, urlencode, urlsplit, urlunsplit

import orjson
from redis.asyncio import BlockingConnectionPool, Redis
from redis.asyncio.cluster import RedisCluster
from redis.asyncio.retry import Retry
from redis.backoff import NoBackoff
from redis.exceptions import RedisError

from proxy.core.errors import StoreUnavailable as StoreUnavailable  # callers degrade on it
from proxy.store import keys

log = logging.getLogger(__name__)

T = TypeVar("T")

DEFAULT_TTL = 7 * 86400

# (slice, total length) in one round trip; nil when the key does not exist, so a missing
# blob and an empty one differ. ARGV: start >= 0, length >= 1.
_SLICE = """
local total = redis.call('STRLEN', KEYS[1])
if total == 0 and redis.call('EXISTS', KEYS[1]) == 0 then return false end
local start = tonumber(ARGV[1])
return {redis.call('GETRANGE', KEYS[1], start, start + tonumber(ARGV[2]) - 1), total}
"""

# Delete or extend a lock only while it still holds the caller's token.
_RELEASE = """
if redis.call('GET', KEYS[1]) == ARGV[1] then return redis.call('DEL', KEYS[1]) end
return 0
"""
_EXTEND = """
if redis.call('GET', KEYS[1]) == ARGV[1] then return redis.call('PEXPIRE', KEYS[1], ARGV[2]) end
return 0
"""

# A running mean over at most ARGV[2] samples (beyond that, an exponential moving average
# with weight 1/cap), updated atomically so concurrent replicas never lose a sample. The
# mean travels as a string: Redis turns Lua numbers in replies into integers.
_MEAN = """
local mean = tonumber(redis.call('HGET', KEYS[1], 'mean') or '0')
local n = tonumber(redis.call('HGET', KEYS[1], 'samples') or '0')
if n < tonumber(ARGV[2]) then n = n + 1 end
mean = mean + (tonumber(ARGV[1]) - mean) / n
local text = string.format('%.17g', mean)
redis.call('HSET', KEYS[1], 'mean', text, 'samples', n)
redis.call('EXPIRE', KEYS[1], ARGV[3])
return {text, n}
"""


# Reset the expiry of several keys of one conversation (one slot); counts those that exist.
_TOUCH = """
local found = 0
for _, key in ipairs(KEYS) do found = found + redis.call('EXPIRE', key, ARGV[1]) end
return found
"""


def _split_cluster_flag(url: str) -> tuple[str, bool]:
    """Remove a ``cluster=`` query option (redis-py would reject it) and return its value."""
    parts = urlsplit(url)
    query = parse_qsl(parts.query, keep_blank_values=True)
    flags = [v for k, v in query if k == "cluster"]
    if not flags:
        return url, False
    rest = urlencode([(k, v) for k, v in query if k != "cluster"])
    enabled = flags[-1].strip().lower() in {"1", "true", "yes", "on"}
    return urlunsplit(parts._replace(query=rest)), enabled


def _positive(label: str, value: int) -> int:
    # Redis rejects "EX 60.0"; catch a float here, not as a StoreUnavailable on every write.
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"{label} must be an int, got {value!r}")
    if value <= 0:
        raise ValueError(f"{label} must be positive, got {value}")
    return value


class Store:
    """Conversation-scoped blobs, JSON values and locks, plus a few global values."""

    on_error: Callable[[], object] | None = None  # told of every failed call (metrics)

    def __init__(
        self,
        client: Redis | RedisCluster,
        *,
        prefix: str = "cp:",
        op_timeout: float = 0.5,
        default_ttl: int = DEFAULT_TTL,
    ) -> None:
        self._client = client
        self.prefix = keys.check_prefix(prefix)
        self.op_timeout = op_timeout
        self.default_ttl = _positive("default_ttl", default_ttl)
        self.is_cluster = isinstance(client, RedisCluster)
        self._slice = client.register_script(_SLICE)
        self._release = client.register_script(_RELEASE)
        self._extend = client.register_script(_EXTEND)
        self._mean = client.register_script(_MEAN)
        self._touch = client.register_script(_TOUCH)

    @classmethod
    def from_url(
        cls,
        url: str,
        *,
        prefix: str = "cp:",
        op_timeout: float = 0.5,
        default_ttl: int = DEFAULT_TTL,
        cluster: bool | None = None,
        max_connections: int = 64,
    ) -> Store:
        """Connect lazily to ``redis://``, ``rediss://`` or ``unix://`` URLs.

        ``cluster`` (or ``?cluster=1`` in the URL) selects Redis Cluster; the argument wins
        over the URL. No connection is made until the first call. Beyond
        ``max_connections`` concurrent calls wait for a free connection (within the
        timeout) instead of failing, as redis-py's default pool would at 100.
        """
        url, flagged = _split_cluster_flag(url)
        options: dict[str, Any] = {
            "socket_timeout": op_timeout,
            "socket_connect_timeout": op_timeout,
            # One immediate retry heals a pooled connection that a Redis restart closed;
            # the op_timeout around every call bounds the total either way.
            "retry": Retry(NoBackoff(), 1),
        }
        client: Redis | RedisCluster
        if cluster if cluster is not None else flagged:
            client = RedisCluster.from_url(url, **options)
        else:
            pool = BlockingConnectionPool.from_url(
                url, max_connections=max_connections, timeout=op_timeout, **options
            )
            client = Redis.from_pool(pool)  # the client owns the pool and closes it
        return cls(client, prefix=prefix, op_timeout=op_timeout, default_ttl=default_ttl)

    # -- plumbing ---------------------------------------------------------------------

    async def _call(self, operation: Callable[[], Awaitable[T]]) -> T:
        try:
            async with asyncio.timeout(self.op_timeout):
                return await operation()
        except (RedisError, OSError, TimeoutError) as error:
            if self.on_error is not None:
                self.on_error()
            raise StoreUnavailable(f"redis: {type(error).__name__}: {error}") from error

    def register_script(self, source: str) -> Any:
        """A Lua script on this store's client, for other store modules (run it with
        ``run`` so it gets the timeout and StoreUnavailable like every call)."""
        return self._client.register_script(source)

    async def run(self, operation: Callable[[], Awaitable[T]]) -> T:
        """Any client call under the store's timeout; failures are StoreUnavailable."""
        return await self._call(operation)

    @property
    def client(self) -> Redis | RedisCluster:
        return self._client

    async def _get(self, key: str) -> bytes | None:
        # Replies are bytes: the client is built without decode_responses.
        return cast("bytes | None", await self._call(lambda: self._client.get(key)))

    def _key(self, tenant: str, conversation: str, kind: str, name: str) -> str:
        return keys.conversation_key(self.prefix, tenant, conversation, kind, name)

    def _ttl(self, ttl: int | None) -> int:
        return self.default_ttl if ttl is None else _positive("ttl", ttl)

    @staticmethod
    def _decode(key: str, raw: bytes | None) -> object | None:
        if raw is None:
            return None
        try:
            return cast(object, orjson.loads(raw))
        except orjson.JSONDecodeError:
            # Treat as missing: the caller recomputes and overwrites it.
            log.warning("store: undecodable JSON at %s, treated as missing", key)
            return None

    async def ping(self) -> bool:
        """True when Redis answers within the timeout; never raises."""
        try:
            return bool(await self._call(self._client.ping))
        except StoreUnavailable:
            return False

    async def close(self) -> None:
        try:
            async with asyncio.timeout(self.op_timeout):
                await self._client.aclose()
        except (RedisError, OSError, TimeoutError) as error:
            log.debug("store: close failed: %s", error)

    # -- blobs (offloaded tool results) ------------------------------------------------

    async def put_blob(
        self, tenant: str, conversation: str, ref: str, data: bytes, ttl: int | None = None
    ) -> None:
        key = self._key(tenant, conversation, keys.BLOB, ref)
        await self._call(lambda: self._client.set(key, data, ex=self._ttl(ttl)))

    async def get_blob(self, tenant: str, conversation: str, ref: str) -> bytes | None:
        key = self._key(tenant, conversation, keys.BLOB, ref)
        return await self._get(key)

    async def get_blob_slice(
        self, tenant: str, conversation: str, ref: str, start: int, length: int
    ) -> tuple[bytes, int] | None:
        """Bytes ``[start, start + length)`` of a blob and its total length, or None.

        A start past the end gives empty bytes; negative arguments raise ValueError (the
        caller checks the model's input and answers with a tool error).
        """
        if start < 0 or length < 0:
            raise ValueError(f"slice start and length must be >= 0, got {start}, {length}")
        key = self._key(tenant, conversation, keys.BLOB, ref)
        if length == 0:
            # GETRANGE's end is inclusive, so an empty slice cannot be expressed in it.
            total = await self._call(lambda: self._strlen_if_exists(key))
            return None if total is None else (b"", total)
        reply = await self._call(lambda: self._slice(keys=[key], args=[start, length]))
        if reply is None:
            return None
        data, total = reply
        return bytes(data), int(total)

    async def _strlen_if_exists(self, key: str) -> int | None:
        reply = await self._slice(keys=[key], args=[0, 1])
        return None if reply is None else int(reply[1])

    # -- JSON values (checkpoints, summaries, ...) -------------------------------------

    async def put_json(
        self,
        tenant: str,
        conversation: str,
        kind: str,
        name: str,
        value: object,
        ttl: int | None = None,
    ) -> None:
        key = self._key(tenant, conversation, kind, name)
        data = orjson.dumps(value)
        await self._call(lambda: self._client.set(key, data, ex=self._ttl(ttl)))

    async def get_json(self, tenant: str, conversation: str, kind: str, name: str) -> object | None:
        key = self._key(tenant, conversation, kind, name)
        return self._decode(key, await self._get(key))

    async def refresh_ttl(
        self, tenant: str, conversation: str, kind: str, names: list[str], ttl: int | None = None
    ) -> int:
        """Give existing keys a fresh TTL (e.g. the blobs a frozen prefix still points
        to, whose first TTL was set at an older crossing); returns how many exist."""
        if not names:
            return 0
        found = [self._key(tenant, conversation, kind, name) for name in names]
        seconds = self._ttl(ttl)
        return int(await self._call(lambda: self._touch(keys=found, args=[seconds])))

    # -- locks ---------------------------------------------------------------------------

    async def acquire_lock(
        self, tenant: str, conversation: str, name: str, ttl_ms: int
    ) -> str | None:
        """A token when the lock was free (it expires after ``ttl_ms``), else None."""
        key = self._key(tenant, conversation, keys.LOCK, name)
        token = secrets.token_hex(16)
        px = _positive("ttl_ms", ttl_ms)
        taken = await self._call(lambda: self._client.set(key, token, nx=True, px=px))
        return token if taken else None

    async def release_lock(self, tenant: str, conversation: str, name: str, token: str) -> bool:
        """True when this token held the lock and it is now released."""
        key = self._key(tenant, conversation, keys.LOCK, name)
        return bool(await self._call(lambda: self._release(keys=[key], args=[token])))

    async def extend_lock(
        self, tenant: str, conversation: str, name: str, token: str, ttl_ms: int
    ) -> bool:
        """Reset the lock's expiry to ``ttl_ms`` if this token still holds it."""
        key = self._key(tenant, conversation, keys.LOCK, name)
        px = _positive("ttl_ms", ttl_ms)
        return bool(await self._call(lambda: self._extend(keys=[key], args=[token, px])))

    # -- global values (calibration per model, ...) --------------------------------------

    async def put_global_json(
        self, kind: str, name: str, value: object, ttl: int | None = None
    ) -> None:
        key = keys.global_key(self.prefix, kind, name)
        data = orjson.dumps(value)
        await self._call(lambda: self._client.set(key, data, ex=self._ttl(ttl)))

    async def get_global_json(self, kind: str, name: str) -> object | None:
        key = keys.global_key(self.prefix, kind, name)
        return self._decode(key, await self._get(key))

    async def update_global_mean(
        self, kind: str, name: str, sample: float, max_samples: int = 100, ttl: int | None = None
    ) -> tuple[float, int]:
        """Fold ``sample`` into a stored running mean; returns (mean, samples counted)."""
        if not math.isfinite(sample):
            raise ValueError(f"sample must be finite, got {sample}")
        key = keys.global_key(self.prefix, kind, name)
        cap = _positive("max_samples", max_samples)
        args: list[str | int] = [repr(float(sample)), cap, self._ttl(ttl)]
        text, count = await self._call(lambda: self._mean(keys=[key], args=args))
        return float(text), int(count)

    async def get_global_mean(self, kind: str, name: str) -> tuple[float, int] | None:
        key = keys.global_key(self.prefix, kind, name)
        fields = await self._call(lambda: self._client.hmget(key, ["mean", "samples"]))
        mean, count = fields
        if mean is None or count is None:
            return None
        return float(mean), int(count)
