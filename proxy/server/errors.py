"""The proxy's own errors (proxy/core/errors.py) as HTTP answers, in the caller's API shape.

Handlers and middlewares raise a `ProxyError`; the front door (proxy/server/front_door.py,
inside the metrics middleware, so the status is recorded) answers it with `render`, in
the shape of the API the request was for: OpenAI's on OpenAI routes, Anthropic's
elsewhere, a provider's own on the paths it registered (`register_error_shapes`); the
wire format renders the body.
Failures talking to the upstream are mapped to the tree in one place, the upstream's
(proxy/server/upstream.py). Upstream answers, errors included, never pass through here.
"""

from __future__ import annotations

import secrets
from collections.abc import Callable
from typing import Protocol, runtime_checkable

from aiohttp import web
from multidict import MultiMapping

from proxy.core.errors import InvalidRequest, ProxyError
from proxy.core.wire_format import ErrorShapes
from proxy.server.routing import upstream_for
from proxy.wire import ANTHROPIC, CHAT, RESPONSES


def new_request_id() -> str:
    return "req_proxy_" + secrets.token_hex(12)


# (does this path speak it, its error shapes): a provider's routes, registered at import.
_REGISTERED: list[tuple[Callable[[str], bool], ErrorShapes]] = []


def register_error_shapes(speaks: Callable[[str], bool], shapes: ErrorShapes) -> None:
    """The proxy's own answers (401, 413, 429, 502, ...) to a request whose path
    `speaks(path)` are in `shapes` (one call, where a provider's routes are defined)."""
    _REGISTERED.append((speaks, shapes))


def under(prefix: str) -> Callable[[str], bool]:
    """`speaks` for the paths under a provider's prefix (`/bedrock`: it and below it)."""
    return lambda path: path == prefix or path.startswith(prefix + "/")


def wire_for(path: str, headers: MultiMapping[str]) -> ErrorShapes:
    """The API a request speaks, for the shape of the proxy's own answers to it."""
    for speaks, shapes in _REGISTERED:
        if speaks(path):
            return shapes
    if path == "/v1/responses" or path.startswith("/v1/responses/"):
        return RESPONSES  # OpenAI's shape; inside a stream, Responses events
    return CHAT if upstream_for(path, headers) == "openai" else ANTHROPIC


@runtime_checkable
class NamedErrors(Protocol):
    """Error shapes whose answers name the error in a header too (Bedrock's
    `x-amzn-ErrorType`, which AWS's SDKs read the error's code from)."""

    def error_headers(self, error: ProxyError) -> dict[str, str]: ...


def render(error: ProxyError, wire: ErrorShapes) -> web.Response:
    request_id = new_request_id()
    headers = {wire.request_id_header: request_id, **error.headers()}
    if isinstance(wire, NamedErrors):
        headers.update(wire.error_headers(error))
    response = web.Response(
        status=error.status,
        body=wire.error_body(error, request_id),
        content_type="application/json",
        headers=headers,
    )
    if error.close:
        response.force_close()
    return response


def not_a_path(target: str) -> InvalidRequest:
    # An absolute-form target (`POST http://host/...`) would let a request pick the
    # upstream; the upstream comes only from the configuration.
    return InvalidRequest(f"The request target must be a path, got {target[:200]!r}.")
