"""Fleet-wide admin stats in Redis: counters per minute and per hour, recent events.

Keys (global, under the store's prefix; every replica adds to the same ones):

    {prefix}g:stats:m:<unix minute>   hash of counters (proxy/core/stats.py), 3 hours
    {prefix}g:stats:h:<unix hour>     the same per hour, 8 days
    {prefix}g:stats:recent:<kind>     newest-first list of JSON events, capped

A replica sends what it gathered as one pipelined call (HINCRBY, LPUSH/LTRIM, EXPIRE)
every second or so, never on a request's path. Each command touches one key, so the
same pipeline runs on Redis Cluster (redis-py splits it by node).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, cast

import orjson

from proxy.core.stats import add
from proxy.store import keys
from proxy.store.redis import Store

MINUTE = 60
HOUR = 3600
MINUTE_TTL = 3 * HOUR
HOUR_TTL = 8 * 24 * HOUR
RECENT_KEPT = {"conversations": 300, "crossings": 100, "errors": 100}


@dataclass(frozen=True, slots=True)
class Buckets:
    minutes: list[tuple[int, dict[str, int]]]  # (start, counters), oldest first
    hours: list[tuple[int, dict[str, int]]]
    recent: dict[str, list[dict[str, Any]]]  # newest first


def _decoded(raw: Mapping[Any, Any]) -> dict[str, int]:
    out: dict[str, int] = {}
    for name, value in raw.items():
        key = name.decode() if isinstance(name, bytes) else str(name)
        try:
            out[key] = int(value)
        except ValueError:
            continue
    return out


class StatsStore:
    def __init__(self, store: Store) -> None:
        self.store = store

    def _key(self, name: str) -> str:
        return keys.global_key(self.store.prefix, "stats", name)

    async def write(
        self, by_minute: Mapping[int, Mapping[str, int]], recent: Mapping[str, Sequence[Any]]
    ) -> None:
        """Add counters gathered per minute start (unix seconds) and push events."""
        by_hour: dict[int, dict[str, int]] = {}
        for minute, counters in by_minute.items():
            add(by_hour.setdefault(minute - minute % HOUR, {}), counters)
        pipe = self.store.client.pipeline(transaction=False)
        commands = 0
        for buckets, size, ttl in ((by_minute, "m", MINUTE_TTL), (by_hour, "h", HOUR_TTL)):
            for start, counters in buckets.items():
                key = self._key(f"{size}:{start}")
                for name, amount in counters.items():
                    pipe.hincrby(key, name, amount)
                    commands += 1
                pipe.expire(key, ttl)
        for kind, items in recent.items():
            if not items:
                continue
            key = self._key(f"recent:{kind}")
            pipe.lpush(key, *(orjson.dumps(item) for item in items))
            pipe.ltrim(key, 0, RECENT_KEPT.get(kind, 100) - 1)
            pipe.expire(key, self.store.default_ttl)
            commands += 1
        if commands:
            await self.store.run(pipe.execute)

    async def read(self, now: float, minutes: int, hours: int) -> Buckets:
        """The last `minutes` minute buckets and `hours` hour buckets (the current one
        included, oldest first) and the recent events."""
        this_minute = int(now) - int(now) % MINUTE
        this_hour = int(now) - int(now) % HOUR
        minute_starts = [this_minute - MINUTE * i for i in range(minutes - 1, -1, -1)]
        hour_starts = [this_hour - HOUR * i for i in range(hours - 1, -1, -1)]
        pipe = self.store.client.pipeline(transaction=False)
        for start in minute_starts:
            pipe.hgetall(self._key(f"m:{start}"))
        for start in hour_starts:
            pipe.hgetall(self._key(f"h:{start}"))
        kinds = list(RECENT_KEPT)
        for kind in kinds:
            pipe.lrange(self._key(f"recent:{kind}"), 0, -1)
        replies = cast("list[Any]", await self.store.run(pipe.execute))
        counted = [_decoded(r) for r in replies[: len(minute_starts) + len(hour_starts)]]
        lists = replies[len(counted) :]
        recent = {
            kind: [orjson.loads(raw) for raw in items]
            for kind, items in zip(kinds, lists, strict=True)
        }
        return Buckets(
            minutes=list(zip(minute_starts, counted[: len(minute_starts)], strict=True)),
            hours=list(zip(hour_starts, counted[len(minute_starts) :], strict=True)),
            recent=recent,
        )
