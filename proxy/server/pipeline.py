"""The seam between the transparent relay and compaction.

The Messages handlers read and parse the request, then call `prepare(ctx)`; whatever it
returns is what goes upstream. A request that fits goes out as its original bytes
(invariant 1); one over its trigger is rewritten by the Compactor. When the rewrite
injects `read_result`, `Forward.intercept_read_result` is set and the handler passes the
upstream response to `intercept`, which answers read_result calls itself.

Contract for `prepare`:
- It never raises for anything about the request or the store: on any failure of its
  own parts it returns `Forward(ctx.body)` (degrade, never fail). Refusals that the API
  itself would give (nothing fits) are returned as `Forward.reply`.
- `Forward.body` is sent as is; the Content-Length is recomputed from it.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, Literal

import aiohttp
from aiohttp import web
from multidict import CIMultiDictProxy

from proxy.config import Settings
from proxy.server.compaction import INPUT_KEYS, Compactor, Interception
from proxy.server.headers import upstream_request_headers
from proxy.server.read_result import ReadLoop
from proxy.server.upstream import Upstream
from proxy.server.wires import ANTHROPIC_WIRE, Wire

log = logging.getLogger(__name__)

Route = Literal["messages", "count_tokens", "chat"]
COMPACTED_ROUTES = ("messages", "chat")


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
    compactor: Compactor | None = None
    wire: Wire = ANTHROPIC_WIRE  # the request's format: Messages, or OpenAI Chat
    tenant: str | None = None  # a proxy key's tenant; None: the credential's hash
    policy_override: dict[str, int] | None = None  # a key's or team's window/trigger/target


@dataclass(slots=True)
class Forward:
    """What to do with the request."""

    body: bytes  # the bytes to send upstream
    response_headers: tuple[tuple[str, str], ...] = ()  # added to the client's response
    intercept_read_result: bool = False  # answer read_result calls via `intercept`
    reply: web.StreamResponse | None = None  # answer the client directly, send nothing
    upstream_headers: list[tuple[str, str]] | None = None  # None: the client's, as sent
    interception: Interception | None = None
    # Fed the usage the relay found in the answer, for calibration.
    calibrate: Callable[[Mapping[str, int]], None] | None = None
    estimate: int = 0  # estimated input tokens of the body sent (read_result calibration)


def must_parse(body_length: int, settings: Settings) -> bool:
    """Hook: False would let the handler skip JSON parsing when the byte length alone
    proves the request is under every trigger. Parsing a body costs far less than
    counting it, and invalid JSON deserves the proxy's own clear 400, so: always."""
    return True


async def prepare(ctx: RequestContext) -> Forward:
    """Decide what goes upstream: the original bytes, a rewrite, or a refusal."""
    compactor = ctx.compactor
    if ctx.route not in COMPACTED_ROUTES or ctx.payload is None or compactor is None:
        return Forward(ctx.body)
    try:
        prepared = await compactor.prepare(
            ctx.body,
            ctx.payload,
            ctx.headers,
            store=ctx.store,
            upstream_url=ctx.upstream.base_url,
            wire=ctx.wire,
            tenant=ctx.tenant,
            policy_override=ctx.policy_override,
        )
    except Exception:  # never fail a request for our own parts: forward it untouched
        log.exception("compaction failed; forwarding the request untouched")
        return Forward(ctx.body)
    if prepared.refusal is not None:
        return Forward(ctx.body, reply=ctx.wire.refusal(prepared.refusal))
    calibrate = _calibration(compactor, prepared.model, prepared.estimate, ctx.store)
    if prepared.interception is None:
        return Forward(prepared.body, tuple(prepared.headers), calibrate=calibrate)
    # Answers we read ourselves must arrive uncompressed.
    headers = [
        (name, value)
        for name, value in upstream_request_headers(ctx.headers)
        if name.lower() != "accept-encoding"
    ]
    headers.append(("Accept-Encoding", "identity"))
    return Forward(
        prepared.body,
        tuple(prepared.headers),
        intercept_read_result=True,
        upstream_headers=headers,
        interception=prepared.interception,
        estimate=prepared.estimate,
    )


async def intercept(
    request: web.Request,
    ctx: RequestContext,
    forward: Forward,
    upstream_response: aiohttp.ClientResponse,
) -> web.StreamResponse:
    """Answer the client from an upstream response that may call read_result."""
    assert forward.interception is not None and ctx.compactor is not None
    loop = ReadLoop(
        request,
        forward.interception,
        ctx.upstream,
        ctx.store,
        ctx.compactor,
        forward.response_headers,
        forward.upstream_headers or upstream_request_headers(ctx.headers),
        estimate=forward.estimate,
    )
    if upstream_response.headers.get("Content-Type", "").startswith("text/event-stream"):
        return await loop.stream(upstream_response)
    return await loop.whole(upstream_response)


def _calibration(
    compactor: Compactor, model: str, estimate: int, store: Any
) -> Callable[[Mapping[str, int]], None] | None:
    """Calibration from an answer relayed as bytes: the usage the relay already picked
    out of it (a stream's message_start or last chunk, or the whole body)."""
    if estimate <= 0 or not model:
        return None

    def calibrate(usage: Mapping[str, int]) -> None:
        if any(usage.get(k) for k in INPUT_KEYS):
            compactor.record_usage(model, estimate, usage, store)

    return calibrate
