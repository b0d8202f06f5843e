"""Build and run the proxy application."""

from __future__ import annotations

import asyncio
import errno
import gc
import logging
import os
import signal
import socket
import time
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass

from aiohttp import web

from proxy import tracing
from proxy.config import Settings
from proxy.core.model_facts import BUILTIN, UNKNOWN_WINDOWS
from proxy.core.policy import DEFAULT_POLICIES
from proxy.core.tokens import TokenCounter
from proxy.server import bedrock, vertex
from proxy.server.admin.routes import install as install_admin
from proxy.server.compactor import Compactor
from proxy.server.fleet import fleet_lifetime
from proxy.server.front_door import front_door
from proxy.server.gemini import add_routes as add_gemini_routes
from proxy.server.health import handle_healthz, handle_readyz
from proxy.server.lifecycle import LIFECYCLE, Lifecycle
from proxy.server.listener import CappedSite, connection_cap
from proxy.server.logs import REQUEST_LOG, RequestLog, redacted_url
from proxy.server.metrics import METRICS, Metrics, handle_metrics, observe_requests
from proxy.server.passthrough import handle_passthrough
from proxy.server.refresh_ahead import MissingCredential
from proxy.server.responses import (
    RESPONSES_STATE,
    ResponsesState,
    expect_responses,
    handle_responses,
)
from proxy.server.responses_ws import handle_responses_get
from proxy.server.routes import (
    CHAT_COMPLETIONS,
    COUNT_TOKENS,
    MESSAGES,
    expect_for,
    handle_chat_completions,
    handle_count_tokens,
    handle_messages,
)
from proxy.server.routing import OPENAI_UPSTREAM, openai_upstream_lifetime
from proxy.server.state import COMPACTOR, SETTINGS, STORE, UPSTREAM, StoreState
from proxy.server.tasks import stop_tasks
from proxy.server.traces import trace_requests, tracing_lifetime
from proxy.server.upstream import Upstream
from proxy.store import EmbeddedRedis, StateDirBusy, Store, StoreUnavailable
from proxy.store.probe import addressing_problem

log = logging.getLogger(__name__)


async def _upstream_lifetime(app: web.Application) -> AsyncIterator[None]:
    app[UPSTREAM] = Upstream(app[SETTINGS].upstream)
    yield
    await app[UPSTREAM].close()


class StartupError(Exception):
    """A setting that keeps the proxy from starting; the message names it and its source."""


# A `keys` or `budgets` command runs the embedded Redis for a moment when no serve does;
# a serve starting meanwhile waits this long for it to finish.
COMMAND_HOLD_WAIT = 30.0

# Every app of the process counts with one cache; its keys are salted by a secret when
# PYTHONHASHSEED makes the hash's own known (tokens.CountKey).
_FIXED_SEED = os.environ.get("PYTHONHASHSEED", "random") != "random"
COUNTER = TokenCounter(salt=os.urandom(16) if _FIXED_SEED else b"")


async def _start_embedded(settings: Settings, embedded: EmbeddedRedis) -> str:
    """Start the embedded Redis; refuse (StartupError) when another serve runs one over
    the same state dir, since two proxies must not write the same files."""
    deadline = time.monotonic() + COMMAND_HOLD_WAIT
    while True:
        try:
            return await embedded.start()
        except StateDirBusy as busy:
            owner = busy.owner
            if (owner is None or owner.role == "serve") or time.monotonic() > deadline:
                who = f"another serve (pid {owner.pid})" if owner else "another process"
                source = settings.source_of("store.state_dir")
                raise StartupError(
                    f"store.state_dir {settings.resolved_state_dir()} ({source}): {who} runs"
                    " the embedded Redis there; stop it, give this one its own state"
                    " directory (COMPACTION_PROXY_STORE_STATE_DIR), or share that Redis"
                    f" with --redis-url {embedded.url}"
                ) from None
        await asyncio.sleep(0.1)


async def _store_lifetime(app: web.Application) -> AsyncIterator[None]:
    """Connect the store (or start the embedded Redis). A store that is down at start
    does not stop the proxy: it forwards without it, and /readyz says so. A store that
    can never work as addressed (another serve's state dir, a database Redis does not
    have, credentials it refuses) stops start-up with a StartupError."""
    settings = app[SETTINGS]
    state = app[STORE]
    url = settings.store.redis_url
    if not url:
        state_dir = settings.resolved_state_dir()
        embedded = EmbeddedRedis(
            state_dir / "redis", role="serve", options={"maxmemory": settings.store.max_memory}
        )
        try:
            url = await _start_embedded(settings, embedded)
            state.embedded = embedded
        except StartupError:
            raise
        except Exception as e:  # a missing binary, a broken data file: degrade, say why
            log.warning("embedded Redis did not start (%s); running without a store", e)
            state.problem = f"embedded Redis did not start: {e}"
            await embedded.stop()
    elif problem := await _addressing_problem(settings, url):
        raise StartupError(
            f"store.redis_url {redacted_url(url)} ({settings.source_of('store.redis_url')}):"
            f" {problem}"
        )
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
        state.store.on_unreadable = app[METRICS].store.unreadable.inc
    if state.store is not None and not await state.store.ping():
        log.warning("Redis at %s does not answer; forwarding without it for now", redacted_url(url))
    elif state.store is not None:
        await _check_eviction_policy(state.store)
    yield
    if state.store is not None:
        await state.store.close()
    if state.embedded is not None:
        await state.embedded.stop()


async def _check_eviction_policy(store: Store) -> None:
    """Say at start-up if Redis may evict what must never go (docs/operating.md, "Sizing Redis")."""
    try:
        memory = await store.memory()
    except StoreUnavailable:
        return
    if not memory.policy_is_safe:
        log.warning(
            "Redis evicts with %s: proxy keys, limits and budget counters may be evicted; "
            "use volatile-lru (or noeviction)",
            memory.policy,
        )
    elif memory.limit == 0:
        log.info("Redis has no memory limit: stored results grow until their TTL ends")


async def _addressing_problem(settings: Settings, url: str) -> str | None:
    try:
        store = Store.from_url(url, prefix=settings.store.key_prefix, op_timeout=2.0)
    except Exception:  # redis-py refuses the URL itself: said where it is used below
        return None
    try:
        return await addressing_problem(store, url)
    finally:
        await store.close()


async def _compactor_lifetime(app: web.Application) -> AsyncIterator[None]:
    """Load the encoding before the first request (it takes a few hundred ms), in a
    thread, so no request stalls the event loop waiting for it; stop calibration's
    background work before the store closes."""
    await asyncio.to_thread(app[COMPACTOR].counter.count_text, "warm up")
    yield
    await app[COMPACTOR].close()


def create_app(settings: Settings) -> web.Application:
    # Traces only when the OTEL_* environment asks for them (proxy/tracing.py).
    try:
        traced = tracing.from_environment(os.environ, version=_version())
    except tracing.TracingUnavailable as e:
        raise StartupError(str(e)) from None
    # Outermost first: the record and metrics see every answer, errors included; the
    # request's span (with tracing on) is opened inside the record, so it reads what the
    # record says; then the front door: the target made canonical before anything reads
    # it, key checks and budgets (a no-op with keys off), errors in the API's shape.
    inner = [front_door]
    if traced is not None:
        inner.insert(0, trace_requests)
    app = web.Application(middlewares=[observe_requests, *inner])
    app[SETTINGS] = settings
    app[METRICS] = Metrics()
    app[LIFECYCLE] = Lifecycle()
    app[REQUEST_LOG] = RequestLog(settings.server.log_format)
    app[STORE] = StoreState()
    metrics = app[METRICS]
    app[COMPACTOR] = Compactor(
        settings.model_policies,
        counter=COUNTER,
        max_lines=settings.store.max_lines,
        off_loop_bytes=settings.server.off_loop_bytes,
        reuse_bytes=settings.server.reuse_max_bytes,
        on_background_summary=metrics.summariser_call,
        on_lines=metrics.conversation_lines.observe,
        on_evicted=metrics.checkpoints_evicted.inc,
    )
    metrics.watch_reuse(app[COMPACTOR].reuse)
    app[RESPONSES_STATE] = ResponsesState(settings.responses.codex_compaction)
    # Started in this order, stopped in the reverse: nothing outlives what it uses.
    if traced is not None:  # first: the upstream client's spans need it; flushed last
        app.cleanup_ctx.append(tracing_lifetime(traced))
    app.cleanup_ctx.append(_upstream_lifetime)
    app.cleanup_ctx.append(openai_upstream_lifetime)
    app.cleanup_ctx.append(bedrock.bedrock_lifetime)
    app.cleanup_ctx.append(vertex.vertex_lifetime)
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
    bedrock.add_routes(app)
    vertex.add_routes(app)
    add_gemini_routes(app)  # POST /v1beta/models/{model}:generateContent, ... (and /v1)
    install_admin(app)  # the admin API and the dashboard (404 without an admin key)
    app.router.add_route("*", "/{tail:.*}", handle_passthrough)
    return app


def _version() -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("compaction-proxy")
    except PackageNotFoundError:
        return ""


@dataclass
class RunningProxy:
    app: web.Application
    runner: web.AppRunner
    url: str  # http://host:port of the listening socket

    async def stop(self) -> None:
        await self.runner.cleanup()


def _listen_problem(settings: Settings, error: OSError) -> str:
    host, port = settings.server.host, settings.server.port
    where = (
        f"server.host {host} ({settings.source_of('server.host')}),"
        f" server.port {port} ({settings.source_of('server.port')})"
    )
    if error.errno == errno.EADDRINUSE:
        return (
            f"{where}: {host}:{port} is already in use (another compaction-proxy?);"
            " choose another with --port (0: any free port)"
        )
    if isinstance(error, socket.gaierror):
        return f"{where}: cannot resolve {host!r} ({error.strerror})"
    if error.errno == errno.EADDRNOTAVAIL:
        return f"{where}: {host} is not an address of this machine"
    if error.errno == errno.EACCES:
        return f"{where}: not allowed to listen on port {port} (ports below 1024 need root)"
    return f"{where}: cannot listen on {host}:{port}: {error.strerror or error}"


def check_listen(settings: Settings) -> None:
    """Fail fast, before anything starts, when the address cannot be listened on."""
    host, port = settings.server.host, settings.server.port
    try:
        infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)
        for family, kind, proto, _, address in infos if port else []:
            with socket.socket(family, kind, proto) as probe:
                # As asyncio's server does: a port in TIME_WAIT is free to take.
                probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
                probe.bind(address)
    except OSError as e:
        raise StartupError(_listen_problem(settings, e)) from None


async def start(settings: Settings) -> RunningProxy:
    """Start listening on settings.server.host:port (port 0: any free port). A setting
    that keeps it from starting raises StartupError, with nothing left running."""
    check_listen(settings)
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
        # A connection must have a request's headers in this long after it opens or its
        # last answer: idle and trickling connections do not pile up (listener.py).
        keepalive_timeout=settings.server.header_timeout,
    )
    try:
        await runner.setup()
        site = CappedSite(
            runner,
            settings.server.host,
            settings.server.port,
            max_connections=connection_cap(settings.server.max_connections),
        )
        await site.start()
    except BaseException as e:
        await runner.cleanup()  # what did start (the embedded Redis, upstream pools) stops
        if isinstance(e, OSError):
            raise StartupError(_listen_problem(settings, e)) from None
        if isinstance(e, MissingCredential):  # a provider configured without one
            raise StartupError(str(e)) from None
        raise
    host, port = runner.addresses[0][:2]
    if ":" in host:
        host = f"[{host}]"
    return RunningProxy(app, runner, f"http://{host}:{port}")


def startup_line(running: RunningProxy) -> str:
    """What the proxy is doing, in one line: where it listens, where requests go, which
    file configured it, its store, who may call it, and how many policies it applies."""
    settings = running.app[SETTINGS]
    state = running.app[STORE]
    if state.embedded is not None:
        store = f"embedded Redis in {state.embedded.state_dir}"
    elif state.store is not None:
        store = f"Redis {redacted_url(settings.store.redis_url)}"
    else:
        store = f"none ({state.problem or 'not started'}; forwarding without one)"
    auth = (
        "proxy keys required"
        if settings.auth.keys == "required"
        else "off (callers' own keys go upstream)"
    )
    openai = running.app[OPENAI_UPSTREAM].shown_url or "none (upstream.openai_url is not set)"
    own = len(settings.policies)
    policies = f"{own + len(DEFAULT_POLICIES)} ({own} from the file, {len(DEFAULT_POLICIES)}"
    policies += " built-in)"
    return (
        f"compaction-proxy listening on {running.url}, anthropic upstream"
        f" {running.app[UPSTREAM].shown_url}, openai upstream {openai},"
        f" bedrock upstream {bedrock.described(running.app)},"
        f" vertex upstream {vertex.described(running.app)},"
        f" config {settings.config_file or 'none (built-in defaults)'}, store {store},"
        f" auth {auth}, policies {policies}, windows {windows_line(settings)}"
    )


def windows_line(settings: Settings) -> str:
    """Which windows apply and where they come from: the policies that set one, then the
    model table for the rest, and the default for a model it lacks."""
    own = [p for p in settings.model_policies if p.window]  # the built-in one sets none
    named = "".join(f"{p.window:,} for {p.match!r} (its [[policy]]), " for p in own)
    unknown = ", ".join(f"{w:,} for {g}" for g, w in UNKNOWN_WINDOWS)
    rest = "others" if own else "every model"
    return f"{named}{rest} from the model table ({BUILTIN.described}); a model not in it: {unknown}"


def event_loop_factory(choice: str) -> Callable[[], asyncio.AbstractEventLoop] | None:
    """The loop `serve` runs on: uvloop unless asyncio's is asked for (or uvloop is
    missing and "auto" allows going without it)."""
    if choice == "asyncio":
        return None
    try:
        import uvloop
    except ImportError:
        if choice == "uvloop":
            raise StartupError(
                "server.event_loop uvloop: uvloop is not installed (pip install uvloop,"
                " or set it to auto or asyncio)"
            ) from None
        return None
    factory: Callable[[], asyncio.AbstractEventLoop] = uvloop.new_event_loop
    return factory


def run(settings: Settings) -> None:
    """Run `serve` on the configured event loop."""
    try:
        factory = event_loop_factory(settings.server.event_loop)
    except StartupError as e:
        raise StartupError(f"{e} ({settings.source_of('server.event_loop')})") from None
    with asyncio.Runner(loop_factory=factory) as runner:
        runner.run(serve(settings))


# Objects a request may allocate before the youngest generation is collected: a 50 KB
# turn parsed is some thousands of objects, so at the interpreter's 700 a request ran
# several collections, each walking what the request still held.
GC_YOUNG_THRESHOLD = 20_000


def tune_gc() -> None:
    """The serving process's collector: what start() built (modules, settings, pools,
    the tokenizer's tables) lives as long as the process, so it is frozen out of every
    collection, and the youngest generation is collected less often. Bench/overhead.py
    canned 50 KB turn, A/B in one run: 0.91x the proxy's CPU per request (bench/RESULTS.md,
    issue 34). Only `serve` calls it: an embedded start() leaves the host's collector be."""
    gc.freeze()
    _, older, oldest = gc.get_threshold()
    gc.set_threshold(GC_YOUNG_THRESHOLD, older, oldest)


async def serve(settings: Settings) -> None:
    """Run until SIGINT or SIGTERM; then drain (readiness fails, open requests finish
    within server.drain_timeout) and stop."""
    # Handlers first: a SIGTERM that comes as soon as /healthz answers still drains.
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    running = await start(settings)
    tune_gc()
    log.info("%s", startup_line(running))
    try:
        await stop.wait()
        running.app[METRICS].draining.set(1)
        log.info("draining: readiness fails; waiting for open requests")
        if not await running.app[LIFECYCLE].drain(settings.server.drain_timeout):
            log.warning("drain timeout: closing the requests still open")
    finally:
        await running.stop()
        # What is still running (a handler the server gave up waiting for) is stopped
        # within a deadline, so the process exits rather than wait for it at loop close.
        current = asyncio.current_task()
        await stop_tasks([t for t in asyncio.all_tasks() if t is not current], what="task")
