"""Pytest fixture serving the stand-in with Responses options of the test's choosing.

`make_responses_standin(options, responses)` starts the stand-in on a loopback port in the
test's own event loop with `app[RESPONSES] = responses` (see proxy/testing/
api_responses.py), and yields a `RunningStandIn` (`.url`, `.app`, `.recorded`).
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable

import pytest
from aiohttp import web

from proxy.testing.api_responses import RESPONSES, ResponsesOptions
from proxy.testing.standin import StandInOptions, create_app
from tests.plugins.standin import RunningStandIn

MakeResponsesStandIn = Callable[[StandInOptions, ResponsesOptions], Awaitable[RunningStandIn]]


@pytest.fixture
async def make_responses_standin() -> AsyncIterator[MakeResponsesStandIn]:
    runners: list[web.AppRunner] = []

    async def make(options: StandInOptions, responses: ResponsesOptions) -> RunningStandIn:
        app = create_app(options)
        app[RESPONSES] = responses
        runner = web.AppRunner(app, handler_cancellation=True, shutdown_timeout=1.0)
        await runner.setup()
        runners.append(runner)
        site = web.TCPSite(runner, "127.0.0.1", 0)
        await site.start()
        host, port = runner.addresses[0][:2]
        return RunningStandIn(f"http://{host}:{port}", app, options)

    yield make
    for runner in runners:
        await runner.cleanup()
