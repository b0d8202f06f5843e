"""Per-process state of the fleet-wide checks: keys, teams and budgets in the shared Redis.

The fleet talks to Redis through its own client, with its own timeout
(`budgets.timeout`, longer than the store's `op_timeout`) and a small pool that a burst
reuses rather than opening a connection per request: a Redis that stalls for a moment (a
slow command, a loaded machine) only delays the requests waiting on it; only a call that
fails or outlasts that timeout makes Redis count as unreachable.

Each replica keeps a short-lived copy (`auth.cache_seconds`) of the key records and the
limits it has seen, so a request costs no Redis call for them; a revoked key or a changed
limit takes effect on every replica within that time. Revocations are also published as
they are made and every replica listens (`_watch`), dropping the key's copy at once; a
revocation is out of Redis when `Accounts.revoke_key` returns (written to every listening
replica's connection), so one made just before Redis dies still reaches the replicas. A
key record older than `cache_seconds` is used only while Redis is unreachable, with
`on_store_down = "open"`, up to `auth.outage_trust_seconds` into the outage, and only if
the watch listened from that record's fetch until the outage began (so no revocation
made before the outage was missed); otherwise a key that cannot be checked again is
refused (503). Limits may be used older while Redis is away (they fail the reservation
anyway).

While Redis is unreachable `budgets.on_store_down` decides what happens to budgets:
"closed" refuses; "open" admits without a reservation, at most `budgets.outage_allowance`
tokens (input and output reserved) per key on this replica per outage, and charges what
those requests used to the counters once Redis answers again. Each outage is logged once
when it starts and once when it ends, and exported (proxy/server/metrics.py).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Coroutine, Iterable
from dataclasses import dataclass
from typing import Any, TypeVar, cast

from aiohttp import web
from redis.asyncio import Redis
from redis.exceptions import RedisError, ResponseError

from proxy.config import Settings
from proxy.core.budget import Amounts
from proxy.server.metrics import METRICS, Metrics
from proxy.server.state import SETTINGS, STORE
from proxy.server.tasks import is_cancelling, spawn_watched, stop_tasks
from proxy.store import Store, StoreUnavailable
from proxy.store.accounts import Accounts, Scope
from proxy.store.redis import node_url

log = logging.getLogger(__name__)

T = TypeVar("T")
CACHE_LIMIT = 10_000  # entries per cache; the oldest go first
# Settlements wait this long to be sent together; one that fails (Redis slow or away) is
# tried again after these pauses, then the reservation stands until its bucket expires.
SETTLE_BATCH = 0.02
SETTLE_RETRIES = (0.2, 1.0, 3.0, None)
OUTAGE_QUIET = 2.0  # seconds without a failed call before an outage counts as over
FLAP_WINDOW = 30.0  # a failure this soon after a recovery is the same outage
# Usage admitted uncounted is charged when Redis answers again; tried for this long.
OWED_GIVE_UP = 3600.0
OWED_LONGEST_PAUSE = 30.0
# Connections of the fleet's client. Its calls are tiny scripts: a few connections serve
# a burst faster than many new ones (each costs a connect and a handshake, which under
# load took longer than the timeout when a burst of 120 opened 40 at once).
FLEET_CONNECTIONS = 8
# The revocation watch: a session that hears nothing (not even its PINGs' answers) this
# long has ended; a new one is tried this often. Its end counts as the outage's start
# when it comes at most WATCH_SLACK before the first failed call.
WATCH_SILENCE = 3.0
WATCH_RETRY = 1.0
WATCH_SLACK = 5.0


@dataclass(slots=True)
class _Entry:
    value: Any
    fetched: float
    watched: float | None = None  # the revocation watch's session when fetched


class Fleet:
    """Keys and budgets shared by the replicas, given what it uses: the settings (auth's
    cache and outage trust, budgets' store-down behaviour and allowance, the store's
    prefix and TTL) and the metrics it reports to (None: an app without them)."""

    def __init__(self, settings: Settings, metrics: Metrics | None = None) -> None:
        self.settings = settings
        self._metrics = metrics
        self.store: Store | None = None  # the fleet's own client (budgets.timeout)
        self._accounts: Accounts | None = None
        self._keys: dict[str, _Entry] = {}
        self._confs: dict[Scope, _Entry] = {}
        self._tasks: set[asyncio.Task[None]] = set()
        self._pending: dict[tuple[str, ...], Amounts] = {}
        self._flushing = False
        self.outage = False
        self._last_failure = float("-inf")
        self._recovered_at = float("-inf")
        self._silent = False
        self._uncounted: dict[str, int] = {}  # key id -> tokens admitted uncounted, this outage
        self._owed: dict[Scope, Amounts] = {}  # usage admitted uncounted, to charge later
        self._paying: asyncio.Task[None] | None = None
        self._answered = asyncio.Event()  # set when a call succeeds: owed charges go out
        self._outage_began = float("inf")
        # The revocation watch (`_watch`): when its current (or last) session began
        # listening, and when that session ended (None: still listening).
        self._watch_began: float | None = None
        self._watch_ended: float | None = None
        self._watcher: asyncio.Task[None] | None = None
        self._closing = False
        self._revocations: dict[str, float] = {}  # key id -> when its revocation was heard

    @property
    def cache_seconds(self) -> float:
        return self.settings.auth.cache_seconds

    def open(self, url: str) -> None:
        """Connect (lazily) to the shared Redis at `url`."""
        settings = self.settings
        self.store = Store.from_url(
            url,
            prefix=settings.store.key_prefix,
            op_timeout=settings.budgets.timeout,
            default_ttl=settings.store.ttl,
            max_connections=FLEET_CONNECTIONS,
        )
        metrics = self._metrics
        if metrics is not None:
            self.store.on_error = metrics.store_errors.inc
        self._accounts = Accounts(self.store)
        if settings.auth.keys == "required":
            self._watcher = asyncio.get_running_loop().create_task(self._watch(node_url(url)))

    def accounts(self) -> Accounts | None:
        return self._accounts

    # -- Redis health --------------------------------------------------------------------

    def store_failed(self, error: Exception) -> None:
        now = time.monotonic()
        self._last_failure = now
        if self.outage:
            return
        self.outage = True
        self._outage_began = now
        # A Redis coming back answers some calls while pooled connections still fail: a
        # failure soon after a recovery continues the same outage, logged once.
        self._silent = now - self._recovered_at < FLAP_WINDOW
        metrics = self._metrics
        if metrics is not None:
            metrics.budget_store_down.set(1)
        if not self._silent:
            if metrics is not None:
                metrics.budget_store_outages.inc()
            log.warning(
                "fleet store unreachable (%s); budgets fail %s until it returns",
                type(error).__name__,
                self.settings.budgets.on_store_down,
            )

    def store_answered(self) -> None:
        self._answered.set()
        now = time.monotonic()
        if self.outage and now - self._last_failure > OUTAGE_QUIET:
            self.outage = False
            self._recovered_at = now
            self._uncounted.clear()  # a new outage gets a new allowance
            metrics = self._metrics
            if metrics is not None:
                metrics.budget_store_down.set(0)
            if not self._silent:
                log.info("fleet store reachable again; budgets enforced")

    async def call(self, operation: Callable[[], Awaitable[T]]) -> T:
        """A store call that keeps the outage state (raises StoreUnavailable)."""
        try:
            result = await operation()
        except StoreUnavailable as e:
            if isinstance(e.__cause__, ResponseError):
                # Redis answered, refusing the command: a bug to log, not an outage.
                log.error("fleet store refused a command: %s", e.__cause__)
                raise
            self.store_failed(e)
            raise
        except Exception as e:  # a client library fault is an unavailable store too
            log.exception("fleet store call failed")
            self.store_failed(e)
            raise StoreUnavailable(f"{type(e).__name__}: {e}") from e
        self.store_answered()
        return result

    # -- cached lookups ------------------------------------------------------------------

    async def _cached(
        self,
        cache: dict[Any, _Entry],
        name: Any,
        fetch: Callable[[], Awaitable[Any]],
        *,
        stale_ok: bool,
    ) -> Any:
        entry = cache.get(name)
        now = time.monotonic()
        if entry is not None and now - entry.fetched < self.cache_seconds:
            return entry.value
        try:
            value = await self.call(fetch)
        except StoreUnavailable:
            if entry is not None and stale_ok:
                return entry.value
            raise
        cache.pop(name, None)
        cache[name] = _Entry(value, now, self._watch_began if self._watch_ended is None else None)
        while len(cache) > CACHE_LIMIT:
            del cache[next(iter(cache))]
        return value

    async def key_record(self, accounts: Accounts, key_id: str) -> dict[str, str] | None:
        """The key's record, at most `cache_seconds` old, or older only as `_trusted`
        allows during an outage (else raises StoreUnavailable: a revocation must never
        go unseen for longer)."""
        entry = self._keys.get(key_id)
        if entry is not None and self._revocations.get(key_id, -1.0) >= entry.fetched:
            del self._keys[key_id]  # revoked since that fetch began: never use it again
        try:
            found: dict[str, str] | None = await self._cached(
                self._keys, key_id, lambda: accounts.get_key(key_id), stale_ok=False
            )
        except StoreUnavailable:
            entry = self._keys.get(key_id)
            if entry is None or not self._trusted(entry):
                raise
            return cast("dict[str, str] | None", entry.value)
        return found

    def _trusted(self, entry: _Entry) -> bool:
        """Whether a key record older than cache_seconds may still be used, Redis being
        unreachable: with on_store_down "open", up to auth.outage_trust_seconds into the
        outage, and only when every revocation made before the outage would have
        reached this replica: the revocation watch listened from the record's fetch
        until the outage began."""
        settings = self.settings
        horizon = settings.auth.outage_trust_seconds
        if settings.budgets.on_store_down != "open" or horizon <= 0 or not self.outage:
            return False
        if entry.watched is None or entry.watched != self._watch_began:
            return False  # fetched while not listening, or the watch restarted since
        began, ended = self._outage_began, self._watch_ended
        if ended is not None:
            if ended < began - WATCH_SLACK:
                return False  # the watch was deaf before the outage: a revocation may be lost
            began = min(began, ended)  # the watch saw Redis go first
        return time.monotonic() - began <= horizon

    async def _watch(self, url: str) -> None:
        """Listen for revocations (Accounts.revoke_key publishes them): a revoked key's
        record leaves this replica's cache the moment it is revoked. A PING every second
        keeps the session honest: one without an answer in WATCH_SILENCE ends it. On a
        Redis Cluster it listens on the start-up node: a PUBLISH reaches every node."""
        assert self._accounts is not None
        channel = self._accounts.revocations_channel()
        while not self._closing and not is_cancelling():
            client = Redis.from_url(url, socket_connect_timeout=2.0)
            pubsub = client.pubsub(ignore_subscribe_messages=True)
            try:
                async with asyncio.timeout(2.0):
                    await pubsub.subscribe(channel)
                self._watch_began, self._watch_ended = time.monotonic(), None
                heard = next_ping = time.monotonic()
                while True:
                    message = await pubsub.get_message(timeout=0.25)
                    now = time.monotonic()
                    if message is not None:
                        heard = now
                        if message.get("type") == "message":
                            self._revoked(message.get("data"))
                    if now >= next_ping:
                        async with asyncio.timeout(2.0):
                            await pubsub.ping()
                        next_ping = now + 1.0
                    if now - heard > WATCH_SILENCE:
                        raise TimeoutError("the revocation watch heard nothing")
            except (RedisError, OSError, TimeoutError):
                if is_cancelling():  # a cancellation the client turned into a timeout
                    raise asyncio.CancelledError() from None
            finally:
                if self._watch_began is not None and self._watch_ended is None:
                    self._watch_ended = time.monotonic()
                with contextlib.suppress(Exception):
                    await pubsub.aclose()  # type: ignore[no-untyped-call,unused-ignore]
                with contextlib.suppress(Exception):
                    await client.aclose()
            await asyncio.sleep(WATCH_RETRY)

    def _revoked(self, data: object) -> None:
        """A revocation heard: the cached record goes, and so does one whose fetch was
        under way (key_record compares the times)."""
        key_id = data.decode() if isinstance(data, bytes) else str(data)
        self._keys.pop(key_id, None)
        self._revocations.pop(key_id, None)
        self._revocations[key_id] = time.monotonic()
        while len(self._revocations) > CACHE_LIMIT:
            del self._revocations[next(iter(self._revocations))]

    async def conf(self, accounts: Accounts, scope: Scope) -> dict[str, str]:
        found: dict[str, str] = await self._cached(
            self._confs, scope, lambda: accounts.get_conf(scope), stale_ok=True
        )
        return found

    # -- failing open --------------------------------------------------------------------

    def admit_uncounted(self, key_id: str, want: Amounts, *, new: bool = True) -> bool:
        """Whether this replica may admit `want` for the key without a reservation
        (Redis unreachable, `on_store_down = "open"`): within the outage allowance.
        `new`: a request not admitted uncounted before (counted in the metric)."""
        allowance = self.settings.budgets.outage_allowance
        used = self._uncounted.get(key_id, 0) + want.input + want.output
        if used > allowance:
            return False
        self._uncounted.pop(key_id, None)
        self._uncounted[key_id] = used
        while len(self._uncounted) > CACHE_LIMIT:  # bounded: the oldest key's is forgotten
            del self._uncounted[next(iter(self._uncounted))]
        metrics = self._metrics
        if metrics is not None and new:
            metrics.budget_uncounted.inc()
        return True

    def owe(self, scopes: Iterable[Scope], used: Amounts) -> None:
        """Usage of a request admitted uncounted: charged to each scope's counters (of
        the buckets current then) as soon as Redis answers."""
        if used == Amounts():
            return
        for scope in scopes:
            self._owed[scope] = self._owed.get(scope, Amounts()).plus(used)
        while len(self._owed) > CACHE_LIMIT:
            del self._owed[next(iter(self._owed))]
        if self._paying is None or self._paying.done():
            self._paying = asyncio.get_running_loop().create_task(self._pay())

    async def _pay(self) -> None:
        pause = 0.5
        give_up = time.monotonic() + OWED_GIVE_UP
        while self._owed:
            accounts = self.accounts()
            if accounts is None:
                break
            for scope, amounts in list(self._owed.items()):
                try:
                    await self.charge(accounts, scope, amounts)
                except StoreUnavailable:
                    break
                rest = self._owed.get(scope, Amounts()).minus(amounts)
                if rest == Amounts():
                    self._owed.pop(scope, None)
                else:
                    self._owed[scope] = rest
            if not self._owed:
                break
            if time.monotonic() > give_up:
                log.warning("usage admitted uncounted not charged to %d scopes", len(self._owed))
                self._owed.clear()
                break
            self._answered.clear()
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(pause):
                    await self._answered.wait()  # woken early when a call succeeds
            pause = min(pause * 2, OWED_LONGEST_PAUSE)

    async def charge(self, accounts: Accounts, scope: Scope, amounts: Amounts) -> None:
        """Add `amounts` to the scope's current counters, whatever its limits say (usage
        that happened without a reservation): one script, never refused."""
        if amounts == Amounts():
            return
        await self.call(lambda: accounts.charge(scope, amounts, time.time()))

    # -- settlements ---------------------------------------------------------------------

    def settle_later(self, counters: tuple[str, ...], delta: Amounts) -> None:
        """Queue a settlement. Those of one scope and bucket are summed and sent together
        every SETTLE_BATCH seconds: one script call for many requests. Until then the
        reservations stay counted (high, never low)."""
        if not counters or delta == Amounts():
            return
        self._pending[counters] = self._pending.get(counters, Amounts()).plus(delta)
        if not self._flushing:
            self._flushing = True
            self.spawn(self._flush())

    async def _flush(self) -> None:
        try:
            await asyncio.sleep(SETTLE_BATCH)
        finally:
            pending, self._pending = self._pending, {}
            self._flushing = False
            accounts = self.accounts()
            if accounts is not None:
                await asyncio.gather(*(self._apply(accounts, c, d) for c, d in pending.items()))

    async def _apply(self, accounts: Accounts, counters: tuple[str, ...], delta: Amounts) -> None:
        for pause in SETTLE_RETRIES:
            try:
                await self.call(lambda: accounts.add(counters, delta))
                return
            except StoreUnavailable:
                if pause is None:
                    log.info(
                        "could not settle %d counters; their reservations stand", len(counters)
                    )
                else:
                    await asyncio.sleep(pause)

    # -- background work -----------------------------------------------------------------

    def spawn(self, coro: Coroutine[Any, Any, None]) -> None:
        """Work that must finish even when the request's task is cancelled (a client
        that disconnects still owes what its stream used)."""
        spawn_watched(self._tasks, coro, "settlement")

    async def close(self) -> None:
        """Within a bounded time: settlements get 5 s to land, owed charges one last try
        of 2 s, then whatever is left is stopped (stop_tasks)."""
        self._closing = True
        if self._watcher is not None:
            await stop_tasks([self._watcher], what="revocation watch")
        if self._tasks:
            await asyncio.wait(list(self._tasks), timeout=5)
            await stop_tasks(list(self._tasks), what="settlement")
        if self._paying is not None and not self._paying.done():
            if self._owed:  # one last try, then what is still owed is lost
                self._answered.set()
                await asyncio.wait([self._paying], timeout=2)
            await stop_tasks([self._paying], what="owed charge")
        if self.store is not None:
            await self.store.close()


FLEET = web.AppKey("fleet", Fleet)


async def fleet_lifetime(app: web.Application) -> AsyncIterator[None]:
    """Keys and budgets for the app's lifetime: registered after the store (the fleet
    uses the same Redis, through its own client), so pending settlements are sent
    before the store stops."""
    fleet = app[FLEET] = Fleet(app[SETTINGS], app.get(METRICS))
    state = app[STORE]
    url = app[SETTINGS].store.redis_url
    if state.embedded is not None:
        url = state.embedded.url
    if url and state.store is not None:
        fleet.open(url)
    yield
    await fleet.close()
