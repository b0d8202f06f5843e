"""The revocation watch's sessions (proxy/server/fleet.py, `Fleet._watch`), on a private
Redis: a session vouches for the key records fetched during it, so a session must end
whenever its connection does."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable

import redis

from proxy.config import AuthSettings, Settings
from proxy.server.fleet import Fleet
from proxy.store import EmbeddedRedis


async def _listening(fleet: Fleet, *, after: float = float("-inf")) -> float:
    """When the watch's session began listening, once one that began after `after` is."""
    deadline = time.monotonic() + 10
    while (
        fleet._watch_began is None or fleet._watch_began <= after or fleet._watch_ended is not None
    ):
        assert time.monotonic() < deadline, "no new session of the watch is listening"
        await asyncio.sleep(0.05)
    return fleet._watch_began


async def test_a_dropped_watch_connection_ends_its_session(
    embedded_redis: Callable[[], EmbeddedRedis],
) -> None:
    """redis-py's PubSub reconnects and subscribes again by itself on the command after a
    failed one: a watch that went on through that would vouch for records fetched before
    a gap in which a revocation went unheard. The watch ends its session on the first
    failure; this pins that a dropped connection starts a new session."""
    server = embedded_redis()
    fleet = Fleet(Settings(auth=AuthSettings(keys="required")))
    fleet.open(server.url)
    try:
        first = await _listening(fleet)
        killer = redis.Redis.from_url(server.url)
        assert killer.client_kill_filter(_type="pubsub") == 1  # the watch's connection
        killer.close()
        # A new session (nothing fetched before it is vouched for), not the old one going on.
        await _listening(fleet, after=first)
    finally:
        await fleet.close()
