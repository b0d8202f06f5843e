"""Pytest fixtures serving the stand-in upstream on a real loopback port.

- `standin` / `make_standin(options)`: in the test's own event loop (async tests);
- `standin_thread` / `make_standin_thread(options)`: in a background thread with its own
  loop, for sync tests (the sync SDK client would block the test's loop).

Each yields a `RunningStandIn` with `.url`, `.app`, `.recorded` (and `.options`).
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from dataclasses import dataclass

import pytest
from aiohttp import web

from proxy.testing.standin import RECORDED, RecordedRequest, StandInOptions, create_app


@dataclass
class RunningStandIn:
    url: str
    app: web.Application
    options: StandInOptions

    @property
    def recorded(self) -> list[RecordedRequest]:
        return self.app[RECORDED]

    @property
    def agent_calls(self) -> list[RecordedRequest]:
        """What was sent for the client: the proxy's own calls (summaries) left out."""
        return [r for r in self.recorded if not r.headers.get("x-compaction-proxy-purpose")]


async def _start(options: StandInOptions) -> tuple[RunningStandIn, web.AppRunner]:
    app = create_app(options)
    runner = web.AppRunner(app, handler_cancellation=True, shutdown_timeout=1.0)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    host, port = runner.addresses[0][:2]
    return RunningStandIn(f"http://{host}:{port}", app, options), runner


@pytest.fixture
async def make_standin() -> AsyncIterator[Callable[[StandInOptions], Awaitable[RunningStandIn]]]:
    runners: list[web.AppRunner] = []

    async def make(options: StandInOptions) -> RunningStandIn:
        running, runner = await _start(options)
        runners.append(runner)
        return running

    yield make
    for runner in runners:
        await runner.cleanup()


@pytest.fixture
async def standin(
    make_standin: Callable[[StandInOptions], Awaitable[RunningStandIn]],
) -> RunningStandIn:
    return await make_standin(StandInOptions())


class _ThreadedStandIn:
    """A stand-in whose event loop runs in a daemon thread."""

    def __init__(self, options: StandInOptions) -> None:
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self.thread.start()
        future = asyncio.run_coroutine_threadsafe(_start(options), self.loop)
        self.running, self.runner = future.result(timeout=30)

    def stop(self) -> None:
        asyncio.run_coroutine_threadsafe(self.runner.cleanup(), self.loop).result(timeout=30)
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(timeout=30)
        self.loop.close()


@pytest.fixture
def make_standin_thread() -> Iterator[Callable[[StandInOptions], RunningStandIn]]:
    started: list[_ThreadedStandIn] = []

    def make(options: StandInOptions) -> RunningStandIn:
        server = _ThreadedStandIn(options)
        started.append(server)
        return server.running

    yield make
    for server in started:
        server.stop()


@pytest.fixture
def standin_thread(
    make_standin_thread: Callable[[StandInOptions], RunningStandIn],
) -> RunningStandIn:
    return make_standin_thread(StandInOptions())
