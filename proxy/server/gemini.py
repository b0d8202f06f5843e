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

from collections.abc import Awaitable, Callable, Mapping
from typing import Any

from aiohttp import web
from multidict import CIMultiDict, CIMultiDictProxy

from proxy.core.commands import GetSummary
from proxy.server.errors import register_error_shapes
from proxy.server.exchange import Adjusted, ConversationRoute
from proxy.server.passthrough import handle_passthrough
from proxy.server.routes import expect_for, handle_conversation
from proxy.server.routing import (
    GEMINI_KEY_HEADER,
    GEMINI_UPSTREAM,
    gemini_upstream_lifetime,
    model_call,
    speaks_gemini,
)
from proxy.wire import GEMINI

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


async def before(request: web.Request, body: bytes, payload: dict[str, Any]) -> Adjusted:
    """The JSON array form of a stream is relayed as it comes, never read as rounds: no
    read_result for it (its history is still folded or packed)."""
    if array_stream(request):
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
    """POST models/{model}:{method}: a conversation through the exchange, anything else
    (countTokens, embedContent, ...) passed through."""
    found = model_call(request.path)
    if found is not None and found[2] in CONVERSATION_METHODS:
        return await handle_conversation(request, GENERATE)
    return await handle_passthrough(request)


expect_model_call = expect_for(GENERATE)


def _under_models(path: str) -> bool:
    return path == "/v1/models" or path.startswith("/v1/models/")


Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


@web.middleware
async def key_in_header(request: web.Request, handler: Handler) -> web.StreamResponse:
    """A Gemini key given as `?key=` goes on in `x-goog-api-key` (the API takes either):
    the tenant, the key check and the upstream read it there, and no URL holds it."""
    key = request.query.get("key")
    path = request.path
    if key is None or not (speaks_gemini(path) or _under_models(path)):
        return await handler(request)
    headers = CIMultiDict(request.headers)
    headers.setdefault(GEMINI_KEY_HEADER, key)
    query = [(k, v) for k, v in request.rel_url.query.items() if k != "key"]
    moved = request.clone(
        headers=CIMultiDictProxy(headers), rel_url=request.rel_url.with_query(query)
    )
    return await handler(moved)


def add_routes(app: web.Application) -> None:
    """The Gemini routes (before the pass-through's catch-all)."""
    for version in VERSIONS:
        app.router.add_post(
            f"/{version}/models/{{target}}", handle_model_call, expect_handler=expect_model_call
        )
    app.cleanup_ctx.append(gemini_upstream_lifetime)
