"""The lock a summary is made under, so the fleet pays for each summary once.

Whoever makes a summary (a crossing, or the summary made ahead in the background) holds
`summary:{key}` in the conversation's locks from before its summariser call until the
summary is stored; every other replica that wants the same summary waits for it, or
packs. The lock expires by itself `margin` seconds after the longest a summariser call
may take, so a replica that went away never blocks the conversation for long.
"""

from __future__ import annotations

import contextlib
from types import TracebackType

from proxy.store.redis import Store, StoreUnavailable

MARGIN = 30.0  # seconds the lock outlives the longest summariser call (to store it)


class SummaryLock:
    """The lock of one summary (`key`) of one conversation. `acquire` takes it if it is
    free; `release` lets it go (once; a store that is away lets it expire). As an async
    context manager it is released on leaving, however the block ends; a holder that
    hands it on (the crossing keeps it until its writes) releases it itself."""

    def __init__(
        self, store: Store, tenant: str, conversation: str, key: str, call_seconds: float
    ) -> None:
        self.store = store
        self.tenant = tenant
        self.conversation = conversation
        self.key = key
        self.ttl_ms = int((call_seconds + MARGIN) * 1000)
        self._token: str | None = None

    @property
    def name(self) -> str:
        return f"summary:{self.key}"

    @property
    def held(self) -> bool:
        return self._token is not None

    async def acquire(self) -> bool:
        """Take the lock if it is free (True), else False. Raises StoreUnavailable."""
        if self._token is None:
            self._token = await self.store.acquire_lock(
                self.tenant, self.conversation, self.name, self.ttl_ms
            )
        return self._token is not None

    async def release(self) -> None:
        """Let the lock go if this holds it; never raises for the store (it then expires
        by itself)."""
        token, self._token = self._token, None
        if token is not None:
            with contextlib.suppress(StoreUnavailable):
                await self.store.release_lock(self.tenant, self.conversation, self.name, token)

    async def __aenter__(self) -> SummaryLock:
        return self

    async def __aexit__(
        self,
        kind: type[BaseException] | None,
        error: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        await self.release()
