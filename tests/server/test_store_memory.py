"""The embedded Redis runs under a memory limit that evicts only what may go, and
/metrics says how full it is and how many refs could not be read."""

from __future__ import annotations

import uuid
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import anthropic
import redis.asyncio

from proxy.server.state import STORE
from proxy.store.keys import scan_pattern
from proxy.testing.agent import Turn, run_agent
from proxy.testing.standin import StandInOptions
from tests.server.conftest import MakeProxy
from tests.server.test_metrics import scrape, value

MakeStandIn = Callable[[StandInOptions], Awaitable[Any]]
P = "compaction_proxy_"


async def test_embedded_store_is_bounded_and_measured(
    make_standin: MakeStandIn, make_compacting_proxy: MakeProxy, tmp_path: Path
) -> None:
    standin = await make_standin(StandInOptions(windows={"*": 30_000}, max_recorded=None))
    proxy = await make_compacting_proxy(
        standin.url,
        redis="",  # the proxy's own embedded Redis
        **{"store.state_dir": str(tmp_path), "store.max_memory": "64mb"},
    )
    embedded = proxy.app[STORE].embedded
    store = proxy.app[STORE].store
    client = redis.asyncio.Redis.from_url(embedded.url)
    try:
        config = await client.config_get("maxmemory*")
        assert config["maxmemory"] == str(64 * 1024 * 1024)
        assert config["maxmemory-policy"] == "volatile-lru"

        async def evict_every_blob(turn: int, _: Turn) -> None:
            if turn == 12:  # as Redis would under memory pressure
                blobs = [k async for k in client.scan_iter(match=scan_pattern(store.prefix))]
                blobs = [k for k in blobs if b":blob:" in k]
                assert blobs
                await client.delete(*blobs)
                store.blob_cache.clear()

        agent = anthropic.AsyncAnthropic(base_url=proxy.url, api_key="sk-mem", max_retries=0)
        turns = await run_agent(
            agent, turns=24, result_chars=8_000, read_every=3,
            conversation=f"memory-{uuid.uuid4().hex}", on_turn=evict_every_blob,
        )  # fmt: skip
        assert len(turns) == 24
        m = await scrape(proxy)
        assert value(m, P + "store_memory_limit_bytes") == 64 * 1024 * 1024
        assert 0 < value(m, P + "store_memory_used_bytes") < 64 * 1024 * 1024
        assert value(m, P + "store_evicted_keys") == 0  # deleted by hand, not evicted
        assert value(m, P + "unreadable_refs_total") > 0
    finally:
        await client.aclose()
