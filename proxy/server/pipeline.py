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
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Literal

import aiohttp
from aiohttp import web
from multidict import CIMultiDictProxy

from proxy.config import Settings
from proxy.server.compaction import Compactor, Interception
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
    observe: Callable[[bytes], bool] | None = None  # sees the answer's first (last) bytes


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
    observe = _usage_observer(compactor, prepared.model, prepared.estimate, ctx.store, ctx.wire)
    if prepared.interception is None:
        return Forward(prepared.body, tuple(prepared.headers), observe=observe)
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
        estimate=_estimate_of(ctx, forward),
    )
    if upstream_response.headers.get("Content-Type", "").startswith("text/event-stream"):
        return await loop.stream(upstream_response)
    return await loop.whole(upstream_response)


def _estimate_of(ctx: RequestContext, forward: Forward) -> int:
    assert ctx.compactor is not None
    if forward.interception is None:
        return 0
    counter = ctx.wire.counter(ctx.compactor.counter)
    return int(counter.count_request(forward.interception.body))


def _usage_observer(
    compactor: Compactor, model: str, estimate: int, store: Any, wire: Wire = ANTHROPIC_WIRE
) -> Callable[[bytes], bool] | None:
    """Calibration from answers relayed as bytes, found without parsing them all: the
    input counts in the first chunk (a stream's message_start, or the whole body), else
    in a stream's last bytes (a Chat stream's usage chunk comes last). It answers
    whether it found them, so the relay shows it the stream's end only when it did not."""
    if estimate <= 0 or not model:
        return None

    def observe(data: bytes) -> bool:
        head = data[:8192] if data.startswith(b"event:") else data[-4096:]
        usage: dict[str, int] = {}
        for name, value in wire.usage_field.findall(head):
            usage.setdefault(name.decode(), int(value))
        if usage:
            compactor.record_usage(model, estimate, wire.usage_input(usage), store)
        return bool(usage)

    return observe
