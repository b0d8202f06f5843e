"""The one store: conversation state in Redis through ``redis.asyncio``.

Every data method either succeeds within ``op_timeout`` seconds of Redis's time (the
event loop's lateness is not counted: proxy/store/deadline.py) or raises
``StoreUnavailable``; the server catches that and degrades
(docs/design.md#degrade-never-fail). Every write sets a TTL. Keys come from
``proxy.store.keys``: one conversation shares one hash tag, so each script below touches
a single slot and the same code runs on Redis Cluster (``?cluster=1`` in the URL, or
``cluster=True``). Blobs are stored once per tenant and compressed
(``proxy.store.codec``); JSON values over 1 KB are compressed too.

The compaction executor uses these calls, one Redis round trip each on a single Redis:
``load_conversation``, ``save_crossing``, ``read_blob`` and ``touch_refs``; in the
background, ``put_note`` (a summary made ahead) and ``touch_line`` (a line taken again).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
import secrets
from collections.abc import Awaitable, Callable, Mapping, Sequence
from typing import Any, TypeVar, cast
from urllib.parse import parse_qsl, urlencode, urlsplit, urlunsplit

import orjson
from redis.asyncio import BlockingConnectionPool, Redis
from redis.asyncio.cluster import RedisCluster
from redis.asyncio.retry import Retry
from redis.backoff import NoBackoff
from redis.exceptions import RedisError

from proxy import tracing
from proxy.core.errors import StoreUnavailable as StoreUnavailable  # callers degrade on it
from proxy.store import keys
from proxy.store.blobcache import DEFAULT_CHARS, BlobCache
from proxy.store.codec import CorruptValue, pack, pack_texts, unpack
from proxy.store.crossing import (
    MAX_CROSSING_SECONDS,
    MISSING,
    SAVE_CROSSING,
    ConversationState,
    CrossingSaved,
    CrossingWrite,
    LineMemo,
    crossing_timeout,
    failed,
)
from proxy.store.deadline import Deadline
from proxy.store.memory import StoreMemory, from_info

log = logging.getLogger(__name__)

T = TypeVar("T")

DEFAULT_TTL = 7 * 86400
# JSON values at least this long are stored compressed; shorter ones stay plain JSON.
JSON_COMPRESS_MIN = 1024
# Packing or unpacking more than this many bytes runs in a worker thread (zstd releases
# the GIL), so a big crossing does not stall the event loop.
OFF_LOOP_BYTES = 256 * 1024
MAX_REF_CHARS = 200

# Delete a lock only while it still holds the caller's token.
_RELEASE = """
if redis.call('GET', KEYS[1]) == ARGV[1] then return redis.call('DEL', KEYS[1]) end
return 0
"""

# A running mean over at most ARGV[2] samples (beyond that, an exponential moving average
# with weight 1/cap), updated atomically so concurrent replicas never lose a sample. The
# mean travels as a string: Redis turns Lua numbers in replies into integers.
_MEAN = """
local mean = tonumber(redis.call('HGET', KEYS[1], 'mean') or '0')
local n = tonumber(redis.call('HGET', KEYS[1], 'samples') or '0')
local cap = tonumber(ARGV[1])
for i = 3, #ARGV do
  if n < cap then n = n + 1 end
  mean = mean + (tonumber(ARGV[i]) - mean) / n
end
local text = string.format('%.17g', mean)
redis.call('HSET', KEYS[1], 'mean', text, 'samples', n)
redis.call('EXPIRE', KEYS[1], ARGV[2])
return {text, n}
"""


# Set a line's clock, if the line (its checkpoint field) is still there.
_TOUCH_LINE = """
if redis.call('HEXISTS', KEYS[1], 'c:' .. ARGV[1]) == 1 then
  return redis.call('HSET', KEYS[1], 'u:' .. ARGV[1], ARGV[2])
end
return 0
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


def node_url(url: str) -> str:
    """The URL of the one node a store URL names (a Cluster's start-up node: its
    `cluster=` option removed), for a connection of its own (a subscription)."""
    return _split_cluster_flag(url)[0]


def _positive(label: str, value: int) -> int:
    # Redis rejects "EX 60.0"; catch a float here, not as a StoreUnavailable on every write.
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"{label} must be an int, got {value!r}")
    if value <= 0:
        raise ValueError(f"{label} must be positive, got {value}")
    return value


def _describe(error: BaseException) -> str:
    """An error for logs: its kind and Redis's words, never the command's arguments
    (redis-py puts a failed pipeline command, values included, in its message)."""
    text = str(error)
    _, marker, said = text.partition(" of pipeline caused error: ")
    return f"redis: {type(error).__name__}: {said if marker else text}"[:300]


def _plausible_ref(ref: str) -> bool:
    # Refs come back from the model: anything odd reads as missing, never as an error.
    return 0 < len(ref) <= MAX_REF_CHARS and not any(c.isspace() for c in ref)


_UNTRACED: contextlib.nullcontext[None] = contextlib.nullcontext()


def _operation_name(operation: Callable[..., object]) -> str:
    """`Store.load_conversation` for a lambda made in that method, `Redis.ping` for a
    bound method: what a Redis span is named (a fixed word, never a key)."""
    qualname = getattr(operation, "__qualname__", "") or type(operation).__qualname__
    return qualname.partition(".<locals>")[0] or "call"


class Store:
    """Tenant-scoped blobs; conversation-scoped JSON values and locks; a few globals."""

    on_error: Callable[[], object] | None = None  # told of every failed call (metrics)
    # Told how many refs were found unreadable: a read of a blob that is not stored (never
    # stored, evicted, expired, or another tenant's), or a refresh that found it gone.
    on_unreadable: Callable[[int], object] | None = None

    def __init__(
        self,
        client: Redis | RedisCluster,
        *,
        prefix: str = "cp:",
        op_timeout: float = 0.5,
        default_ttl: int = DEFAULT_TTL,
        blob_cache_chars: int = DEFAULT_CHARS,
    ) -> None:
        self._client = client
        self.prefix = keys.check_prefix(prefix)
        self.op_timeout = op_timeout
        self.default_ttl = _positive("default_ttl", default_ttl)
        self.is_cluster = isinstance(client, RedisCluster)
        self.blob_cache = BlobCache(blob_cache_chars)
        self._lines = LineMemo()
        self._release = client.register_script(_RELEASE)
        self._mean = client.register_script(_MEAN)
        self._touch = client.register_script(_TOUCH)
        self._touch_line = client.register_script(_TOUCH_LINE)

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
        blob_cache_chars: int = DEFAULT_CHARS,
    ) -> Store:
        """Connect lazily to ``redis://``, ``rediss://`` or ``unix://`` URLs.

        ``cluster`` (or ``?cluster=1`` in the URL) selects Redis Cluster; the argument wins
        over the URL. No connection is made until the first call. Beyond
        ``max_connections`` concurrent calls wait for a free connection (within the
        timeout) instead of failing, as redis-py's default pool would at 100.
        """
        url, flagged = _split_cluster_flag(url)
        # Every call is bounded by its own asyncio timeout (op_timeout, or longer for a
        # crossing's write); the socket's timeouts only guard against a call left waiting.
        # They must not fire first: on a Cluster a connect or read timeout makes redis-py
        # disconnect the node's idle connections, racing with calls that just took one.
        backstop = max(op_timeout, MAX_CROSSING_SECONDS)
        options: dict[str, Any] = {
            "socket_timeout": backstop,
            "socket_connect_timeout": backstop,
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
        return cls(
            client,
            prefix=prefix,
            op_timeout=op_timeout,
            default_ttl=default_ttl,
            blob_cache_chars=blob_cache_chars,
        )

    # -- plumbing ---------------------------------------------------------------------

    async def _call(
        self, operation: Callable[[], Awaitable[T]], seconds: float = 0.0, name: str = ""
    ) -> T:
        active = tracing.ACTIVE
        # With tracing on, a span per round trip, named by the method making it.
        span = (
            _UNTRACED if active is None else active.store_span(name or _operation_name(operation))
        )
        try:
            with span:
                async with Deadline(seconds or self.op_timeout):
                    return await operation()
        except (RedisError, OSError, TimeoutError, AttributeError) as error:
            # AttributeError: redis-py's Cluster client, after a node's connection error,
            # disconnects that node's idle connections while other calls may be opening
            # them ("'NoneType' object has no attribute 'writelines'"): the call failed.
            if self.on_error is not None:
                self.on_error()
            raise StoreUnavailable(_describe(error)) from error

    def _unreadable(self, count: int = 1) -> None:
        if count and self.on_unreadable is not None:
            self.on_unreadable(count)

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

    async def _get(self, key: str, name: str) -> bytes | None:
        # Replies are bytes: the client is built without decode_responses.
        return cast("bytes | None", await self._call(lambda: self._client.get(key), name=name))

    def _key(self, tenant: str, conversation: str, kind: str, name: str) -> str:
        return keys.conversation_key(self.prefix, tenant, conversation, kind, name)

    def _ttl(self, ttl: int | None) -> int:
        return self.default_ttl if ttl is None else _positive("ttl", ttl)

    def _blob_key(self, tenant: str, ref: str) -> str:
        return keys.blob_key(self.prefix, tenant, ref)

    @staticmethod
    def _encode(value: object) -> bytes:
        data = orjson.dumps(value)
        return pack(data) if len(data) >= JSON_COMPRESS_MIN else data

    @staticmethod
    def _decode(key: str, raw: bytes | None) -> object | None:
        if raw is None:
            return None
        try:
            return cast(object, orjson.loads(unpack(raw)))
        except (orjson.JSONDecodeError, CorruptValue):
            # Treat as missing: the caller recomputes and overwrites it.
            log.warning("store: undecodable JSON at %s, treated as missing", key)
            return None

    async def ping(self) -> bool:
        """True when Redis answers within the timeout; never raises."""
        try:
            return bool(await self._call(self._client.ping))
        except StoreUnavailable:
            return False

    async def memory(self) -> StoreMemory:
        """Memory used, the limit, keys evicted and the eviction policy (one round trip;
        one per primary, concurrently, on a Cluster)."""
        if isinstance(self._client, RedisCluster):
            primaries = RedisCluster.PRIMARIES
            client = self._client
            memory, stats = await self._call(
                lambda: asyncio.gather(
                    client.info("memory", target_nodes=primaries),
                    client.info("stats", target_nodes=primaries),
                )
            )
            if "used_memory" in memory:  # one primary: redis-py gives its reply alone
                memory, stats = {"node": memory}, {"node": stats}
            return from_info((memory[node], stats.get(node, {})) for node in memory)
        pipe = self._client.pipeline(transaction=False)
        pipe.info("memory")
        pipe.info("stats")
        memory, stats = await self._call(lambda: pipe.execute())
        return from_info([(memory, stats)])

    async def close(self) -> None:
        try:
            async with asyncio.timeout(self.op_timeout):
                await self._client.aclose()
        except (RedisError, OSError, TimeoutError) as error:
            log.debug("store: close failed: %s", error)

    # -- what the compaction executor calls -------------------------------------------

    async def load_conversation(
        self,
        tenant: str,
        conversation: str,
        root: str,
        *,
        summaries: Sequence[str] = (),
        decode: Callable[[Any], object] | None = None,
    ) -> ConversationState:
        """Every line stored in ``root`` (checkpoints and their clocks), the root's notes
        of summaries made ahead, and the stored ones of the ``summaries`` keys, in one
        round trip (all keys share the conversation's root). ``decode``: what each
        checkpoint (a JSON object) is turned into, made once per stored value (LineMemo:
        the result must be immutable); a line it answers None for is left out."""
        lines_key = self._key(tenant, conversation, keys.LINES, root)
        names = [self._key(tenant, conversation, keys.SUMMARY, k) for k in summaries]
        if names:
            pipe = self._client.pipeline(transaction=False)
            pipe.hgetall(lines_key)
            for name in names:
                pipe.get(name)
            found = await self._call(lambda: pipe.execute())
        else:  # a crossing's load: one command, without a pipeline's machinery
            hash_ = await self._call(lambda: self._client.hgetall(lines_key))
            found = [hash_]
        fields = cast("dict[bytes, bytes]", found[0] or {})
        checkpoints: dict[str, Any] = {}
        used: dict[str, int] = {}
        notes: list[object] = []
        for raw_name, raw in fields.items():
            name = raw_name.decode("utf-8", "replace")
            kind, _, line = name.partition(":")
            if kind == "u":
                try:
                    used[line] = int(raw)
                except ValueError:
                    used[line] = 0
                continue
            if kind == "c" and decode is not None:
                checkpoint = self._lines.get(raw, decode)
                if checkpoint is MISSING:
                    checkpoint = decode(self._line(lines_key, raw))
                    self._lines.put(raw, decode, checkpoint)
                if checkpoint is not None:
                    checkpoints[line] = checkpoint
                continue
            value = self._decode(f"{lines_key} {name}", raw)
            if kind == "c" and isinstance(value, dict):
                checkpoints[line] = value
            elif kind == "p" and value is not None:
                notes.append(value)
        ordered = sorted(checkpoints, key=lambda line: -used.get(line, 0))
        texts = {}
        for key, name, raw_text in zip(summaries, names, found[1:], strict=True):
            text = self._decode(name, raw_text)
            if isinstance(text, str) and text.strip():
                texts[key] = text
        return ConversationState(
            tuple((checkpoints[line], used.get(line, 0)) for line in ordered),
            texts,
            tuple(notes),
        )

    def _line(self, key: str, raw: bytes) -> dict[str, Any] | None:
        value = self._decode(key, raw)
        return value if isinstance(value, dict) else None

    async def save_crossing(
        self,
        tenant: str,
        conversation: str,
        *,
        root: str,
        checkpoint: Mapping[str, Any] | None,
        blobs: Sequence[tuple[str, str]],
        summary: tuple[str, str] | None,
        touch: Sequence[str],
        line: str = "",
        used: int = 0,
        evict: Sequence[str] = (),
        evict_notes: Sequence[str] = (),
        decoded: tuple[Callable[[Any], object], object] | None = None,
    ) -> CrossingSaved:
        """Write a crossing in one round trip: every blob (once per tenant, compressed),
        a fresh TTL on every ref of ``touch`` still named, the checkpoint (the line
        ``line`` of the root's hash, its clock ``used``), the summary, and the lines of
        ``evict`` and the notes of ``evict_notes`` taken out of the root's hash.

        On a single Redis the call is one script (SAVE_CROSSING): all of it is stored, or
        none of it. On a Cluster the writes go to each node concurrently (one round trip per node
        touched, none atomic across slots); if a blob write or a refresh failed, or the
        call failed as a whole (a timeout: some nodes may have written), the checkpoint is
        deleted again (one more round trip), so a stored checkpoint does not name a blob
        that failed (unless that delete fails too: the answer's error says so). The
        timeout grows with the payload. Never raises StoreUnavailable: the answer says
        which parts are stored, and the caller keeps a summary it paid for either way.
        Refs of ``touch`` whose blobs are gone are listed in ``lost``; the checkpoint is
        stored all the same (its stubs for them read as "no longer available"): a caller
        that still has their texts can save them again as blobs.

        ``decoded``: (a load's decoder, what it makes of ``checkpoint``), kept for the
        next load of the line once the checkpoint is stored (LineMemo), so that load does
        not decode what the crossing had already: equal to what the decoder would make.
        """
        new = {ref for ref, _ in blobs}
        kept = [ref for ref in dict.fromkeys(touch) if ref not in new]
        # Where each blob goes and each kept one is, then the blobs packed in one call.
        blob_keys = [self._blob_key(tenant, ref) for ref, _ in blobs]
        kept_keys = [self._blob_key(tenant, ref) for ref in kept]
        texts = [text for _, text in blobs]
        if sum(len(text) for text in texts) > OFF_LOOP_BYTES:
            packed = await asyncio.to_thread(pack_texts, texts)
        else:
            packed = pack_texts(texts)
        lines_key = self._key(tenant, conversation, keys.LINES, root)
        line = line or "_"
        gone = [f"{kind}:{name}" for name in evict if name != line for kind in ("c", "u")]
        gone += [f"p:{seen}" for seen in evict_notes]
        write = CrossingWrite(
            self.default_ttl,
            list(zip(blob_keys, packed, strict=True)),
            kept_keys,
            lines_key,
            line,
            used,
            None if checkpoint is None else self._encode(checkpoint),
            None if summary is None else (
                self._key(tenant, conversation, keys.SUMMARY, summary[0]),
                self._encode(summary[1]),
            ),
            gone,
        )  # fmt: skip
        parts = {"blobs": bool(blobs), "checkpoint": checkpoint is not None}
        parts["summary"] = summary is not None
        if self.is_cluster:
            saved = await self._save_on_nodes(write, blobs, kept, tenant, parts)
            if decoded is not None and write.checkpoint is not None and saved.checkpoint:
                self._lines.put(write.checkpoint, *decoded)
            return saved
        # One script: as atomic as MULTI/EXEC, one reply to parse (proxy/store/crossing.py).
        timeout = crossing_timeout(self.op_timeout, len(write.keys()) + 2, write.payload)
        script_keys, args = write.keys(), write.args()
        try:
            found = await self._call(
                lambda: self._client.eval(SAVE_CROSSING, len(script_keys), *script_keys, *args),
                timeout,
            )
        except StoreUnavailable as unavailable:
            return failed(str(unavailable), **parts)
        lost = tuple(ref for ref, r in zip(kept, found, strict=True) if not r)
        self._unreadable(len(lost))
        for ref, text in blobs:
            self.blob_cache.put(tenant, ref, text)
        if decoded is not None and write.checkpoint is not None:
            self._lines.put(write.checkpoint, *decoded)
        return CrossingSaved(True, True, True, lost)

    async def _save_on_nodes(
        self,
        write: CrossingWrite,
        blobs: Sequence[tuple[str, str]],
        kept: Sequence[str],
        tenant: str,
        parts: dict[str, bool],
    ) -> CrossingSaved:
        """A crossing's writes on a Cluster: each node's part at once, none atomic across
        slots; a checkpoint whose blobs failed is taken back (save_crossing)."""
        ttl, lines_key, line = write.ttl, write.lines, write.line
        pipe = self._client.pipeline(transaction=False)
        for key, value in write.blobs:
            pipe.set(key, value, ex=ttl)
        for key in write.kept:
            pipe.expire(key, ttl)
        data = write.checkpoint
        if data is not None:
            pipe.hset(lines_key, items=[f"c:{line}", data, f"u:{line}", str(write.used)])
        if write.summary is not None:
            pipe.set(write.summary[0], write.summary[1], ex=ttl)
        if write.gone:
            pipe.hdel(lines_key, *write.gone)
        if write.checkpoint is not None or write.gone:
            pipe.expire(lines_key, ttl)
        timeout = crossing_timeout(self.op_timeout, len(pipe), write.payload)
        has_checkpoint = write.checkpoint is not None
        take_back = (lines_key, f"c:{line}")
        try:
            replies = await self._call(lambda: pipe.execute(raise_on_error=False), timeout)
        except StoreUnavailable as unavailable:
            reason = str(unavailable)
            if has_checkpoint:
                # Some nodes may have written their part: take the checkpoint back.
                reason += await self._take_back(*take_back)
            return failed(reason, **parts)
        errors = [r for r in replies if isinstance(r, Exception)]
        if errors and self.on_error is not None:
            self.on_error()
        written = len(write.blobs)
        blob_replies = replies[:written]
        touch_replies = replies[written : written + len(kept)]
        rest = replies[written + len(kept) :]
        blobs_ok = all(r is True for r in blob_replies)
        touched_ok = not any(isinstance(r, Exception) for r in touch_replies)
        lost = tuple(ref for ref, r in zip(kept, touch_replies, strict=True) if r is False)
        self._unreadable(len(lost))
        checkpoint_ok = not has_checkpoint or not isinstance(rest.pop(0), Exception)
        summary_ok = write.summary is None or rest.pop(0) is True
        reason = _describe(errors[0]) if errors else ""
        if has_checkpoint and checkpoint_ok and not (blobs_ok and touched_ok):
            checkpoint_ok = False
            reason += await self._take_back(*take_back)
        if blobs_ok:
            for ref, text in blobs:
                self.blob_cache.put(tenant, ref, text)
        return CrossingSaved(blobs_ok, checkpoint_ok, summary_ok, lost, reason)

    async def put_note(
        self,
        tenant: str,
        conversation: str,
        root: str,
        seen: str,
        note: object,
        evict_notes: Sequence[str] = (),
    ) -> None:
        """Keep a note of a summary made ahead in the root's hash (one round trip),
        taking out the notes of ``evict_notes``."""
        lines_key = self._key(tenant, conversation, keys.LINES, root)
        data = self._encode(note)
        pipe = self._client.pipeline(transaction=not self.is_cluster)
        pipe.hset(lines_key, f"p:{seen}", data)
        gone = [f"p:{s}" for s in evict_notes if s != seen]
        if gone:
            pipe.hdel(lines_key, *gone)
        pipe.expire(lines_key, self.default_ttl)
        await self._call(lambda: pipe.execute())

    async def touch_line(
        self, tenant: str, conversation: str, root: str, line: str, used: int
    ) -> None:
        """Set a line's clock (it was taken by a request), if the line is still kept."""
        lines_key = self._key(tenant, conversation, keys.LINES, root)
        await self._call(lambda: self._touch_line(keys=[lines_key], args=[line, used]))

    async def _take_back(self, lines_key: str, name: str) -> str:
        """Delete a checkpoint that may name blobs that failed; what went wrong, if any."""
        try:
            await self._call(lambda: self._client.hdel(lines_key, name))
            return ""
        except StoreUnavailable as gone:
            return f"; the checkpoint may name blobs that failed: {gone}"

    async def read_blob(self, tenant: str, conversation: str, ref: str) -> str | None:
        """The text of an offloaded result of this tenant, or None: never stored, evicted,
        expired and another tenant's all read the same. Any conversation of the tenant
        may read it (blobs are stored once per tenant); ``conversation`` is kept for the
        callers' sake. Recently written or read texts come from this replica's cache."""
        if not _plausible_ref(ref):
            self._unreadable()
            return None
        cached = self.blob_cache.get(tenant, ref)
        if cached is not None:
            return cached
        raw = await self._get(self._blob_key(tenant, ref), "Store.read_blob")
        try:
            data = None if raw is None else await self._unpack(raw)
        except CorruptValue as error:
            log.warning("store: blob %s does not decode (%s), treated as missing", ref, error)
            data = None
        if data is None:
            self._unreadable()
            return None
        text = data.decode("utf-8", "replace")
        self.blob_cache.put(tenant, ref, text)
        return text

    async def touch_refs(
        self, tenant: str, conversation: str, refs: Sequence[str]
    ) -> tuple[str, ...]:
        """Give every named blob a fresh TTL (one pipelined call); returns the refs whose
        blobs no longer exist."""
        named = [ref for ref in dict.fromkeys(refs) if _plausible_ref(ref)]
        if not named:
            return ()
        found = await self._expire_blobs(tenant, named, self.default_ttl)
        lost = tuple(ref for ref, ok in zip(named, found, strict=True) if not ok)
        self._unreadable(len(lost))
        return lost

    async def _expire_blobs(self, tenant: str, refs: Sequence[str], ttl: int) -> list[bool]:
        pipe = self._client.pipeline(transaction=False)
        for ref in refs:
            pipe.expire(self._blob_key(tenant, ref), ttl)
        timeout = crossing_timeout(self.op_timeout, len(refs), 0)
        return [bool(r) for r in await self._call(lambda: pipe.execute(), timeout)]

    @staticmethod
    async def _unpack(raw: bytes) -> bytes:
        return await asyncio.to_thread(unpack, raw) if len(raw) > OFF_LOOP_BYTES else unpack(raw)

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
        data = self._encode(value)
        await self._call(lambda: self._client.set(key, data, ex=self._ttl(ttl)))

    async def get_json(self, tenant: str, conversation: str, kind: str, name: str) -> object | None:
        key = self._key(tenant, conversation, kind, name)
        return self._decode(key, await self._get(key, "Store.get_json"))

    async def refresh_ttl(
        self, tenant: str, conversation: str, kind: str, names: list[str], ttl: int | None = None
    ) -> int:
        """Give a conversation's existing keys (summaries, checkpoints) a fresh TTL;
        returns how many exist. Blobs are kept per tenant: ``touch_refs`` renews them."""
        if not names:
            return 0
        if kind == keys.BLOB:
            raise ValueError("blobs are renewed with touch_refs")
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

    # -- global values (calibration per model, ...) --------------------------------------

    async def update_global_mean(
        self,
        kind: str,
        name: str,
        sample: float | Sequence[float],
        max_samples: int = 100,
        ttl: int | None = None,
    ) -> tuple[float, int]:
        """Fold ``sample`` (or several, in order, in one call) into a stored running mean;
        returns (mean, samples counted)."""
        samples = [sample] if isinstance(sample, int | float) else list(sample)
        if not samples:
            raise ValueError("no sample to fold")
        for one in samples:
            if not math.isfinite(one):
                raise ValueError(f"sample must be finite, got {one}")
        key = keys.global_key(self.prefix, kind, name)
        cap = _positive("max_samples", max_samples)
        args: list[str | int] = [cap, self._ttl(ttl), *(repr(float(one)) for one in samples)]
        text, count = await self._call(lambda: self._mean(keys=[key], args=args))
        return float(text), int(count)

    async def get_global_mean(self, kind: str, name: str) -> tuple[float, int] | None:
        key = keys.global_key(self.prefix, kind, name)
        fields = await self._call(lambda: self._client.hmget(key, ["mean", "samples"]))
        mean, count = fields
        if mean is None or count is None:
            return None
        return float(mean), int(count)
