"""A Redis at its memory limit under volatile-lru (the embedded store's policy): old
blobs are evicted and read as missing; proxy keys, limits and budget counters stay."""

from __future__ import annotations

import os
import time
from pathlib import Path

from proxy.core.budget import Amounts
from proxy.store import EmbeddedRedis, Store
from proxy.store.accounts import Accounts, Held, Scope


async def test_eviction_takes_blobs_and_never_budgets(tmp_path: Path) -> None:
    server = EmbeddedRedis(tmp_path / "redis", options={"maxmemory": "4mb"})
    await server.start()
    store = Store.from_url(server.url, prefix="ev:", op_timeout=2.0, blob_cache_chars=0)
    try:
        accounts = Accounts(store)
        _, record = await accounts.create_key(team="blue", upstream_env="UPSTREAM")
        key = Scope("key", record["id"])
        await accounts.set_conf(key, {"month:input": 10_000_000})
        now = time.time()
        held = await accounts.reserve(key, Amounts(1234, 0, 0), now)
        assert isinstance(held, Held)

        # 12 MB of hard-to-compress results (hex digits: ~0.5x) into a 4 MB Redis.
        refs = [f"r_{i:04d}" for i in range(120)]
        for ref in refs:
            saved = await store.save_crossing(
                "t", "c", root="s", checkpoint={"last": ref},
                blobs=[(ref, os.urandom(50_000).hex())], summary=None, touch=[],
            )  # fmt: skip
            assert saved.complete, saved.error  # eviction makes room: writes never fail

        memory = await store.memory()
        assert memory.policy == "volatile-lru" and memory.policy_is_safe
        assert memory.evicted > 0
        assert memory.used <= memory.limit * 1.1
        readable = [ref for ref in refs if await store.read_blob("t", "c", ref) is not None]
        assert refs[-1] in readable  # the newest stay
        assert len(readable) < len(refs)  # the least recently used went
        # What has no TTL was never a candidate: the key, its limits and its usage.
        assert (await accounts.get_key(record["id"]) or {}).get("team") == "blue"
        assert (await accounts.get_conf(key))["month:input"] == "10000000"
        assert (await accounts.usage(key, now))["month"]["input"] == 1234
    finally:
        await store.close()
        await server.stop()
