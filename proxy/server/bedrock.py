"""Claude through Amazon Bedrock: the proxy's `/bedrock` routes.

- `POST /bedrock/model/{modelId}/invoke` and `/invoke-with-response-stream`: a Messages
  conversation in Bedrock's envelope (proxy/wire/anthropic_bedrock.py), through the same
  exchange as `/v1/messages` (compaction, read_result rounds merged, keys, budgets,
  traces, metrics), streams in AWS's event stream (proxy/server/eventstream_codec.py);
- `POST /bedrock/model/{modelId}/count-tokens`: forwarded (counted as sent);
- `GET /bedrock/inference-profiles`, `/foundation-models` (and one of each): the control
  plane's reads Claude Code makes, forwarded; any other `/bedrock` path is 404.

Every request goes out signed with the proxy's own credential (proxy/server/
bedrock_auth.py: SigV4 over exactly the path, query and bytes sent, or a Bedrock API
key): the client's signature could not cover a rewritten body, and the client's own
`Authorization` (or a proxy key in `x-api-key`) never reaches AWS. The path sent is the
one botocore writes (the model id's `:` encoded), whatever spelling the client used.

The credential is found at start-up when a Bedrock setting is given (a missing one
stops it, naming what to set), else at the first Bedrock request (a missing one is that
request's 503, naming what to set).
"""

from __future__ import annotations

import os
from collections.abc import AsyncIterator, Mapping, Sequence
from dataclasses import replace
from typing import Any

from aiohttp import web
from multidict import CIMultiDict

from proxy.core.errors import InvalidRequest, NotFound
from proxy.core.usage import Usage
from proxy.server import bedrock_auth
from proxy.server.errors import register_error_shapes, under
from proxy.server.eventstream_codec import merged_codecs
from proxy.server.exchange import Adjusted, ConversationRoute, Exchange
from proxy.server.headers import upstream_request_headers
from proxy.server.record import current_or_throwaway
from proxy.server.refresh_ahead import ProxySigner
from proxy.server.relay import relay
from proxy.server.routes import expect_for, handle_conversation
from proxy.server.state import SETTINGS
from proxy.server.upstream import Upstream
from proxy.wire.anthropic_bedrock import (
    BEDROCK,
    BEDROCK_ENVELOPE,
    PREFIX,
    Operation,
    envelope_problem,
    is_control_plane,
    metric_headers,
    runtime_path,
    runtime_target,
)
from proxy.wire.anthropic_rounds import anthropic_usage

BEDROCK_UPSTREAM = web.AppKey("bedrock_upstream", Upstream)
BEDROCK_CONTROL = web.AppKey("bedrock_control_upstream", Upstream)


def signer(region: str, env: Mapping[str, str]) -> ProxySigner:
    """Signs every request of the Bedrock upstreams (proxy/server/bedrock_auth.py)."""
    return ProxySigner(
        "Bedrock", lambda: bedrock_auth.resolve(region, env), bedrock_auth.never_sent, "signed"
    )


def described(app: web.Application) -> str:
    """Where Bedrock requests go and how they are signed, for the start-up line."""
    upstream = app[BEDROCK_UPSTREAM]
    assert isinstance(upstream.signer, ProxySigner)
    where = upstream.shown_url or "none (no AWS region: upstream.bedrock_region, AWS_REGION)"
    return f"{where} ({upstream.signer.described})"


async def bedrock_lifetime(app: web.Application) -> AsyncIterator[None]:
    """The runtime's and the control plane's upstreams, one signer for both."""
    settings = app[SETTINGS].upstream
    region = bedrock_auth.region_of(settings.bedrock_region, os.environ)
    signs = signer(settings.bedrock_region, os.environ)
    if settings.bedrock_url or settings.bedrock_region:
        await signs.auth()  # configured for Bedrock: a missing credential stops start-up
    runtime = settings.bedrock_url or (bedrock_auth.runtime_url(region) if region else "")
    control = settings.bedrock_url or (bedrock_auth.control_plane_url(region) if region else "")
    app[BEDROCK_UPSTREAM] = Upstream(replace(settings, url=runtime), signer=signs)
    app[BEDROCK_CONTROL] = Upstream(replace(settings, url=control), signer=signs)
    try:
        yield
    finally:
        await app[BEDROCK_UPSTREAM].close()
        await app[BEDROCK_CONTROL].close()
        await signs.close()


async def _checked(exchange: Exchange[Any], body: bytes, payload: dict[str, Any]) -> Adjusted:
    """Bedrock's own refusals of its envelope, before anything is compacted or sent."""
    problem = envelope_problem(payload)
    if problem is not None:
        raise InvalidRequest(problem)
    return Adjusted(body, payload)


def merged_metrics(headers: CIMultiDict[str], answer: Mapping[str, Any]) -> None:
    """A merged whole answer's invocation metric headers: its (summed) usage's."""
    usage = answer.get("usage")
    told = anthropic_usage(usage) if isinstance(usage, dict) else Usage()
    for header, value in metric_headers(told, 0):
        if not header.endswith("-Latency"):  # (the upstream's latency stays as it said)
            headers[header] = value


RUNTIME = ConversationRoute(
    BEDROCK_UPSTREAM,
    BEDROCK,
    before=_checked,
    envelope=BEDROCK_ENVELOPE,
    codecs=merged_codecs,
    merged_headers=merged_metrics,
)
COUNT_TOKENS = ConversationRoute(
    BEDROCK_UPSTREAM, BEDROCK, compacts=False, envelope=BEDROCK_ENVELOPE
)


async def handle_runtime(request: web.Request) -> web.StreamResponse:
    target = runtime_target(runtime_path(request.raw_path))
    if target is None:
        raise NotFound(f"compaction-proxy does not serve {request.path[:200]}.")
    query = request.raw_path.partition("?")[2]
    path = target.path + (f"?{query}" if query else "")
    route = COUNT_TOKENS if target.operation is Operation.COUNT_TOKENS else RUNTIME
    return await handle_conversation(request, route, path=path)


async def handle_control_plane(request: web.Request) -> web.StreamResponse:
    """The control plane's reads, forwarded signed and relayed as they come."""
    path = request.raw_path.removeprefix(PREFIX)
    if not is_control_plane(request.method, runtime_path(request.raw_path)):
        raise NotFound(f"compaction-proxy does not serve {request.path[:200]}.")
    upstream = request.app[BEDROCK_CONTROL]
    headers: Sequence[tuple[str, str]] = upstream_request_headers(request.headers)
    response = await upstream.send("GET", path, headers, b"", stream=False, purpose="control")
    return await relay(request, response, upstream, BEDROCK, current_or_throwaway().meter)


register_error_shapes(under(PREFIX), BEDROCK)


def add_routes(app: web.Application) -> None:
    app.router.add_post(
        PREFIX + "/model/{model}/{operation}", handle_runtime, expect_handler=expect_for(RUNTIME)
    )
    app.router.add_get(PREFIX + "/{tail:.*}", handle_control_plane)
