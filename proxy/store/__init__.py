"""Conversation state in Redis: the store, its key names, the summary lock, and an embedded
redis-server."""

from proxy.store.crossing import ConversationState, CrossingSaved
from proxy.store.embedded import EmbeddedRedis, EmbeddedRedisError, StateDirBusy
from proxy.store.memory import StoreMemory
from proxy.store.redis import Store, StoreUnavailable
from proxy.store.summary_lock import SummaryLock

__all__ = [
    "ConversationState",
    "CrossingSaved",
    "EmbeddedRedis",
    "EmbeddedRedisError",
    "StateDirBusy",
    "Store",
    "StoreMemory",
    "StoreUnavailable",
    "SummaryLock",
]
