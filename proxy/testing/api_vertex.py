"""The stand-in's Google Vertex AI: Claude through `rawPredict` and `streamRawPredict`,
token counting (`count-tokens:rawPredict`), and the OAuth token endpoint a test
service-account file names (google_oauth.py), on one host (what `upstream.vertex_url`
names in tests).

As strict as Vertex: every request needs `Authorization: Bearer` with an access token
this stand-in's token endpoint issued and that still lives (else 401 UNAUTHENTICATED);
a model it does not serve is 404 NOT_FOUND; both in Google's error shape. Then the
Messages rules, with Vertex's envelope: no `model` in the body (count-tokens: `model`
required), `anthropic_version` Vertex's own or an API date; betas in `anthropic-beta`.
Answers and the model's own errors are Anthropic's (SSE, JSON, Messages errors).
"""

from __future__ import annotations

from typing import Any

from aiohttp import web

from proxy.core.model_names import anthropic_name
from proxy.core.tokens import TokenCounter
from proxy.testing import api_messages
from proxy.testing.answering import Checked, count_tokens, serve
from proxy.testing.api import Refusal
from proxy.testing.api_messages import EnvelopedMessages, MessagesApi, counted
from proxy.testing.google_oauth import TokenEndpoint
from proxy.testing.standin_http import COUNTER
from proxy.wire.anthropic_vertex import VertexTarget, envelope_problem, google_error, vertex_target

TOKENS: web.AppKey[TokenEndpoint] = web.AppKey("standin_vertex_tokens", TokenEndpoint)
# The Vertex ids of the models the Messages stand-in serves: `claude-sonnet-4-5@20250929`.
MODEL_IDS = frozenset(
    f"{name.rsplit('-', 1)[0]}@{name.rsplit('-', 1)[1]}" for name, _, _ in api_messages.MODELS
)
UNAUTHENTICATED = (
    "Request had invalid authentication credentials. Expected OAuth 2 access token, login "
    "cookie or other valid authentication credential."
)


def _google(status: int, message: str) -> web.Response:
    return web.Response(
        status=status, body=google_error(status, message), content_type="application/json"
    )


def platform_refusal(request: web.Request, target: VertexTarget | None) -> web.Response | None:
    """What Vertex itself refuses, before the model sees anything (Google's shape)."""
    auth = request.headers.get("Authorization", "")
    token = auth[7:] if auth[:7].lower() == "bearer " else ""
    if not request.app[TOKENS].valid(token):
        return _google(401, UNAUTHENTICATED)
    if target is None:
        return _google(404, f"The path {request.path} was not found on this server.")
    if not target.counts_tokens and target.model not in MODEL_IDS:
        name = f"projects/{target.project}/locations/{target.location}/publishers/anthropic"
        return _google(404, f"Publisher Model `{name}/models/{target.model}` not found.")
    return None


class VertexApi(EnvelopedMessages):
    def __init__(self, counter: TokenCounter, target: VertexTarget) -> None:
        super().__init__(counter, "vertex", target.model)
        self.target = target

    def invalid(self, body: Any) -> Refusal | None:
        if not isinstance(body, dict):
            return Refusal(400, "invalid_request_error", "Input should be a valid dictionary")
        problem = envelope_problem(body, self.target)
        if problem is not None:
            return Refusal(400, "invalid_request_error", problem)
        return super().invalid(self.as_messages(body))


async def handle_predict(request: web.Request) -> web.StreamResponse:
    target = vertex_target(request.path)
    refused = platform_refusal(request, target)
    if refused is not None:
        return refused
    assert target is not None
    if target.counts_tokens:
        return await _count_tokens(request, target)
    return await serve(request, VertexApi(request.app[COUNTER], target))


async def _count_tokens(request: web.Request, target: VertexTarget) -> web.Response:
    def check(body: Any) -> Checked:
        problem = envelope_problem(body, target) if isinstance(body, dict) else "not an object"
        if problem is not None:
            return None, Refusal(400, "invalid_request_error", problem)
        plain = {k: v for k, v in body.items() if k != "anthropic_version"}
        plain["model"] = anthropic_name(str(body["model"]))
        return counted(plain)

    api = MessagesApi(request.app[COUNTER])
    return await count_tokens(request, api, check, lambda n: {"input_tokens": n})


def add_routes(app: web.Application) -> None:
    tokens = TokenEndpoint()
    app[TOKENS] = tokens
    tokens.add_to(app)
    app.router.add_post("/v1/projects/{rest:.+}", handle_predict)
