"""Requests in flight and the drain on shutdown.

On SIGTERM `serve` marks the app draining: /readyz answers 503 at once, so a load
balancer stops sending new work, while the listening socket stays open and requests in
flight (long streams above all) run on until they end or `server.drain_timeout` passes.
Only then does the runner close connections.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field

from aiohttp import web


@dataclass(slots=True)
class Lifecycle:
    draining: bool = False
    in_flight: int = 0
    _idle: asyncio.Event = field(default_factory=asyncio.Event)

    def __post_init__(self) -> None:
        self._idle.set()

    def started(self) -> None:
        self.in_flight += 1
        self._idle.clear()

    def finished(self) -> None:
        self.in_flight -= 1
        if self.in_flight <= 0:
            self._idle.set()

    async def drain(self, seconds: float) -> bool:
        """Fail readiness, then wait for the requests in flight; False if time ran out.
        The drain request itself is not one of them (it comes from a signal)."""
        self.draining = True
        try:
            async with asyncio.timeout(seconds):
                await self._idle.wait()
            return True
        except TimeoutError:
            return False


LIFECYCLE = web.AppKey("lifecycle", Lifecycle)
