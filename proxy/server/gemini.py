"""The Gemini API's routes: `models/{model}:generateContent` and `:streamGenerateContent`
(under `/v1beta` and `/v1`) carried through the same exchange as every conversation
(proxy/server/exchange.py), `:countTokens` answered for what the model would see, and
the rest of the API (the model listing, embeddings, files, cached contents) passed
through to `upstream.gemini_url` (empty: Google's own).

- The envelope: the model is named by the path, not the body, and so is the stream
  (`:streamGenerateContent`); a summary goes to the same version's
  `models/{model}:generateContent`, whole.
- The key: Google takes it in `x-goog-api-key` or in the `key` query parameter. A key in
  the query is moved into the header as the request comes in (`key_in_header`), so it
  is the tenant's credential like any other, goes upstream the same way, and never sits
  in a logged URL.
- Errors the proxy gives itself on these paths are in Google's shape
  (`{"error": {"code", "message", "status"}}`).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import orjson
from aiohttp import web
from multidict import CIMultiDict, CIMultiDictProxy

from proxy.core.commands import GetSummary
from proxy.ops.simulate import Simulator
from proxy.server.bodies import read_request
from proxy.server.caller import tenant_of_request
from proxy.server.compactor import Compactor
from proxy.server.errors import register_error_shapes
from proxy.server.exchange import Adjusted, ConversationRoute, Exchange
from proxy.server.headers import upstream_request_headers
from proxy.server.off_loop import off_loop
from proxy.server.passthrough import handle_passthrough
from proxy.server.record import current_or_throwaway
from proxy.server.relay import relay
from proxy.server.routes import expect_for, handle_conversation
from proxy.server.routing import (
    GEMINI_KEY_HEADER,
    GEMINI_UPSTREAM,
    gemini_upstream_lifetime,
    model_call,
    speaks_gemini,
)
from proxy.server.state import COMPACTOR, SETTINGS, STORE
from proxy.wire import GEMINI
from proxy.wire.gemini_parts import field

VERSIONS = ("v1beta", "v1")
CONVERSATION_METHODS = ("generateContent", "streamGenerateContent")


class GeminiEnvelope:
    """The Gemini API's envelope: the model and the stream in the path (`Envelope`)."""

    def model(self, path: str, payload: Mapping[str, Any]) -> str:
        found = model_call(path.partition("?")[0])
        return found[1] if found else ""

    def betas(self, headers: Mapping[str, str], payload: Mapping[str, Any]) -> str:
        return ""

    def stream(self, path: str, payload: Mapping[str, Any]) -> bool:
        found = model_call(path.partition("?")[0])
        return found is not None and found[2] == "streamGenerateContent"

    def summary(self, path: str, need: GetSummary) -> tuple[str, GetSummary]:
        found = model_call(path.partition("?")[0])
        version = found[0] if found else VERSIONS[0]
        return f"/{version}/models/{need.model}:generateContent", need


def array_stream(request: web.Request) -> bool:
    """A stream asked for in the JSON array form (no `alt=sse`)."""
    found = model_call(request.path)
    return (
        found is not None
        and found[2] == "streamGenerateContent"
        and request.query.get("alt") != "sse"
    )


async def before(exchange: Exchange[Any], body: bytes, payload: dict[str, Any]) -> Adjusted:
    """The JSON array form of a stream is relayed as it comes, never read as rounds: no
    read_result for it (its history is still folded or packed)."""
    if array_stream(exchange.request):
        return Adjusted(body, payload, read_result=False)
    return Adjusted(body, payload)


ENVELOPE = GeminiEnvelope()
GENERATE = ConversationRoute(
    GEMINI_UPSTREAM,
    GEMINI,
    bad_json="Invalid JSON payload received.",
    before=before,
    envelope=ENVELOPE,
)
register_error_shapes(speaks_gemini, GEMINI)


async def handle_model_call(request: web.Request) -> web.StreamResponse:
    """POST models/{model}:{method}: a conversation through the exchange, countTokens
    counted as the proxy would send it, anything else (embedContent, ...) passed through."""
    found = model_call(request.path)
    if found is not None and found[2] in CONVERSATION_METHODS:
        return await handle_conversation(request, GENERATE)
    if found is not None and found[2] == "countTokens":
        return await handle_count_tokens(request, found[1])
    return await handle_passthrough(request)


# -- countTokens --------------------------------------------------------------------------


def as_generate_request(payload: Mapping[str, Any]) -> dict[str, Any] | None:
    """The generateContent request a countTokens body counts (its `contents`, or its whole
    `generateContentRequest`); None for a body that is neither."""
    inner = field(payload, "generateContentRequest")
    if isinstance(inner, dict) and set(payload) <= {
        "generateContentRequest",
        "generate_content_request",
    }:
        return {k: v for k, v in inner.items() if k != "model"}
    if set(payload) == {"contents"} and isinstance(payload["contents"], list):
        return {"contents": payload["contents"]}
    return None  # (the API's own error reaches the client)


def what_is_sent(
    compactor: Compactor, body: dict[str, Any], model: str, factor: float
) -> dict[str, Any] | None:
    """The request as the proxy would send it, planned as a first crossing would be (in
    memory: no line, store or summariser is touched; a fold's summary stands in at its
    cap's size); None when it would go as it is."""
    simulator = Simulator(compactor.policies, compactor.counter, factor=factor, fmt=GEMINI)
    step = simulator.step({**body, "model": model})
    if step.kind != "rewrite":
        return None
    return {k: v for k, v in step.body.items() if k != "model"}


async def handle_count_tokens(request: web.Request, model: str) -> web.StreamResponse:
    """countTokens for what the model would see: the request compacted as the proxy would
    compact it, counted upstream as a `generateContentRequest` (its own read_result
    declaration and stubs included); a request the proxy would not rewrite, counted as
    the client sent it."""
    app = request.app
    incoming = await read_request(
        request, app[SETTINGS].server, must_read=False, key_checks=False,
        bad_json=GENERATE.bad_json,
    )  # fmt: skip
    body, headers = incoming.body, upstream_request_headers(request.headers)
    payload = incoming.payload
    asked = as_generate_request(payload) if isinstance(payload, dict) else None
    if asked is not None and not incoming.encoded:
        compactor = app[COMPACTOR]
        factor = compactor.factor(GEMINI, model, app[STORE].store, tenant_of_request(request))
        size, limit = len(body), compactor.off_loop_bytes
        sent = await off_loop(size, limit, what_is_sent, compactor, asked, model, factor)
        if sent is not None:
            body = orjson.dumps({"generateContentRequest": {"model": f"models/{model}", **sent}})
    upstream = app[GEMINI_UPSTREAM]
    response = await upstream.send(request.method, request.raw_path, headers, body, stream=False)
    return await relay(request, response, upstream, GEMINI, current_or_throwaway().meter)


expect_model_call = expect_for(GENERATE)


def _under_models(path: str) -> bool:
    return path == "/v1/models" or path.startswith("/v1/models/")


def key_in_header(request: web.Request) -> web.Request:
    """A Gemini key given as `?key=` goes on in `x-goog-api-key` (the API takes either):
    the request as it goes on (the front door's, proxy/server/front_door.py), so the
    tenant, the key check and the upstream read it there, and no URL holds it."""
    key = request.query.get("key")
    path = request.path
    if key is None or not (speaks_gemini(path) or _under_models(path)):
        return request
    headers = CIMultiDict(request.headers)
    headers.setdefault(GEMINI_KEY_HEADER, key)
    query = [(k, v) for k, v in request.rel_url.query.items() if k != "key"]
    return request.clone(
        headers=CIMultiDictProxy(headers), rel_url=request.rel_url.with_query(query)
    )


def add_routes(app: web.Application) -> None:
    """The Gemini routes (before the pass-through's catch-all)."""
    for version in VERSIONS:
        app.router.add_post(
            f"/{version}/models/{{target}}", handle_model_call, expect_handler=expect_model_call
        )
    app.cleanup_ctx.append(gemini_upstream_lifetime)
