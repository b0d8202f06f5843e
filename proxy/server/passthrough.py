"""Every other path under /v1/ and method: forwarded unchanged, streamed both ways, to the
upstream proxy/server/routing.py picks (Anthropic, or OpenAI-format; a key's own provider
when keys are required). Any other path is 404: only the APIs' own paths go upstream (the
target was made canonical first: proxy/server/target.py).

A caller with budgets pays for pass-through calls too (proxy/core/proxy_keys.py says how
each path is metered): a model call (/v1/complete, /v1/completions, /v1/embeddings,
/v1/responses while it passes through) is read whole, its body (decoded when compressed)
counted as its input and its output cap times its choices as its output, reserved, and
settled to the usage its answer reports (to the whole reservation when it reports none);
a Message Batch reserves every request in it and is charged that once accepted; a call
whose cost cannot be estimated (an OpenAI batch of an uploaded file, image generation,
...) is refused. Calls that cost no tokens stream through as they arrive.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import orjson
from aiohttp import web

from proxy.config import ServerSettings
from proxy.core.budget import BadRequestField, batch_reservation
from proxy.core.errors import Forbidden, NotFound, UpstreamError
from proxy.core.proxy_keys import BATCH, FREE, UNMETERED, passthrough_rule
from proxy.core.tokens import TokenCounter
from proxy.core.usage import DATA_LINES, LineKind, Usage
from proxy.server.bodies import (
    BodyClock,
    invalid_field,
    output_tokens,
    read_request,
    stream_body,
    too_slow,
)
from proxy.server.budgets import Budget, budget_of
from proxy.server.caller import caller_of, count_rejection
from proxy.server.errors import not_a_path, wire_for
from proxy.server.headers import upstream_request_headers
from proxy.server.off_loop import off_loop
from proxy.server.record import current_or_throwaway
from proxy.server.relay import relay
from proxy.server.routing import GEMINI_UPSTREAM, OPENAI_UPSTREAM, upstream_for
from proxy.server.state import COMPACTOR, SETTINGS, UPSTREAM
from proxy.wire import ANTHROPIC, CHAT

API_PREFIX = "/v1/"
API_PREFIXES = (API_PREFIX, "/v1beta/")  # the Gemini API's current version too
UPSTREAMS = {"openai": OPENAI_UPSTREAM, "gemini": GEMINI_UPSTREAM}
NO_OUTPUT = frozenset({"/v1/embeddings"})


async def handle_passthrough(request: web.Request) -> web.StreamResponse:
    if request.raw_path[:1] != "/":
        raise not_a_path(request.raw_path)
    if not request.path.startswith(API_PREFIXES):
        # Only the APIs' own paths go upstream: anything else is not the proxy's to pass.
        raise NotFound(f"compaction-proxy does not serve {request.path[:200]}.")
    # The key's provider, else the path (and for paths both APIs have, the client's
    # headers), picks the upstream.
    target = caller_of(request).provider or upstream_for(request.path, request.headers)
    upstream = request.app[UPSTREAMS.get(target, UPSTREAM)]
    headers = upstream_request_headers(request.headers)
    settings = request.app[SETTINGS].server
    clock = BodyClock(settings.body_timeout)
    data: Any = None
    rule = passthrough_rule(request.method, request.path)
    budget = budget_of(request)
    if rule.meter != FREE and budget.applies:
        counter = request.app[COMPACTOR].counter
        data = await _reserved(request, rule.meter, budget, settings, counter)
        headers.append(("Content-Length", str(len(data))))
    elif request.body_exists:
        # Streamed as it arrives (on the body's clock); a known length goes on as is.
        data = stream_body(request, clock)
        if request.content_length is not None:
            headers.append(("Content-Length", str(request.content_length)))
    try:
        response = await upstream.send(
            request.method, request.raw_path, headers, data, stream=False
        )
    except UpstreamError:
        if clock.expired:
            raise too_slow(clock.grace) from None
        raise
    wire = wire_for(request.path, request.headers)
    return await relay(request, response, upstream, wire, current_or_throwaway().meter)


async def _reserved(
    request: web.Request,
    meter: str,
    budget: Budget,
    settings: ServerSettings,
    counter: TokenCounter,
) -> bytes:
    """Read a metered call whole (the read step every request with budgets is read by),
    reserve what it may cost (`counter`: the compactor's), and return its bytes."""
    if meter == UNMETERED:
        count_rejection(request.app, "unmetered")
        raise Forbidden(
            f"compaction-proxy cannot estimate what {request.method} {request.path} costs,"
            " so a key with budgets may not use it."
        )
    key_checks = caller_of(request).key_id is not None
    incoming = await read_request(request, settings, must_read=True, key_checks=key_checks)
    payload = incoming.payload
    assert payload is not None  # must_read: a body that cannot be read was refused
    size, threshold = len(incoming.body), settings.off_loop_bytes
    try:
        if meter == BATCH:
            count = counter.count_request
            estimate, output = await off_loop(size, threshold, batch_reservation, payload, count)
        else:
            output = 0 if request.path in NO_OUTPUT else output_tokens(payload)
            estimate = await off_loop(size, threshold, counter.count_json, payload)
    except BadRequestField as e:
        raise invalid_field(e.param, str(e)) from None
    # What budgets read (a 1-hour cache write is weighted 2x): the body as decoded.
    sent = orjson.dumps(payload) if incoming.encoded else incoming.body
    await budget.reserve(estimate, output, sent, charge_reserved=meter == BATCH)
    current_or_throwaway().reads_answers_as(ANY_USAGE)
    return incoming.body


class AnyUsage:
    """Usage in a pass-through answer, Anthropic's or OpenAI's (Chat, Completions,
    Embeddings, Responses), whole or streamed. An answer whose usage is not found costs
    its whole reservation (proxy/core/usage.py), so an unknown shape errs high."""

    lines = DATA_LINES

    def line_may_matter(self, head: bytes) -> bool:
        return head.startswith(b"data: {") or head.startswith(b"data:{")

    def usage_line(self, line: bytes) -> tuple[LineKind, Usage] | None:
        if b'"usage"' not in line:
            return None
        try:
            data = orjson.loads(line.partition(b":")[2])
        except orjson.JSONDecodeError:
            return None
        if not isinstance(data, dict):
            return None
        found = self.body_usage(data)
        if found is None and isinstance(data.get("response"), dict):
            found = self.body_usage(data["response"])  # Responses: response.completed
        if found is None and isinstance(data.get("message"), dict):
            found = self.body_usage(data["message"])  # Messages: message_start
        return None if found is None else (LineKind.END, found)

    def text_chars(self, line: bytes) -> int:
        return 0

    def body_usage(self, body: Mapping[str, Any]) -> Usage | None:
        raw = body.get("usage")
        if not isinstance(raw, dict):
            return None
        if "prompt_tokens" in raw or "completion_tokens" in raw:
            return CHAT.usage(raw)
        if "input_tokens" in raw or "output_tokens" in raw:
            # Responses counts cached input inside input_tokens: read as fresh, it errs high.
            return ANTHROPIC.usage(raw)
        return None


ANY_USAGE = AnyUsage()
