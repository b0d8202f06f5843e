"""The stand-in upstream: the app that serves every API's routes, and how to run it.

See the package docstring (proxy/testing/__init__.py) for its shape and how to add an API.
Every request is appended to `app[RECORDED]` when it arrives, with its outcome when done.
"""

from __future__ import annotations

import asyncio
import signal
from collections import Counter

from aiohttp import web

from proxy.core.tokens import default_counter
from proxy.testing import (
    api_bedrock,
    api_chat,
    api_gemini,
    api_messages,
    api_responses,
    api_vertex,
    responses_ws,
)
from proxy.testing.answering import ANALYSES
from proxy.testing.cache import PromptCache
from proxy.testing.standin_http import (
    CACHE,
    COUNTER,
    FAULT_COUNTS,
    OPTIONS,
    RECORDED,
    RecordedRequest,
    StandInOptions,
    add_request_id,
    api_shell,
)

# Each API adds its routes (and the options it keeps in the app).
APIS = (
    api_messages.add_routes,  # POST /v1/messages, /v1/messages/count_tokens, GET /v1/models
    api_chat.add_routes,  # POST /v1/chat/completions
    api_responses.add_routes,  # POST /v1/responses
    responses_ws.add_routes,  # GET /v1/responses (a WebSocket, or refused)
    api_bedrock.add_routes,  # POST /model/{id}/invoke..., GET /inference-profiles (Bedrock)
    api_vertex.add_routes,  # POST /v1/projects/.../models/{id}:rawPredict..., /oauth2/token
    api_gemini.add_routes,  # POST /v1beta/models/{id}:generateContent..., GET /v1beta/models
)


def create_app(options: StandInOptions | None = None) -> web.Application:
    options = options or StandInOptions()
    app = web.Application(middlewares=[api_shell], client_max_size=options.max_body_bytes)
    app[OPTIONS] = options
    app[RECORDED] = []
    app[CACHE] = PromptCache(options.cache_ttl_seconds, options.cache_min_tokens)
    app[FAULT_COUNTS] = Counter()
    app[COUNTER] = default_counter()
    app[ANALYSES] = {}
    app.on_response_prepare.append(add_request_id)
    for add_routes in APIS:
        add_routes(app)
    return app


async def start(host: str, port: int, options: StandInOptions) -> tuple[web.AppRunner, str]:
    """Listen on host:port (0: any free port); the runner (cleanup() stops it) and the
    URL. An address that cannot be listened on raises OSError, with nothing left open."""
    runner = web.AppRunner(create_app(options), handler_cancellation=True, shutdown_timeout=1.0)
    await runner.setup()
    try:
        await web.TCPSite(runner, host, port).start()
    except BaseException:
        await runner.cleanup()
        raise
    bound_host, bound_port = runner.addresses[0][:2]
    bound_host = f"[{bound_host}]" if ":" in bound_host else bound_host
    return runner, f"http://{bound_host}:{bound_port}"


async def _serve(host: str, port: int, options: StandInOptions) -> None:
    runner, url = await start(host, port, options)
    print(
        "stand-in upstream (Messages, Chat Completions, Responses, Bedrock, Vertex, Gemini)"
        f" listening on {url}",
        flush=True,
    )
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    try:
        await stop.wait()
    finally:
        await runner.cleanup()


def run(host: str, port: int, options: StandInOptions) -> None:
    """Serve the stand-in until SIGINT or SIGTERM (the `compaction-proxy stand-in`
    command); OSError when host:port cannot be listened on."""
    asyncio.run(_serve(host, port, options))


__all__ = ["RECORDED", "RecordedRequest", "StandInOptions", "create_app", "run", "start"]
