"""Build and run the proxy application."""

from __future__ import annotations

import asyncio
import logging
import signal
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass

from aiohttp import web

from proxy.config import Settings
from proxy.server.admin.routes import install as install_admin
from proxy.server.auth import authenticate
from proxy.server.compactor import Compactor
from proxy.server.errors import render_errors
from proxy.server.fleet import fleet_lifetime
from proxy.server.health import handle_healthz, handle_readyz
from proxy.server.lifecycle import LIFECYCLE, Lifecycle
from proxy.server.logs import REQUEST_LOG, RequestLog, redacted_url
from proxy.server.metrics import METRICS, Metrics, handle_metrics, observe_requests
from proxy.server.passthrough import handle_passthrough
from proxy.server.responses import (
    RESPONSES_STATE,
    ResponsesState,
    expect_responses,
    handle_responses,
    handle_responses_get,
)
from proxy.server.routes import (
    CHAT_COMPLETIONS,
    COUNT_TOKENS,
    MESSAGES,
    expect_for,
    handle_chat_completions,
    handle_count_tokens,
    handle_messages,
)
from proxy.server.routing import openai_upstream_lifetime
from proxy.server.state import COMPACTOR, SETTINGS, STORE, UPSTREAM, StoreState
from proxy.server.upstream import Upstream
from proxy.store import EmbeddedRedis, Store

log = logging.getLogger(__name__)


async def _upstream_lifetime(app: web.Application) -> AsyncIterator[None]:
    app[UPSTREAM] = Upstream(app[SETTINGS].upstream)
    yield
    await app[UPSTREAM].close()


async def _store_lifetime(app: web.Application) -> AsyncIterator[None]:
    """Connect the store (or start the embedded Redis). A store that is down at start
    does not stop the proxy: it forwards without it, and /readyz says so."""
    settings = app[SETTINGS]
    state = app[STORE]
    url = settings.store.redis_url
    if not url:
        state_dir = settings.resolved_state_dir()
        embedded = EmbeddedRedis(state_dir / "redis")
        try:
            url = await embedded.start()
            state.embedded = embedded
        except Exception as e:  # a missing binary, a busy state dir: degrade, say why
            log.warning("embedded Redis did not start (%s); running without a store", e)
            state.problem = f"embedded Redis did not start: {e}"
            await embedded.stop()
    if url:
        try:
            state.store = Store.from_url(
                url,
                prefix=settings.store.key_prefix,
                op_timeout=settings.store.op_timeout,
                default_ttl=settings.store.ttl,
            )
        except Exception as e:  # the URL passed validation; redis-py may still refuse it
            log.warning(
                "cannot use Redis at %s (%s); running without a store", redacted_url(url), e
            )
            state.problem = f"cannot use the Redis URL: {e}"
    if state.store is not None:
        state.store.on_error = app[METRICS].store_errors.inc
    if state.store is not None and not await state.store.ping():
        log.warning("Redis at %s does not answer; forwarding without it for now", redacted_url(url))
    yield
    if state.store is not None:
        await state.store.close()
    if state.embedded is not None:
        await state.embedded.stop()


async def _compactor_lifetime(app: web.Application) -> AsyncIterator[None]:
    """Load the encoding before the first request (it takes a few hundred ms), in a
    thread, so no request stalls the event loop waiting for it; stop calibration's
    background work before the store closes."""
    await asyncio.to_thread(app[COMPACTOR].counter.count_text, "warm up")
    yield
    await app[COMPACTOR].close()


def create_app(settings: Settings) -> web.Application:
    # Outermost first: the record and metrics see every answer, errors included; key
    # checks and budgets (a no-op with keys off) run inside them.
    app = web.Application(middlewares=[observe_requests, render_errors, authenticate])
    app[SETTINGS] = settings
    app[METRICS] = Metrics()
    app[LIFECYCLE] = Lifecycle()
    app[REQUEST_LOG] = RequestLog(settings.server.log_format)
    app[STORE] = StoreState()
    app[COMPACTOR] = Compactor(settings.policies)
    app[RESPONSES_STATE] = ResponsesState()
    # Started in this order, stopped in the reverse: nothing outlives what it uses.
    app.cleanup_ctx.append(_upstream_lifetime)
    app.cleanup_ctx.append(openai_upstream_lifetime)
    app.cleanup_ctx.append(_store_lifetime)
    app.cleanup_ctx.append(fleet_lifetime)
    app.cleanup_ctx.append(_compactor_lifetime)
    app.router.add_get("/healthz", handle_healthz)
    app.router.add_get("/readyz", handle_readyz)
    app.router.add_get("/metrics", handle_metrics)
    app.router.add_post("/v1/messages", handle_messages, expect_handler=expect_for(MESSAGES))
    app.router.add_post(
        "/v1/messages/count_tokens", handle_count_tokens, expect_handler=expect_for(COUNT_TOKENS)
    )
    app.router.add_post(
        "/v1/chat/completions",
        handle_chat_completions,
        expect_handler=expect_for(CHAT_COMPLETIONS),
    )
    app.router.add_post("/v1/responses", handle_responses, expect_handler=expect_responses)
    app.router.add_get("/v1/responses", handle_responses_get)
    install_admin(app)  # the admin API and the dashboard (404 without an admin key)
    app.router.add_route("*", "/{tail:.*}", handle_passthrough)
    return app


@dataclass
class RunningProxy:
    app: web.Application
    runner: web.AppRunner
    url: str  # http://host:port of the listening socket

    async def stop(self) -> None:
        await self.runner.cleanup()


async def start(settings: Settings) -> RunningProxy:
    """Start listening on settings.server.host:port (port 0: any free port)."""
    app = create_app(settings)
    runner = web.AppRunner(
        app,
        # A client that disconnects cancels its handler, and so the upstream request.
        handler_cancellation=True,
        # Request bodies are forwarded as sent, compressed or not.
        auto_decompress=False,
        access_log=None,
        # serve() drains first (server.drain_timeout); what is left then is closed soon.
        shutdown_timeout=1.0,
        max_field_size=65536,
        max_line_size=65536,
    )
    await runner.setup()
    site = web.TCPSite(runner, settings.server.host, settings.server.port, backlog=1024)
    await site.start()
    host, port = runner.addresses[0][:2]
    if ":" in host:
        host = f"[{host}]"
    return RunningProxy(app, runner, f"http://{host}:{port}")


def event_loop_factory(choice: str) -> Callable[[], asyncio.AbstractEventLoop] | None:
    """The loop `serve` runs on: uvloop unless asyncio's is asked for (or uvloop is
    missing and "auto" allows going without it)."""
    if choice == "asyncio":
        return None
    try:
        import uvloop
    except ImportError:
        if choice == "uvloop":
            raise RuntimeError("server.event_loop = uvloop, but uvloop is not installed") from None
        return None
    factory: Callable[[], asyncio.AbstractEventLoop] = uvloop.new_event_loop
    return factory


def run(settings: Settings) -> None:
    """Run `serve` on the configured event loop."""
    with asyncio.Runner(loop_factory=event_loop_factory(settings.server.event_loop)) as runner:
        runner.run(serve(settings))


async def serve(settings: Settings) -> None:
    """Run until SIGINT or SIGTERM; then drain (readiness fails, open requests finish
    within server.drain_timeout) and stop."""
    running = await start(settings)
    log.info("compaction-proxy listening on %s, upstream %s", running.url, settings.upstream.url)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    try:
        await stop.wait()
        running.app[METRICS].draining.set(1)
        log.info("draining: readiness fails; waiting for open requests")
        if not await running.app[LIFECYCLE].drain(settings.server.drain_timeout):
            log.warning("drain timeout: closing the requests still open")
    finally:
        await running.stop()
