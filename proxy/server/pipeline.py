"""The seam between the transparent relay and compaction.

The Messages handlers read and parse the request, then call `prepare(ctx)`; whatever it
returns is what goes upstream. Today nothing is rewritten: `prepare` returns the
original bytes untouched (invariant 1, "fits means untouched"). Compaction (issue 4)
replaces the body of `prepare` and, when it injects `read_result`, sets
`Forward.intercept_read_result` so the handler calls `intercept` with the upstream
response instead of relaying its bytes.

Contract for `prepare`:
- It must not raise for anything about the request or the store: on any failure of its
  own parts it returns `Forward(ctx.body)` (degrade, never fail). Refusals that the API
  itself would give (nothing fits) are returned as `Forward.reply`.
- `Forward.body` is sent as is; the Content-Length is recomputed from it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal

import aiohttp
from aiohttp import web
from multidict import CIMultiDictProxy

from proxy.config import Settings
from proxy.server.relay import relay
from proxy.server.upstream import Upstream

Route = Literal["messages", "count_tokens"]


@dataclass(slots=True)
class RequestContext:
    """One Messages request as the pipeline sees it."""

    route: Route
    path_qs: str  # path and query as the client sent them (`/v1/messages?beta=true`)
    headers: CIMultiDictProxy[str]  # the client's request headers (credentials included)
    body: bytes  # the exact bytes the client sent
    payload: dict[str, Any] | None  # the parsed body; None when parsing was skipped
    settings: Settings
    upstream: Upstream  # for the pipeline's own upstream calls (the summariser)
    store: Any  # proxy.store Store, or None when no store could be started


@dataclass(slots=True)
class Forward:
    """What to do with the request."""

    body: bytes  # the bytes to send upstream
    response_headers: tuple[tuple[str, str], ...] = ()  # added to the client's response
    intercept_read_result: bool = False  # answer read_result calls via `intercept`
    reply: web.StreamResponse | None = None  # answer the client directly, send nothing


def must_parse(body_length: int, settings: Settings) -> bool:
    """Hook: False lets the handler skip JSON parsing when the byte length alone proves
    the request is under every trigger (then invalid JSON is left to the upstream to
    reject). Always True until policies exist."""
    return True


async def prepare(ctx: RequestContext) -> Forward:
    """Decide what goes upstream. Now: the original bytes, untouched."""
    return Forward(ctx.body)


async def intercept(
    request: web.Request,
    ctx: RequestContext,
    forward: Forward,
    upstream_response: aiohttp.ClientResponse,
) -> web.StreamResponse:
    """Answer the client from an upstream response that may call read_result. Now: a
    plain relay (nothing is ever injected yet)."""
    return await relay(request, upstream_response, forward.response_headers)
