"""POST /v1/chat/completions: the Messages pipeline for OpenAI Chat Completions.

The same steps as proxy/server/messages.py (read, check, prepare, forward, relay or
answer read_result), with the Chat wire: counted and rewritten by the OpenAI dialect,
forwarded to `upstream.openai_url`, and the proxy's own errors in OpenAI's shape.
"""

from __future__ import annotations

from aiohttp import web

from proxy.server import errors
from proxy.server.messages import JsonRoute, expect_within_limit, handle_json_route
from proxy.server.routing import OPENAI_UPSTREAM
from proxy.server.wires import CHAT_WIRE


async def expect_chat(request: web.Request) -> web.StreamResponse | None:
    """`Expect: 100-continue`, answered like the Messages routes, in OpenAI's shape."""
    refused = await expect_within_limit(request)
    return errors.as_openai(refused) if isinstance(refused, web.Response) else refused


CHAT = JsonRoute(
    "chat",
    OPENAI_UPSTREAM,
    wire=CHAT_WIRE,
    shape=errors.as_openai,
    bad_json="We could not parse the JSON body of your request",
    request_id_header="x-request-id",
)


async def handle_chat_completions(request: web.Request) -> web.StreamResponse:
    return await handle_json_route(request, CHAT)
