"""Claude through Google Vertex AI: the proxy's `/vertex` routes.

`POST /vertex/v1/projects/{project}/locations/{location}/publishers/anthropic/models/
{model}:rawPredict` (a whole answer) and `:streamRawPredict` (Anthropic's SSE): a
Messages conversation in Vertex's envelope (proxy/wire/anthropic_vertex.py), through the
same exchange as `/v1/messages` (compaction, read_result rounds merged, keys, budgets,
traces, metrics); `models/count-tokens:rawPredict` is forwarded (counted as sent). Any
other `/vertex` path is 404, in Google's error shape as every refusal of the proxy's own.

Every request goes out with the proxy's own access token (proxy/server/vertex_auth.py:
application default credentials, refreshed ahead of expiry); the client's
`Authorization` (or a proxy key in `x-api-key`) never reaches Google. It goes to
`upstream.vertex_url` when set, else to the endpoint of the location the path names.

The credential is found at start-up when `upstream.vertex_url` is set (a missing one
stops it, naming what to set), else at the first Vertex request (that request's 503).
"""

from __future__ import annotations

import re
from collections.abc import AsyncIterator
from dataclasses import replace
from typing import Any

from aiohttp import web

from proxy.config import UpstreamSettings
from proxy.core.errors import InvalidRequest, NotFound
from proxy.server import vertex_auth
from proxy.server.errors import register_error_shapes, under
from proxy.server.exchange import Adjusted, ConversationRoute, Exchange
from proxy.server.logs import redacted_url
from proxy.server.refresh_ahead import ProxySigner
from proxy.server.routes import expect_for, handle_conversation
from proxy.server.state import SETTINGS
from proxy.server.upstream import Upstream
from proxy.wire.anthropic_vertex import (
    PREFIX,
    VERTEX,
    VERTEX_ENVELOPE,
    VertexTarget,
    envelope_problem,
    host_for,
    vertex_path,
    vertex_target,
)

# A location as Google names them (`us-east5`, `europe-west1`, `global`, `us`): what may
# become part of a host name.
LOCATION = re.compile(r"^[a-z][a-z0-9-]{0,39}$")
# Locations given their own upstream (its pool) when none is configured; more are refused.
MAX_LOCATIONS = 64
_NEVER_SENT = frozenset({"authorization", "x-api-key"})


def signer() -> ProxySigner:
    """Authorises every request of the Vertex upstreams (proxy/server/vertex_auth.py)."""
    return ProxySigner("Vertex AI", vertex_auth.resolve, _NEVER_SENT.__contains__, "authorised")


class VertexUpstreams:
    """The configured Vertex upstream, or one per location the paths name."""

    def __init__(self, settings: UpstreamSettings, signer: ProxySigner) -> None:
        self._settings = settings
        self.signer = signer
        self.shown_url = redacted_url(settings.vertex_url)
        self._by_location: dict[str, Upstream] = {}

    def for_location(self, location: str) -> Upstream:
        url = self._settings.vertex_url
        key = "" if url else location
        found = self._by_location.get(key)
        if found is None:
            if len(self._by_location) >= MAX_LOCATIONS:
                raise NotFound(f"compaction-proxy serves at most {MAX_LOCATIONS} locations.")
            settings = replace(self._settings, url=url or host_for(location))
            found = self._by_location[key] = Upstream(settings, signer=self.signer)
        return found

    async def close(self) -> None:
        for upstream in self._by_location.values():
            await upstream.close()
        await self.signer.close()


VERTEX_UPSTREAMS = web.AppKey("vertex_upstreams", VertexUpstreams)


def described(app: web.Application) -> str:
    """Where Vertex requests go and how they are authorised, for the start-up line."""
    upstreams = app[VERTEX_UPSTREAMS]
    where = upstreams.shown_url or "each location's endpoint"
    return f"{where} ({upstreams.signer.described})"


async def vertex_lifetime(app: web.Application) -> AsyncIterator[None]:
    settings = app[SETTINGS].upstream
    signs = signer()
    if settings.vertex_url:
        await signs.auth()  # configured for Vertex: a missing credential stops start-up
    app[VERTEX_UPSTREAMS] = VertexUpstreams(settings, signs)
    try:
        yield
    finally:
        await app[VERTEX_UPSTREAMS].close()


def _target(request: web.Request) -> VertexTarget:
    target = vertex_target(vertex_path(request.raw_path))
    if target is None or not LOCATION.match(target.location):
        raise NotFound(f"The path {request.path[:200]} was not found on this server.")
    return target


async def _checked(exchange: Exchange[Any], body: bytes, payload: dict[str, Any]) -> Adjusted:
    """Vertex's own refusals of its envelope, before anything is compacted or sent."""
    problem = envelope_problem(payload, _target(exchange.request))
    if problem is not None:
        raise InvalidRequest(problem)
    return Adjusted(body, payload)


PREDICT = ConversationRoute(None, VERTEX, before=_checked, envelope=VERTEX_ENVELOPE)
COUNT_TOKENS = ConversationRoute(None, VERTEX, compacts=False, envelope=VERTEX_ENVELOPE)


async def handle_predict(request: web.Request) -> web.StreamResponse:
    target = _target(request)
    upstream = request.app[VERTEX_UPSTREAMS].for_location(target.location)
    route = COUNT_TOKENS if target.counts_tokens else PREDICT
    path = request.raw_path.removeprefix(PREFIX)
    return await handle_conversation(request, route, upstream=upstream, path=path)


register_error_shapes(under(PREFIX), VERTEX)


def add_routes(app: web.Application) -> None:
    app.router.add_post(
        PREFIX + "/v1/projects/{rest:.+}", handle_predict, expect_handler=expect_for(PREDICT)
    )
