"""What every request passes before its route's handler, in one middleware.

In order: its target made canonical (a 400 in the route's API shape otherwise:
proxy/server/target.py), a Gemini key given in the query moved into its header
(proxy/server/gemini.py), then the key check, the key swapped for the upstream
credential and the budgets' admission (proxy/server/auth.py); a `ProxyError` any of
them or the handler raises is answered in the shape of the route's API
(proxy/server/errors.py). It sits inside the metrics middleware (the status it answers
is recorded) and, with tracing on, inside the request's span.

One layer, not one per step: each aiohttp middleware is a call and a coroutine on every
request, and these steps are plain checks that nearly always let the request through
(bench/RESULTS.md, issue 34: the pass-through request's CPU).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable

from aiohttp import web

from proxy.core.errors import ProxyError
from proxy.server.auth import authenticate
from proxy.server.errors import render, wire_for
from proxy.server.gemini import key_in_header
from proxy.server.target import target_refusal

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


@web.middleware
async def front_door(request: web.Request, handler: Handler) -> web.StreamResponse:
    try:
        refused = target_refusal(request)
        if refused is not None:
            return refused
        return await authenticate(key_in_header(request), handler)
    except ProxyError as error:
        # In the shape of the request as the client sent it (its path and headers).
        return render(error, wire_for(request.path, request.headers))
