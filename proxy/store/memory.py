"""How full Redis is: what ``Store.memory`` reports, summed over a Cluster's primaries."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

# Policies that may evict keys without a TTL: proxy key records, limits and budget
# counters would go (see proxy/store/accounts.py). volatile-* and noeviction are safe.
UNSAFE_POLICIES = frozenset({"allkeys-lru", "allkeys-lfu", "allkeys-random"})


@dataclass(frozen=True, slots=True)
class StoreMemory:
    used: int  # bytes Redis has allocated (used_memory)
    limit: int  # its maxmemory; 0: no limit
    evicted: int  # keys evicted to stay under the limit since the server(s) started
    policy: str  # maxmemory-policy

    @property
    def policy_is_safe(self) -> bool:
        return self.policy not in UNSAFE_POLICIES


def from_info(nodes: Iterable[tuple[Mapping[str, Any], Mapping[str, Any]]]) -> StoreMemory:
    """Sum INFO memory and INFO stats, one pair per server."""
    used = limit = evicted = 0
    policies = set()
    for memory, stats in nodes:
        used += int(memory.get("used_memory", 0))
        limit += int(memory.get("maxmemory", 0))
        evicted += int(stats.get("evicted_keys", 0))
        policies.add(str(memory.get("maxmemory_policy", "")))
    # Servers that disagree: report the worst (an unsafe one) so the warning shows.
    unsafe = sorted(policies & UNSAFE_POLICIES)
    policy = unsafe[0] if unsafe else ",".join(sorted(policies))
    return StoreMemory(used, limit, evicted, policy)
