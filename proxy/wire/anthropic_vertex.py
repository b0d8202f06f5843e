"""Claude on Google Vertex AI: the envelope around a Messages body.

`POST /v1/projects/{project}/locations/{location}/publishers/anthropic/models/{model}:rawPredict`
(a whole answer) or `:streamRawPredict` (Anthropic SSE) takes the Messages body without
`model`, with `"anthropic_version": "vertex-2023-10-16"`; betas stay in the
`anthropic-beta` header. Token counting is the pseudo-model `count-tokens` with
`:rawPredict`, the model named in the body. Answers are Anthropic's own (SSE, JSON,
errors from the model); errors of the platform itself (credentials, permissions, quota,
an unknown path) are Google's `{"error": {"code", "message", "status"}}`.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import orjson

from proxy.core.commands import GetSummary
from proxy.core.errors import ProxyError
from proxy.wire.anthropic import AnthropicMessages, rewrapped
from proxy.wire.common import percent_decode

# The provider's own version tag; the anthropic SDK (2.x) sends its API version (a date)
# instead, which the provider takes too.
ANTHROPIC_VERSION = "vertex-2023-10-16"
API_DATE = re.compile(r"^\d{4}-\d{2}-\d{2}$")
COUNT_TOKENS_MODEL = "count-tokens"
GLOBAL = "global"
_MULTI_REGIONS = ("us", "eu")
# Where the proxy serves Vertex AI's Claude calls: what clients are given as their
# Vertex base URL (Claude Code's ANTHROPIC_VERTEX_BASE_URL, with `/v1`).
PREFIX = "/vertex"

_PATH = re.compile(
    r"^/v1/projects/(?P<project>[^/]+)/locations/(?P<location>[^/]+)"
    r"/publishers/anthropic/models/(?P<model>[^/:]+):(?P<method>rawPredict|streamRawPredict)$"
)


@dataclass(frozen=True, slots=True)
class VertexTarget:
    project: str
    location: str
    model: str  # `claude-sonnet-4-5@20250929`; COUNT_TOKENS_MODEL for token counting
    method: str  # rawPredict or streamRawPredict

    @property
    def counts_tokens(self) -> bool:
        return self.model == COUNT_TOKENS_MODEL

    @property
    def streams(self) -> bool:
        return self.method == "streamRawPredict"


def vertex_target(path: str) -> VertexTarget | None:
    """What a path (after the proxy's `/vertex`) names; None: not a Claude call."""
    found = _PATH.match(path)
    if found is None:
        return None
    model = percent_decode(found["model"])
    target = VertexTarget(found["project"], found["location"], model, found["method"])
    if target.counts_tokens and target.streams:
        return None
    return target


def host_for(location: str) -> str:
    """A location's endpoint: the global one, a multi-region's (`us`, `eu`), a region's."""
    if location == GLOBAL:
        return "https://aiplatform.googleapis.com"
    if location in _MULTI_REGIONS:
        return f"https://aiplatform.{location}.rep.googleapis.com"
    return f"https://{location}-aiplatform.googleapis.com"


def envelope_problem(body: Mapping[str, Any], target: VertexTarget) -> str | None:
    """Why a body is not Vertex's Messages envelope for this target."""
    if target.counts_tokens:
        if not isinstance(body.get("model"), str):
            return "model: Field required"
    elif "model" in body:
        return "model: Extra inputs are not permitted"
    version = body.get("anthropic_version")
    if not (version == ANTHROPIC_VERSION or (isinstance(version, str) and API_DATE.match(version))):
        shown = "missing" if version is None else f"invalid: {version!r}"
        return f"anthropic_version is {shown}, expected {ANTHROPIC_VERSION!r}"
    return None


# Google's error statuses by HTTP status (google.rpc.Code names).
_STATUS = {
    400: "INVALID_ARGUMENT",
    401: "UNAUTHENTICATED",
    403: "PERMISSION_DENIED",
    404: "NOT_FOUND",
    408: "DEADLINE_EXCEEDED",
    409: "ABORTED",
    413: "INVALID_ARGUMENT",
    429: "RESOURCE_EXHAUSTED",
    499: "CANCELLED",
    501: "UNIMPLEMENTED",
    503: "UNAVAILABLE",
    504: "DEADLINE_EXCEEDED",
}


def google_status(status: int) -> str:
    return _STATUS.get(status, "INTERNAL" if status >= 500 else "FAILED_PRECONDITION")


def google_error(status: int, message: str) -> bytes:
    """An error of the platform (not of the model) in Google's shape."""
    return orjson.dumps(
        {"error": {"code": status, "message": message, "status": google_status(status)}}
    )


# The envelope and the API's errors, as the exchange reads them.


def vertex_path(raw_path: str) -> str:
    """A request's path after PREFIX, without its query."""
    return raw_path.partition("?")[0].removeprefix(PREFIX)


class VertexEnvelope:
    """The model and the stream in the path, betas in `anthropic-beta` (`Envelope`,
    proxy/server/envelope.py); summaries are `rawPredict` calls on the request's own
    model (or the one asked for), in its project and location."""

    def model(self, path: str, payload: Mapping[str, Any]) -> str:
        target = vertex_target(vertex_path(path))
        if target is not None and target.counts_tokens:
            return str(payload.get("model", ""))
        return target.model if target is not None else ""

    def betas(self, headers: Mapping[str, str], payload: Mapping[str, Any]) -> str:
        return ",".join(v for k, v in headers.items() if k.lower() == "anthropic-beta")

    def stream(self, path: str, payload: Mapping[str, Any]) -> bool:
        target = vertex_target(vertex_path(path))
        return target is not None and target.streams

    def summary(self, path: str, need: GetSummary) -> tuple[str, GetSummary]:
        target = vertex_target(vertex_path(path))
        assert target is not None, "a summary is made only for a Claude call"
        model = need.model or target.model
        upstream = (
            f"/v1/projects/{target.project}/locations/{target.location}"
            f"/publishers/anthropic/models/{model}:rawPredict"
        )
        return upstream, rewrapped(need, ANTHROPIC_VERSION)


class VertexErrors:
    """The proxy's own refusals (keys, budgets, limits) as the platform's, in Google's
    shape; inside a stream, Anthropic's error event, as Vertex streams the model's."""

    def error_body(self, error: ProxyError, request_id: str) -> bytes:
        return google_error(error.status, error.message)


class VertexMessages(VertexErrors, AnthropicMessages):
    """Messages as Vertex AI carries it: the same history, counting, rounds, usage and
    stream errors; the platform's error shape."""


VERTEX = VertexMessages()
VERTEX_ENVELOPE = VertexEnvelope()
