"""The stand-in's Amazon Bedrock: Claude through bedrock-runtime, and the control plane's
inference profiles, on one host (what `upstream.bedrock_url` names in tests).

Routes: `POST /model/{modelId}/invoke` (a whole answer, its usage also in the
`X-Amzn-Bedrock-*-Token-Count` headers), `/invoke-with-response-stream` (an AWS event
stream: each Anthropic event a `chunk`, the last carrying
`amazon-bedrock-invocationMetrics`; a `stream_error` fault a `modelStreamErrorException`),
`/count-tokens` (`{"input": {"invokeModel": {"body": base64}}}` -> `{"inputTokens": N}`),
and `GET /inference-profiles` (the system-defined profiles of the models it serves).

As strict as Bedrock: every request is authorised, by SigV4 recomputed with botocore
against the test credentials and the region (aws_sigv4.py) or by the test Bedrock API
key, else 403 in Bedrock's shape; a model id it does not serve, `model` in the body or a
wrong `anthropic_version` are refused (400 ValidationException) before the Messages
rules apply (the Messages stand-in's reader, renderer and validation). Errors are
`{"message": ...}` named by `x-amzn-ErrorType`.
"""

from __future__ import annotations

import datetime
from collections.abc import Mapping
from typing import Any

import orjson
from aiohttp import web

from proxy.core.tokens import TokenCounter
from proxy.testing import api_messages
from proxy.testing.answering import Checked, count_tokens, serve
from proxy.testing.api import Event, Refusal, event
from proxy.testing.api_messages import EnvelopedMessages
from proxy.testing.aws_sigv4 import check_request
from proxy.testing.standin_http import (
    COUNTER,
    OPTIONS,
    RECORD,
    Framing,
    request_id,
)
from proxy.wire.anthropic_bedrock import (
    ERROR_TYPE_HEADER,
    EVENT_STREAM,
    METRICS_FIELD,
    REQUEST_ID_HEADER,
    Operation,
    RuntimeTarget,
    chunk_frame,
    counted_body,
    envelope_problem,
    error_body,
    exception_frame,
    invocation_metrics,
    metric_headers,
)
from proxy.wire.anthropic_rounds import anthropic_usage
from proxy.wire.anthropic_validation import validate_count_tokens_request

ACCOUNT = "123456789012"
GEOGRAPHIES = ("us", "eu", "apac", "global")
# The Bedrock ids of the models the Messages stand-in serves: the base model's, and the
# system-defined inference profiles' (what Claude Code names).
MODEL_IDS = frozenset(
    f"{prefix}anthropic.{name}-v1:0"
    for name, _, _ in api_messages.MODELS
    for prefix in ("", *(f"{g}." for g in GEOGRAPHIES))
)
# Bedrock's own names for the Messages stand-in's error types.
_ERRORS = {
    "invalid_request_error": "ValidationException",
    "rate_limit_error": "ThrottlingException",
    "overloaded_error": "ServiceUnavailableException",
    "api_error": "InternalServerException",
    "not_found_error": "ResourceNotFoundException",
}
FAULTS = {
    "429": Refusal(429, "ThrottlingException", "Too many requests, please wait."),
    "529": Refusal(503, "ServiceUnavailableException", "Bedrock is unable to serve it now."),
    "500": Refusal(500, "InternalServerException", "The server encountered an error."),
}
INVALID_MODEL = "The provided model identifier is invalid."


def refusal_response(refusal: Refusal) -> web.Response:
    kind = _ERRORS.get(refusal.kind, refusal.kind)
    headers = {ERROR_TYPE_HEADER: kind, **refusal.headers}
    return web.Response(
        status=refusal.status,
        body=error_body(refusal.message),
        content_type="application/json",
        headers=headers,
    )


def authorised(request: web.Request, body: bytes) -> Refusal | None:
    """SigV4 (or the Bedrock API key) checked as AWS checks it."""
    url = f"{request.scheme}://{request.host}{request.raw_path}"
    refused = check_request(
        request.method,
        url,
        request.headers,
        body,
        region=request.app[OPTIONS].aws_region,
        now=datetime.datetime.now(datetime.UTC),
    )
    return None if refused is None else Refusal(403, refused.error, refused.message)


class BedrockApi(EnvelopedMessages):
    faults = FAULTS
    unparsable = "Malformed input request: {error}, please reformat your input and try again."
    envelope_fields = ("anthropic_version", "anthropic_beta")

    def __init__(self, counter: TokenCounter, target: RuntimeTarget) -> None:
        super().__init__(counter, "bedrock", target.model)
        self.target = target

    def refuse(self, refusal: Refusal, request_id: str) -> web.Response:
        return refusal_response(refusal)

    def invalid(self, body: Any) -> Refusal | None:
        if not isinstance(body, dict):
            return Refusal(400, "ValidationException", "Malformed input request.")
        problem = envelope_problem(body)
        if problem is None and self.target.operation is Operation.COUNT_TOKENS:
            problem = validate_count_tokens_request(self.as_messages(body))
            return Refusal(400, "ValidationException", problem) if problem else None
        if problem is not None:
            return Refusal(400, "ValidationException", problem)
        return super().invalid(self.as_messages(body))

    def deferral_refusal(self, body: Any) -> Refusal | None:
        refused = super().deferral_refusal(body)
        return None if refused is None else Refusal(400, "ValidationException", refused.message)

    def streaming(self, body: Any) -> bool:
        return self.target.operation is Operation.STREAM

    def response_headers(
        self, headers: Mapping[str, str], whole: dict[str, Any] | None
    ) -> Mapping[str, str]:
        return (
            dict(metric_headers(anthropic_usage(whole["usage"]), 1000)) if whole is not None else {}
        )

    def events(self, body: Any, whole: dict[str, Any], chunk_tokens: int) -> list[Event]:
        events = super().events(body, whole, chunk_tokens)
        last = orjson.loads(events[-1].data)
        last[METRICS_FIELD] = invocation_metrics(anthropic_usage(whole["usage"]), 1000, 100)
        return [*events[:-1], event(events[-1].kind, events[-1].name, last)]

    def stream_error(self, events: list[Event]) -> Event:
        error = {"type": "modelStreamErrorException", "message": "The model stream broke."}
        return event("end", "error", {"type": "error", "error": error})


def _frame(item: Event) -> bytes:
    """An event as Bedrock streams it: a chunk, or an error as an exception message."""
    if item.name == "error":
        error = orjson.loads(item.data)["error"]
        return exception_frame(error["type"], error["message"])
    return chunk_frame(item.data)


EVENT_STREAM_FRAMING = Framing(EVENT_STREAM, _frame)


async def handle_runtime(request: web.Request) -> web.StreamResponse:
    target = RuntimeTarget(request.match_info["model_id"], Operation(request.match_info["op"]))
    record = request[RECORD]
    body = record.body
    refusal = authorised(request, body)
    if refusal is None and target.model not in MODEL_IDS:
        refusal = Refusal(400, "ValidationException", INVALID_MODEL)
    if refusal is not None:
        record.error = refusal.message
        return refusal_response(refusal)
    api = BedrockApi(request.app[COUNTER], target)
    if target.operation is Operation.COUNT_TOKENS:
        return await _count_tokens(request, api)
    return await serve(request, api, EVENT_STREAM_FRAMING)


async def _count_tokens(request: web.Request, api: BedrockApi) -> web.Response:
    def check(wrapped: Any) -> Checked:
        inner = counted_body(wrapped) if isinstance(wrapped, dict) else None
        if inner is None:
            message = "Malformed input request: expected input.invokeModel.body (base64)."
            return None, Refusal(400, "ValidationException", message)
        body = orjson.loads(inner)  # (not JSON: the unparsable 400, as the wrapper's)
        return body, api.invalid(body)

    return await count_tokens(request, api, check, lambda n: {"inputTokens": n})


async def handle_inference_profiles(request: web.Request) -> web.Response:
    refusal = authorised(request, request[RECORD].body)
    if refusal is not None:
        request[RECORD].error = refusal.message
        return refusal_response(refusal)
    arn = f"arn:aws:bedrock:{request.app[OPTIONS].aws_region}"
    profiles = []
    for name, display, _ in api_messages.MODELS:
        for geography in GEOGRAPHIES:
            profile = f"{geography}.anthropic.{name}-v1:0"
            model = f"{arn}::foundation-model/anthropic.{name}-v1:0"
            profiles.append(
                {
                    "inferenceProfileName": f"{geography.upper()} {display}",
                    "inferenceProfileId": profile,
                    "inferenceProfileArn": f"{arn}:{ACCOUNT}:inference-profile/{profile}",
                    "models": [{"modelArn": model}],
                    "status": "ACTIVE",
                    "type": "SYSTEM_DEFINED",
                }
            )
    return web.json_response({"inferenceProfileSummaries": profiles})


async def _request_id(request: web.Request, response: web.StreamResponse) -> None:
    if request.path.startswith(("/model/", "/inference-profiles")):
        response.headers.setdefault(REQUEST_ID_HEADER, request_id(request))


RUNTIME = "/model/{model_id}/{op:invoke|invoke-with-response-stream|count-tokens}"


def add_routes(app: web.Application) -> None:
    app.router.add_post(RUNTIME, handle_runtime)
    app.router.add_get("/inference-profiles", handle_inference_profiles)
    app.on_response_prepare.append(_request_id)
