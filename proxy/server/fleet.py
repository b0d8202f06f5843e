"""Per-process state of the fleet-wide checks: keys, teams and budgets in the shared Redis.

Each replica keeps a short-lived copy (`auth.cache_seconds`) of the key records and the
limits it has seen, so a request costs no Redis call for them; a revoked key or a changed
limit takes effect on every replica within that time. While Redis is unreachable the last
copies are used however old (a key seen before keeps working), and `budgets.on_store_down`
decides what happens to budgets: "open" admits without counting, "closed" refuses. Each
outage is logged once when it starts and once when it ends, and counted.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Coroutine
from dataclasses import dataclass
from typing import Any, TypeVar

from aiohttp import web

from proxy.core.budget import Amounts
from proxy.server.state import SETTINGS, STORE
from proxy.store import StoreUnavailable
from proxy.store.accounts import Accounts, Scope

log = logging.getLogger(__name__)

T = TypeVar("T")
CACHE_LIMIT = 10_000  # entries per cache; the oldest go first
# Settlements wait this long to be sent together; one that fails (Redis slow or away) is
# tried again after these pauses, then the reservation stands until its bucket expires.
SETTLE_BATCH = 0.02
SETTLE_RETRIES = (0.2, 1.0, 3.0, None)
OUTAGE_QUIET = 2.0  # seconds without a failed call before an outage counts as over
FLAP_WINDOW = 30.0  # a failure this soon after a recovery is the same outage


@dataclass(slots=True)
class _Entry:
    value: Any
    fetched: float


class Fleet:
    def __init__(self, app: web.Application) -> None:
        self.app = app
        self._accounts: Accounts | None = None
        self._accounts_of: object = None
        self._keys: dict[str, _Entry] = {}
        self._confs: dict[Scope, _Entry] = {}
        self._tasks: set[asyncio.Task[None]] = set()
        self._pending: dict[tuple[str, ...], Amounts] = {}
        self._flushing = False
        self.outage = False
        self._last_failure = float("-inf")
        self._recovered_at = float("-inf")
        self._silent = False
        self.outages = 0  # outages seen since start
        self.unaccounted = 0  # requests admitted uncounted while Redis was unreachable

    @property
    def cache_seconds(self) -> float:
        return self.app[SETTINGS].auth.cache_seconds

    def accounts(self) -> Accounts | None:
        store = self.app[STORE].store
        if store is None:
            return None
        if self._accounts_of is not store:
            self._accounts, self._accounts_of = Accounts(store), store
        return self._accounts

    # -- Redis health --------------------------------------------------------------------

    def store_failed(self, error: Exception) -> None:
        now = time.monotonic()
        self._last_failure = now
        if self.outage:
            return
        self.outage = True
        # A Redis coming back answers some calls while pooled connections still fail: a
        # failure soon after a recovery continues the same outage, logged once.
        self._silent = now - self._recovered_at < FLAP_WINDOW
        if not self._silent:
            self.outages += 1
            log.warning(
                "fleet store unreachable (%s); budgets fail %s until it returns",
                type(error).__name__,
                self.app[SETTINGS].budgets.on_store_down,
            )

    def store_answered(self) -> None:
        now = time.monotonic()
        if self.outage and now - self._last_failure > OUTAGE_QUIET:
            self.outage = False
            self._recovered_at = now
            if not self._silent:
                log.info("fleet store reachable again; budgets enforced")

    async def call(self, operation: Callable[[], Awaitable[T]]) -> T:
        """A store call that keeps the outage state (raises StoreUnavailable)."""
        try:
            result = await operation()
        except StoreUnavailable as e:
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
        self, cache: dict[Any, _Entry], name: Any, fetch: Callable[[], Awaitable[Any]]
    ) -> Any:
        entry = cache.get(name)
        now = time.monotonic()
        if entry is not None and now - entry.fetched < self.cache_seconds:
            return entry.value
        try:
            value = await self.call(fetch)
        except StoreUnavailable:
            if entry is not None:
                return entry.value  # stale beats nothing while Redis is away
            raise
        cache.pop(name, None)
        cache[name] = _Entry(value, now)
        while len(cache) > CACHE_LIMIT:
            del cache[next(iter(cache))]
        return value

    async def key_record(self, accounts: Accounts, key_id: str) -> dict[str, str] | None:
        found: dict[str, str] | None = await self._cached(
            self._keys, key_id, lambda: accounts.get_key(key_id)
        )
        return found

    async def conf(self, accounts: Accounts, scope: Scope) -> dict[str, str]:
        found: dict[str, str] = await self._cached(
            self._confs, scope, lambda: accounts.get_conf(scope)
        )
        return found

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
        task = asyncio.get_running_loop().create_task(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def close(self) -> None:
        if self._tasks:
            await asyncio.wait(list(self._tasks), timeout=5)


FLEET = web.AppKey("fleet", Fleet)


async def fleet_lifetime(app: web.Application) -> AsyncIterator[None]:
    """Keys and budgets for the app's lifetime: registered after the store, so pending
    settlements are sent before the store closes."""
    app[FLEET] = Fleet(app)
    yield
    await app[FLEET].close()
