"""/healthz: the process answers. /readyz: the store answers and an upstream is set."""

from __future__ import annotations

import orjson
from aiohttp import web

from proxy.server.lifecycle import LIFECYCLE
from proxy.server.state import STORE, UPSTREAM


async def handle_healthz(request: web.Request) -> web.Response:
    return web.Response(body=b'{"status":"ok"}', content_type="application/json")


async def handle_readyz(request: web.Request) -> web.Response:
    state = request.app[STORE]
    upstream = request.app[UPSTREAM].shown_url  # never a password in the URL
    if state.store is None:
        store = f"unavailable: {state.problem or 'not started'}"
    elif await state.store.ping():
        store = "ok"
    else:
        store = "unreachable"
    draining = request.app[LIFECYCLE].draining
    ready = store == "ok" and bool(upstream) and not draining
    body = {"ready": ready, "store": store, "upstream": upstream or "not configured"}
    if draining:
        body["draining"] = True
    return web.Response(
        status=200 if ready else 503, body=orjson.dumps(body), content_type="application/json"
    )
