"""Claude on Amazon Bedrock: the envelope around a Messages body.

bedrock-runtime takes the Messages body without `model` (the model id is in the path,
`/model/{modelId}/invoke`), with `"anthropic_version": "bedrock-2023-05-31"` and the betas
as the body's `anthropic_beta` list. Streams are an AWS event stream (proxy/core/
eventstream.py) whose `chunk` events carry one Anthropic stream event's JSON, base64
encoded; errors are `{"message": ...}` named by `x-amzn-ErrorType` (in a stream: an
`exception` message named by `:exception-type`). Usage is also told as invocation
metrics: response headers on a whole answer, `amazon-bedrock-invocationMetrics` in the
last event of a stream.
"""

from __future__ import annotations

import base64
import binascii
import re
from collections.abc import Mapping
from dataclasses import dataclass
from enum import StrEnum
from typing import Any

import orjson

from proxy.core.commands import GetSummary
from proxy.core.errors import ProxyError
from proxy.core.eventstream import Message, encode_message
from proxy.core.usage import Usage
from proxy.wire.anthropic import AnthropicMessages, rewrapped, stream_error_event
from proxy.wire.common import percent_decode, percent_encode

# The provider's own version tag; the anthropic SDK (2.x) sends its API version (a date)
# instead, which the provider takes too.
ANTHROPIC_VERSION = "bedrock-2023-05-31"
API_DATE = re.compile(r"^\d{4}-\d{2}-\d{2}$")
EVENT_STREAM = "application/vnd.amazon.eventstream"
REQUEST_ID_HEADER = "x-amzn-RequestId"
ERROR_TYPE_HEADER = "x-amzn-ErrorType"
METRICS_FIELD = "amazon-bedrock-invocationMetrics"
# Where the proxy serves bedrock-runtime (and the control plane's reads): what clients
# are given as their Bedrock base URL (Claude Code's ANTHROPIC_BEDROCK_BASE_URL).
PREFIX = "/bedrock"


class Operation(StrEnum):
    """bedrock-runtime's operations on a model that carry a Messages body."""

    INVOKE = "invoke"
    STREAM = "invoke-with-response-stream"
    COUNT_TOKENS = "count-tokens"


@dataclass(frozen=True, slots=True)
class RuntimeTarget:
    model: str  # the model id, decoded (`us.anthropic.claude-...-v1:0`, an ARN)
    operation: Operation

    @property
    def path(self) -> str:
        """The path as botocore sends it (the id's `:` and `/` percent-encoded), which
        is the path the proxy signs and sends, whatever spelling the client used."""
        return f"/model/{percent_encode(self.model)}/{self.operation}"


_RUNTIME = re.compile(r"^/model/(?P<model>[^/]+)/(?P<operation>[a-z-]+)$")
# The control plane's read-only calls Claude Code makes (ListInferenceProfiles and
# GetInferenceProfile, the foundation models beside them). Nothing else is forwarded:
# the proxy signs with its own credentials, which must not serve a client's writes.
_CONTROL_PLANE = re.compile(r"^/(inference-profiles|foundation-models)(/[^/]+)?$")


def runtime_target(path: str) -> RuntimeTarget | None:
    """The model and operation a runtime path (after the proxy's `/bedrock`) names."""
    found = _RUNTIME.match(path)
    if found is None:
        return None
    try:
        operation = Operation(found["operation"])
    except ValueError:
        return None
    model = percent_decode(found["model"])
    return RuntimeTarget(model, operation) if model else None


def is_control_plane(method: str, path: str) -> bool:
    """Whether a call is one of the control plane's reads the proxy forwards."""
    return method == "GET" and _CONTROL_PLANE.match(path) is not None


def envelope_problem(body: Mapping[str, Any]) -> str | None:
    """Why a runtime body is not Bedrock's Messages envelope, as Bedrock says it."""
    if "model" in body:
        return (
            "Malformed input request: #: extraneous key [model] is not permitted, "
            "please reformat your input and try again."
        )
    version = body.get("anthropic_version")
    if not (version == ANTHROPIC_VERSION or (isinstance(version, str) and API_DATE.match(version))):
        shown = "missing" if version is None else f"invalid: {version!r}"
        return (
            f"Malformed input request: anthropic_version is {shown}, "
            f"expected {ANTHROPIC_VERSION!r}."
        )
    betas = body.get("anthropic_beta")
    if betas is not None and not (
        isinstance(betas, list) and all(isinstance(b, str) for b in betas)
    ):
        return "Malformed input request: #/anthropic_beta: expected type: JSONArray of strings."
    return None


def betas(body: Mapping[str, Any]) -> str:
    """The body's betas as an `anthropic-beta` header value (a comma list)."""
    value = body.get("anthropic_beta")
    if not isinstance(value, list):
        return ""
    return ",".join(b for b in value if isinstance(b, str))


# count-tokens: {"input": {"invokeModel": {"body": "<the invoke body, base64>"}}}


def count_tokens_body(invoke_body: bytes) -> bytes:
    encoded = base64.b64encode(invoke_body).decode()
    return orjson.dumps({"input": {"invokeModel": {"body": encoded}}})


def counted_body(payload: Mapping[str, Any]) -> bytes | None:
    """The invoke body a count-tokens request counts (None: not that envelope)."""
    wrapped = payload.get("input")
    invoke = wrapped.get("invokeModel") if isinstance(wrapped, dict) else None
    body = invoke.get("body") if isinstance(invoke, dict) else None
    if not isinstance(body, str):
        return None
    try:
        return base64.b64decode(body, validate=True)
    except (binascii.Error, ValueError):
        return None


def count_tokens_answer(tokens: int) -> bytes:
    return orjson.dumps({"inputTokens": tokens})


# The event stream.

_JSON = (":content-type", "application/json")
_CHUNK = ((":event-type", "chunk"), _JSON, (":message-type", "event"))


def chunk_frame(event: bytes) -> bytes:
    """One Anthropic stream event (its JSON) as Bedrock's `chunk` message."""
    payload = b'{"bytes":"' + base64.b64encode(event) + b'"}'
    return encode_message(_CHUNK, payload)


def exception_frame(exception: str, message: str, **fields: object) -> bytes:
    """An error inside a stream (`exception` its event name, e.g. `throttlingException`)."""
    headers = ((":exception-type", exception), _JSON, (":message-type", "exception"))
    return encode_message(headers, orjson.dumps({"message": message, **fields}))


def chunk_event(message: Message) -> bytes | None:
    """The Anthropic event JSON a `chunk` message carries (None: another message, or a
    chunk without readable bytes)."""
    if message.header(":message-type") != "event" or message.header(":event-type") != "chunk":
        return None
    try:
        payload = orjson.loads(message.payload)
        data = payload.get("bytes") if isinstance(payload, dict) else None
        return base64.b64decode(data, validate=True) if isinstance(data, str) else None
    except (orjson.JSONDecodeError, binascii.Error, ValueError):
        return None


def exception_name(message: Message) -> str | None:
    """The exception an `exception` (or `error`) message names, else None."""
    kind = message.header(":message-type")
    if kind == "exception":
        return message.header(":exception-type") or "exception"
    if kind == "error":
        return message.header(":error-code") or "error"
    return None


# Errors: the proxy's own, by HTTP status, named as Bedrock names them.

_ERRORS = {
    400: "ValidationException",
    401: "UnrecognizedClientException",
    403: "AccessDeniedException",
    404: "ResourceNotFoundException",
    408: "ModelTimeoutException",
    413: "ValidationException",
    415: "ValidationException",
    417: "ValidationException",
    426: "ValidationException",
    429: "ThrottlingException",
    503: "ServiceUnavailableException",
}


def error_type(status: int) -> str:
    """The `x-amzn-ErrorType` of an error answer with this status."""
    return _ERRORS.get(
        status, "InternalServerException" if status >= 500 else "ValidationException"
    )


def stream_exception(status: int) -> str:
    """The event name of an error inside a stream, for an error of this status (the
    response stream's members: validationException, throttlingException, ...)."""
    name = {
        400: "validationException",
        408: "modelTimeoutException",
        429: "throttlingException",
        503: "serviceUnavailableException",
        504: "modelTimeoutException",  # the upstream went silent inside the stream
    }.get(status)
    return name or ("internalServerException" if status >= 500 else "validationException")


def error_body(message: str) -> bytes:
    return orjson.dumps({"message": message})


# Invocation metrics: usage as Bedrock tells it, besides the Anthropic events' own.

METRIC_HEADERS = (
    ("X-Amzn-Bedrock-Input-Token-Count", "inputTokenCount"),
    ("X-Amzn-Bedrock-Output-Token-Count", "outputTokenCount"),
    ("X-Amzn-Bedrock-Cache-Read-Input-Token-Count", "cacheReadInputTokenCount"),
    ("X-Amzn-Bedrock-Cache-Write-Input-Token-Count", "cacheWriteInputTokenCount"),
    ("X-Amzn-Bedrock-Invocation-Latency", "invocationLatency"),
)


def invocation_metrics(usage: Usage, latency_ms: int, first_byte_ms: int) -> dict[str, int]:
    """The metrics a stream's last event carries, for the usage the client is told."""
    return {
        "inputTokenCount": usage.input_tokens,
        "outputTokenCount": usage.output_tokens,
        "invocationLatency": latency_ms,
        "firstByteLatency": first_byte_ms,
        "cacheReadInputTokenCount": usage.cache_read_input_tokens,
        "cacheWriteInputTokenCount": usage.cache_creation_input_tokens,
    }


def metric_headers(usage: Usage, latency_ms: int) -> list[tuple[str, str]]:
    """A whole answer's invocation metrics, as its response headers."""
    metrics = invocation_metrics(usage, latency_ms, latency_ms)
    return [(header, str(metrics[key])) for header, key in METRIC_HEADERS]


def exception_for(error_type: str) -> str:
    """The stream exception for an error event's type: a Bedrock exception name as it
    is, an Anthropic error type as Bedrock names it."""
    if error_type.endswith("Exception"):
        return error_type
    return _STREAM_NAMES.get(error_type, "internalServerException")


_STREAM_NAMES = {
    "invalid_request_error": "validationException",
    "request_too_large": "validationException",
    "rate_limit_error": "throttlingException",
    "overloaded_error": "serviceUnavailableException",
    "timeout_error": "modelTimeoutException",
    "api_error": "internalServerException",
}


# The envelope and the API's errors, as the exchange reads them.


def runtime_path(raw_path: str) -> str:
    """A request's path after PREFIX, without its query."""
    return raw_path.partition("?")[0].removeprefix(PREFIX)


class BedrockEnvelope:
    """The model in the path, the stream in the operation, betas in the body
    (`Envelope`, proxy/server/envelope.py); summaries are `invoke` calls on the
    request's own model (or the one asked for)."""

    def model(self, path: str, payload: Mapping[str, Any]) -> str:
        target = runtime_target(runtime_path(path))
        return target.model if target is not None else ""

    def betas(self, headers: Mapping[str, str], payload: Mapping[str, Any]) -> str:
        # Claude Code also names its own beta in the header; the body's are the model's.
        named = [v for k, v in headers.items() if k.lower() == "anthropic-beta"]
        return ",".join(b for b in (betas(payload), *named) if b)

    def stream(self, path: str, payload: Mapping[str, Any]) -> bool:
        target = runtime_target(runtime_path(path))
        return target is not None and target.operation is Operation.STREAM

    def summary(self, path: str, need: GetSummary) -> tuple[str, GetSummary]:
        model = need.model or self.model(path, {})
        upstream = RuntimeTarget(model, Operation.INVOKE).path
        return upstream, rewrapped(need, ANTHROPIC_VERSION)


class BedrockErrors:
    """Bedrock's errors (`ErrorShapes`): `{"message"}` named by `x-amzn-ErrorType`; in
    a stream, an Anthropic error event that the event stream's codec writes as the
    exception message it names (proxy/server/eventstream_codec.py)."""

    request_id_header = REQUEST_ID_HEADER

    def error_body(self, error: ProxyError, request_id: str) -> bytes:
        return error_body(error.message)

    def error_headers(self, error: ProxyError) -> dict[str, str]:
        return {ERROR_TYPE_HEADER: error_type(error.status)}

    def stream_error(self, error: ProxyError) -> bytes:
        return stream_error_event(stream_exception(error.status), error.message)

    def upstream_stream_error(self, payload: object, status: int) -> bytes:
        message = payload.get("message") if isinstance(payload, dict) else None
        text = message if isinstance(message, str) else f"upstream answered {status}"
        return stream_error_event(stream_exception(status), text)


class BedrockMessages(BedrockErrors, AnthropicMessages):
    """Messages as bedrock-runtime carries it: the same history, counting, rounds and
    usage; Bedrock's errors."""


BEDROCK = BedrockMessages()
BEDROCK_ENVELOPE = BedrockEnvelope()
