"""The fleet's key for sealed references (proxy/core/seal.py), kept in the store.

The first replica that needs it makes a random key and stores it with SET NX; every
replica then reads the same one, so a reference sealed on one replica opens on any. Each
replica keeps its copy for an hour, and every read gives the stored key a fresh TTL (the
store's), so it outlives the summaries it seals references to. The key never appears in a
log line, a metric or a response.
"""

from __future__ import annotations

import logging
import secrets
import time
from typing import cast

from proxy.store import Store, StoreUnavailable
from proxy.store.keys import global_key

log = logging.getLogger(__name__)

KIND, NAME = "seal", "v1"
KEEP_SECONDS = 3600.0


class SealKey:
    def __init__(self) -> None:
        self._key: bytes | None = None
        self._fetched = float("-inf")
        self._of: object = None

    async def get(self, store: Store | None) -> bytes | None:
        """The key, or None when the store cannot give it (and none was fetched before)."""
        if store is None:
            return None
        fresh = time.monotonic() - self._fetched < KEEP_SECONDS
        if self._key is not None and fresh and self._of is store:
            return self._key
        name = global_key(store.prefix, KIND, NAME)
        candidate = secrets.token_hex(32).encode()
        client = store.client
        ttl = store.default_ttl
        try:
            await store.run(lambda: client.set(name, candidate, nx=True, ex=ttl))
            raw = cast("bytes | None", await store.run(lambda: client.get(name)))
            await store.run(lambda: client.expire(name, ttl))
        except StoreUnavailable:
            return self._key if self._of is store else None
        if not raw:
            log.warning("the fleet's seal key vanished between two calls; trying later")
            return self._key if self._of is store else None
        self._key, self._fetched, self._of = bytes(raw), time.monotonic(), store
        return self._key
