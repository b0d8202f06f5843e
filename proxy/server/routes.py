"""The routes that carry a conversation over HTTP: POST /v1/messages,
/v1/messages/count_tokens, /v1/chat/completions and /v1/responses (with that API's own
step: proxy/server/responses.py). Each request is one exchange (proxy/server/exchange.py)
over the HTTP transport (proxy/server/http_transport.py), built here with what it
depends on: the app's lifetime state is read here, once, and given in.

A request that fits goes out as its original bytes (docs/design.md#fits-means-untouched);
one over its trigger goes out rewritten. Any failure of the proxy's own compaction parts
forwards the request untouched (invariant 7); refusals the API itself would give are
raised as `ProxyError`s and rendered in the route's shape (proxy/server/errors.py).
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable

from aiohttp import web

from proxy.core.errors import ExpectationFailed
from proxy.core.reuse import Reuse
from proxy.server.bodies import Parse, continuing, plain_parse, too_large
from proxy.server.budgets import budget_of
from proxy.server.caller import caller_of, tenant_of_request
from proxy.server.errors import render
from proxy.server.exchange import ConversationRoute, Exchange
from proxy.server.http_transport import HttpTransport
from proxy.server.record import current_or_throwaway
from proxy.server.routing import OPENAI_UPSTREAM
from proxy.server.state import COMPACTOR, SETTINGS, STORE, UPSTREAM
from proxy.server.upstream import Upstream
from proxy.wire import ANTHROPIC, CHAT

log = logging.getLogger(__name__)

MESSAGES = ConversationRoute(UPSTREAM, ANTHROPIC)
COUNT_TOKENS = ConversationRoute(UPSTREAM, ANTHROPIC, compacts=False)
CHAT_COMPLETIONS = ConversationRoute(
    OPENAI_UPSTREAM, CHAT, bad_json="We could not parse the JSON body of your request"
)


ExpectHandler = Callable[[web.Request], Awaitable[web.StreamResponse | None]]


def expect_for(route: ConversationRoute) -> ExpectHandler:
    async def expect_within_limit(request: web.Request) -> web.StreamResponse | None:
        """Answer `Expect: 100-continue`: go on only when the announced body fits, so a
        client with a body over the limit gets its 413 before uploading it."""
        limit = request.app[SETTINGS].server.max_body_bytes
        length = request.content_length
        if length is not None and length > limit:
            return render(too_large(limit), route.wire)
        if request.headers.get("Expect", "").lower() != "100-continue":
            return render(ExpectationFailed("Unsupported Expect header."), route.wire)
        if request.version >= (1, 1):
            await request.writer.write(b"HTTP/1.1 100 Continue\r\n\r\n")
            request.writer.output_size = 0  # the real response has not started
        return None

    return expect_within_limit


async def handle_conversation(
    request: web.Request,
    route: ConversationRoute,
    *,
    upstream: Upstream | None = None,
    path: str | None = None,
) -> web.StreamResponse:
    """One HTTP request's exchange, its dependencies given in. `upstream` and `path`:
    where it goes when not the route's upstream and the client's path (a provider's
    route picks them from the path)."""
    app = request.app
    compactor = app[COMPACTOR]
    parse = parser_for(request, route, compactor.reuse)
    caller = caller_of(request)
    budget = budget_of(request)
    record = current_or_throwaway()
    if upstream is None:
        assert route.upstream is not None, "a route without an upstream of its own names one"
        upstream = app[route.upstream]
    transport = HttpTransport(
        request,
        upstream,
        route.wire,
        record,
        app[SETTINGS].server,
        must_read=budget.applies,
        key_checks=caller.key_id is not None,
        bad_json=route.bad_json,
        codecs=route.codecs,
        parse=parse,
        path=path,
        merged_headers=route.merged_headers,
    )
    exchange = Exchange(
        route,
        transport,
        request,
        caller=caller,
        compactor=compactor,
        store=app[STORE].store,
        upstream=upstream,
        budget=budget,
        record=record,
    )
    return await exchange.run()


def parser_for(request: web.Request, route: ConversationRoute, reuse: Reuse) -> Parse:
    """How the route's bodies are parsed: a conversation's as the continuation of its
    line's last request (`reuse`: the compactor's reuse cache), anything else plainly."""
    if not route.compacts:
        return plain_parse
    return continuing(reuse, route.wire, tenant_of_request(request), request.headers)


async def handle_messages(request: web.Request) -> web.StreamResponse:
    return await handle_conversation(request, MESSAGES)


async def handle_count_tokens(request: web.Request) -> web.StreamResponse:
    return await handle_conversation(request, COUNT_TOKENS)


async def handle_chat_completions(request: web.Request) -> web.StreamResponse:
    return await handle_conversation(request, CHAT_COMPLETIONS)
