"""Conversation state in Redis: the store, its key names, and an embedded redis-server."""

from proxy.store.embedded import EmbeddedRedis, EmbeddedRedisError, StateDirBusy
from proxy.store.redis import Store, StoreUnavailable

__all__ = [
    "EmbeddedRedis",
    "EmbeddedRedisError",
    "StateDirBusy",
    "Store",
    "StoreUnavailable",
]
