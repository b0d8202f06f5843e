"""Bedrock's envelope as the real clients read it: paths as botocore writes them, chunk
and exception frames through the anthropic SDK's Bedrock stream decoder, errors through
botocore's bedrock-runtime client."""

from __future__ import annotations

import base64
import json
from collections.abc import Iterator
from typing import Any
from urllib.parse import quote

import botocore.session
import orjson
import pytest
from anthropic.lib.bedrock._stream_decoder import AWSEventStreamDecoder
from botocore.awsrequest import AWSResponse
from botocore.config import Config
from hypothesis import given
from hypothesis import strategies as st

from proxy.core.commands import GetSummary
from proxy.core.errors import BudgetRefused
from proxy.core.eventstream import EventStreamDecoder
from proxy.core.usage import Usage
from proxy.wire.anthropic_bedrock import (
    ANTHROPIC_VERSION,
    BEDROCK,
    BEDROCK_ENVELOPE,
    ERROR_TYPE_HEADER,
    Operation,
    RuntimeTarget,
    betas,
    chunk_event,
    chunk_frame,
    count_tokens_answer,
    count_tokens_body,
    counted_body,
    envelope_problem,
    error_body,
    error_type,
    exception_frame,
    exception_name,
    invocation_metrics,
    is_control_plane,
    metric_headers,
    runtime_target,
    stream_exception,
)
from proxy.wire.common import percent_decode, percent_encode

MODEL = "us.anthropic.claude-sonnet-4-5-20250929-v1:0"


class _Body:
    def __init__(self, data: bytes) -> None:
        self.data = data

    def stream(self, **_: Any) -> Iterator[bytes]:
        yield self.data

    def read(self) -> bytes:
        return self.data


class Captured:
    """A botocore bedrock-runtime client whose requests are answered here, not sent."""

    def __init__(
        self, status: int = 200, headers: dict[str, str] | None = None, body: bytes = b"{}"
    ):
        session = botocore.session.get_session()
        self.client = session.create_client(
            "bedrock-runtime",
            region_name="us-east-1",
            aws_access_key_id="AKIDEXAMPLE",
            aws_secret_access_key="secret",
            config=Config(retries={"total_max_attempts": 1}),
        )
        self.answer = (status, headers or {"content-type": "application/json"}, body)
        self.urls: list[str] = []
        self.client.meta.events.register("before-send", self._send)

    def _send(self, request: Any, **_: Any) -> AWSResponse:
        self.urls.append(request.url)
        status, headers, body = self.answer
        return AWSResponse(request.url, status, headers, _Body(body))


@pytest.mark.parametrize("model", [MODEL, "arn:aws:bedrock:us-east-1::foundation-model/x:y"])
def test_the_path_sent_is_the_one_botocore_writes(model: str) -> None:
    captured = Captured()
    captured.client.invoke_model(modelId=model, body=b"{}")
    target = RuntimeTarget(model, Operation.INVOKE)
    assert captured.urls == [f"https://bedrock-runtime.us-east-1.amazonaws.com{target.path}"]


def test_a_runtime_path_is_read_with_or_without_the_colon_encoded() -> None:
    for path in (f"/model/{MODEL}/invoke", "/model/us.anthropic.claude-x-v1%3A0/invoke"):
        target = runtime_target(path)
        assert target is not None and target.operation is Operation.INVOKE
    assert runtime_target(f"/model/{MODEL}/invoke-with-response-stream") == RuntimeTarget(
        MODEL, Operation.STREAM
    )
    assert runtime_target(f"/model/{MODEL}/count-tokens") == RuntimeTarget(
        MODEL, Operation.COUNT_TOKENS
    )
    for other in (f"/model/{MODEL}/converse", "/model//invoke", "/models", f"/model/{MODEL}"):
        assert runtime_target(other) is None


def test_only_the_control_planes_reads_are_forwarded() -> None:
    assert is_control_plane("GET", "/inference-profiles")
    assert is_control_plane("GET", "/inference-profiles/us.anthropic.claude-x-v1:0")
    assert is_control_plane("GET", "/foundation-models")
    assert not is_control_plane("POST", "/inference-profiles")
    assert not is_control_plane("DELETE", "/inference-profiles/x")
    assert not is_control_plane("GET", "/guardrails")
    assert not is_control_plane("GET", "/inference-profiles/x/y")


def test_the_envelope_is_checked_as_bedrock_checks_it() -> None:
    good = {"anthropic_version": ANTHROPIC_VERSION, "max_tokens": 1, "messages": []}
    assert envelope_problem(good) is None
    assert "extraneous key [model]" in (envelope_problem({**good, "model": "x"}) or "")
    assert "anthropic_version is missing" in (envelope_problem({"messages": []}) or "")
    dated = {**good, "anthropic_version": "2026-10-21"}  # what the anthropic SDK 2.x sends
    assert envelope_problem(dated) is None
    wrong = {**good, "anthropic_version": "vertex-2023-10-16"}
    assert "anthropic_version is invalid" in (envelope_problem(wrong) or "")
    assert "anthropic_beta" in (envelope_problem({**good, "anthropic_beta": "x"}) or "")
    beta = {**good, "anthropic_beta": ["context-1m-2025-08-07", "x"]}
    assert envelope_problem(beta) is None
    assert betas(beta) == "context-1m-2025-08-07,x" and betas(good) == ""


def test_count_tokens_wraps_the_invoke_body() -> None:
    body = b'{"anthropic_version":"bedrock-2023-05-31","messages":[]}'
    wrapped = orjson.loads(count_tokens_body(body))
    assert counted_body(wrapped) == body
    assert counted_body({"input": {"invokeModel": {"body": "not base64!"}}}) is None
    assert counted_body({"input": {"converse": {}}}) is None
    captured = Captured(body=count_tokens_answer(42))
    got = captured.client.count_tokens(modelId=MODEL, input={"invokeModel": {"body": body}})
    assert got["inputTokens"] == 42


EVENTS = [
    {"type": "message_start", "message": {"id": "msg_1", "usage": {"input_tokens": 9}}},
    {"type": "content_block_delta", "index": 0, "delta": {"type": "text_delta", "text": "é"}},
    {"type": "message_stop", "amazon-bedrock-invocationMetrics": {"inputTokenCount": 9}},
]


def test_chunks_are_read_by_the_anthropic_sdks_bedrock_decoder() -> None:
    stream = b"".join(chunk_frame(orjson.dumps(e)) for e in EVENTS)
    stream += exception_frame("throttlingException", "Too many requests")
    got = list(AWSEventStreamDecoder().iter_bytes(iter([stream[:7], stream[7:]])))
    assert [(e.event, e.json()) for e in got[:3]] == [(e["type"], e) for e in EVENTS]
    assert got[3].event == "error"
    assert got[3].json()["error"] == {"type": "throttlingException", "message": "Too many requests"}


def test_chunks_and_exceptions_are_read_back() -> None:
    frames = [chunk_frame(orjson.dumps(e)) for e in EVENTS]
    frames.append(exception_frame("modelStreamErrorException", "cut", originalStatusCode=500))
    messages = EventStreamDecoder().feed(b"".join(frames))
    assert [chunk_event(m) for m in messages[:3]] == [orjson.dumps(e) for e in EVENTS]
    assert [exception_name(m) for m in messages] == [None, None, None, "modelStreamErrorException"]
    assert chunk_event(messages[3]) is None
    assert json.loads(messages[3].payload) == {"message": "cut", "originalStatusCode": 500}
    # The payload is exactly Bedrock's: {"bytes": base64}.
    assert json.loads(messages[0].payload) == {
        "bytes": base64.b64encode(orjson.dumps(EVENTS[0])).decode()
    }


@pytest.mark.parametrize(
    ("status", "name"),
    [
        (400, "ValidationException"),
        (403, "AccessDeniedException"),
        (404, "ResourceNotFoundException"),
        (429, "ThrottlingException"),
        (503, "ServiceUnavailableException"),
        (500, "InternalServerException"),
    ],
)
def test_errors_are_raised_by_botocore_as_the_modelled_exception(status: int, name: str) -> None:
    assert error_type(status) == name
    headers = {ERROR_TYPE_HEADER: name, "content-type": "application/json"}
    captured = Captured(status, headers, error_body("what went wrong"))
    error = getattr(captured.client.exceptions, name)
    with pytest.raises(error) as raised:
        captured.client.invoke_model(modelId=MODEL, body=b"{}")
    assert raised.value.response["Error"] == {"Code": name, "Message": "what went wrong"}


def test_stream_exceptions_are_members_of_the_response_stream() -> None:
    members = {
        "validationException",
        "throttlingException",
        "modelTimeoutException",
        "serviceUnavailableException",
        "internalServerException",
    }
    assert {stream_exception(s) for s in (400, 401, 408, 413, 429, 500, 502, 503, 504)} <= members


def test_invocation_metrics_tell_the_usage_given() -> None:
    usage = Usage(
        input_tokens=10, cache_creation_input_tokens=5, cache_read_input_tokens=7, output_tokens=3
    )
    assert invocation_metrics(usage, 900, 200) == {
        "inputTokenCount": 10,
        "outputTokenCount": 3,
        "invocationLatency": 900,
        "firstByteLatency": 200,
        "cacheReadInputTokenCount": 7,
        "cacheWriteInputTokenCount": 5,
    }
    assert dict(metric_headers(usage, 900))["X-Amzn-Bedrock-Output-Token-Count"] == "3"


@given(st.text())
def test_a_model_id_is_escaped_as_urllib_quotes_it_and_read_back(model: str) -> None:
    assert percent_encode(model) == quote(model, safe="")
    assert percent_decode(percent_encode(model)) == model


# -- the envelope as the exchange reads it ----------------------------------------------

PATH = "/bedrock/model/us.anthropic.claude-sonnet-4-5-20250929-v1:0/invoke-with-response-stream"


def test_the_exchange_reads_model_betas_and_stream_from_the_envelope() -> None:
    body = {"anthropic_version": ANTHROPIC_VERSION, "anthropic_beta": ["context-1m-2025-08-07"]}
    assert BEDROCK_ENVELOPE.model(PATH, body) == "us.anthropic.claude-sonnet-4-5-20250929-v1:0"
    assert BEDROCK_ENVELOPE.model("/bedrock/elsewhere", body) == ""
    assert BEDROCK_ENVELOPE.stream(PATH, body)
    assert not BEDROCK_ENVELOPE.stream(PATH.replace("-with-response-stream", ""), body)
    headers = {"anthropic-beta": "claude-code-20250219"}
    assert BEDROCK_ENVELOPE.betas(headers, body) == "context-1m-2025-08-07,claude-code-20250219"


def test_a_summary_is_an_invoke_on_the_requests_model_in_bedrocks_envelope() -> None:
    in_place = {"anthropic_version": ANTHROPIC_VERSION, "max_tokens": 10, "messages": []}
    transcript = {"model": "m", "max_tokens": 10, "system": "s", "messages": []}
    need = GetSummary("k", in_place, 10, "", fallback=transcript, encoded=b"exact bytes")
    path, sent = BEDROCK_ENVELOPE.summary(PATH + "?x=1", need)
    assert path == "/model/us.anthropic.claude-sonnet-4-5-20250929-v1%3A0/invoke"
    assert sent.body is in_place and sent.encoded == b"exact bytes"  # the client's own
    assert sent.fallback == {**{k: v for k, v in transcript.items() if k != "model"},
                             "anthropic_version": ANTHROPIC_VERSION}  # fmt: skip
    other = GetSummary("k", transcript, 10, "anthropic.claude-haiku-4-5-20251001-v1:0")
    path, sent = BEDROCK_ENVELOPE.summary(PATH, other)
    assert path == "/model/anthropic.claude-haiku-4-5-20251001-v1%3A0/invoke"
    assert "model" not in sent.body and sent.encoded == b""


def test_the_proxys_own_errors_in_bedrocks_shape() -> None:
    refused = BudgetRefused("too many")
    assert orjson.loads(BEDROCK.error_body(refused, "req")) == {"message": "too many"}
    assert BEDROCK.error_headers(refused) == {ERROR_TYPE_HEADER: "ThrottlingException"}
    assert b'"throttlingException"' in BEDROCK.stream_error(refused)
    upstream = BEDROCK.upstream_stream_error({"message": "slow down"}, 429)
    assert b'"throttlingException"' in upstream and b"slow down" in upstream
