"""Every other path and method: forwarded unchanged, streamed both ways, to the upstream
proxy/server/routing.py picks (Anthropic, or OpenAI-format)."""

from __future__ import annotations

import aiohttp
from aiohttp import web

from proxy.server.errors import not_a_path, upstream_failure
from proxy.server.headers import upstream_request_headers
from proxy.server.relay import relay
from proxy.server.routing import OPENAI_UPSTREAM, upstream_for
from proxy.server.state import UPSTREAM


async def handle_passthrough(request: web.Request) -> web.StreamResponse:
    if request.raw_path[:1] != "/":
        raise not_a_path(request.raw_path)
    # The path (and for paths both APIs have, the client's headers) picks the upstream.
    openai = upstream_for(request.path, request.headers) == "openai"
    upstream = request.app[OPENAI_UPSTREAM if openai else UPSTREAM]
    headers = upstream_request_headers(request.headers)
    data = None
    if request.body_exists:
        # Streamed as it arrives; with a known length the same length goes on.
        data = request.content
        if request.content_length is not None:
            headers.append(("Content-Length", str(request.content_length)))
    try:
        response = await upstream.send(
            request.method, request.raw_path, headers, data, stream=False
        )
    except (aiohttp.ClientError, TimeoutError) as e:
        raise upstream_failure(e, upstream.base_url, upstream.timeout_for(False)) from None
    return await relay(
        request, response, base_url=upstream.base_url, read_timeout=upstream.timeout_for(False)
    )
