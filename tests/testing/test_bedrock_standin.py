"""The Bedrock stand-in through the real clients: boto3's bedrock-runtime and bedrock
clients (SigV4 from botocore), the anthropic SDK's AnthropicBedrock (its own signing, the
`:` of the model id unencoded), and a Bedrock API key; what it refuses, in Bedrock's shape."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import anthropic
import boto3
import botocore.exceptions
import pytest
from botocore.config import Config

from proxy.testing.aws_sigv4 import TEST_BEDROCK_KEY, TEST_CREDENTIALS
from proxy.testing.standin import StandInOptions
from tests.plugins.standin import RunningStandIn

MODEL = "us.anthropic.claude-sonnet-4-5-20250929-v1:0"
BODY = {
    "anthropic_version": "bedrock-2023-05-31",
    "max_tokens": 200,
    "messages": [{"role": "user", "content": "What does src/app.py do?"}],
}


def _client(url: str, service: str = "bedrock-runtime", **keys: Any) -> Any:
    credentials = {
        "aws_access_key_id": TEST_CREDENTIALS.access_key,
        "aws_secret_access_key": TEST_CREDENTIALS.secret_key,
        "aws_session_token": TEST_CREDENTIALS.token,
        **keys,
    }
    return boto3.client(
        service,
        region_name="us-east-1",
        endpoint_url=url,
        config=Config(retries={"total_max_attempts": 1}),
        **credentials,
    )


@pytest.fixture
def bedrock(make_standin_thread: Any) -> Iterator[RunningStandIn]:
    yield make_standin_thread(StandInOptions())


def test_boto3_invokes_whole_and_streamed(bedrock: RunningStandIn) -> None:
    client = _client(bedrock.url)
    whole = client.invoke_model(modelId=MODEL, body=json.dumps(BODY))
    message = json.loads(whole["body"].read())
    assert message["type"] == "message" and message["model"] == "claude-sonnet-4-5-20250929"
    headers = whole["ResponseMetadata"]["HTTPHeaders"]
    assert headers["x-amzn-bedrock-input-token-count"] == str(message["usage"]["input_tokens"])
    streamed = client.invoke_model_with_response_stream(modelId=MODEL, body=json.dumps(BODY))
    events = [json.loads(part["chunk"]["bytes"]) for part in streamed["body"]]
    assert [e["type"] for e in events][:1] == ["message_start"]
    assert events[-1]["type"] == "message_stop"
    metrics = events[-1]["amazon-bedrock-invocationMetrics"]
    assert metrics["outputTokenCount"] == message["usage"]["output_tokens"]
    text = "".join(e["delta"].get("text", "") for e in events if e["type"] == "content_block_delta")
    assert text == message["content"][0]["text"]
    assert {r.path_qs.split("/")[-1] for r in bedrock.recorded} == {
        "invoke",
        "invoke-with-response-stream",
    }


def test_boto3_counts_tokens_and_lists_inference_profiles(bedrock: RunningStandIn) -> None:
    counted = _client(bedrock.url).count_tokens(
        modelId=MODEL, input={"invokeModel": {"body": json.dumps(BODY).encode()}}
    )
    assert counted["inputTokens"] > 0
    profiles = _client(bedrock.url, "bedrock").list_inference_profiles(typeEquals="SYSTEM_DEFINED")
    ids = [p["inferenceProfileId"] for p in profiles["inferenceProfileSummaries"]]
    assert MODEL in ids


def test_the_anthropic_sdks_bedrock_client_signs_and_streams(bedrock: RunningStandIn) -> None:
    client = anthropic.AnthropicBedrock(
        aws_access_key=TEST_CREDENTIALS.access_key,
        aws_secret_key=TEST_CREDENTIALS.secret_key,
        aws_session_token=TEST_CREDENTIALS.token,
        aws_region="us-east-1",
        base_url=bedrock.url,
        max_retries=0,
    )
    ask = {"model": MODEL, "max_tokens": 200, "messages": BODY["messages"]}
    message = client.messages.create(**ask)
    with client.messages.stream(**ask) as stream:
        streamed = stream.get_final_message()
    assert streamed.content[0].text == message.content[0].text  # type: ignore[union-attr]
    assert ":0/invoke" in bedrock.recorded[0].path_qs  # its `:` unencoded, signed as sent


def test_a_bedrock_api_key_is_accepted(bedrock: RunningStandIn) -> None:
    client = anthropic.AnthropicBedrock(
        api_key=TEST_BEDROCK_KEY, aws_region="us-east-1", base_url=bedrock.url, max_retries=0
    )
    message = client.messages.create(model=MODEL, max_tokens=50, messages=BODY["messages"])
    assert message.stop_reason == "end_turn"


def _refused(call: Any) -> tuple[str, str]:
    with pytest.raises(botocore.exceptions.ClientError) as raised:
        call()
    error = raised.value.response["Error"]
    return error["Code"], error["Message"]


def test_what_bedrock_refuses(bedrock: RunningStandIn) -> None:
    client = _client(bedrock.url)
    invoke = client.invoke_model
    assert (
        _refused(lambda: invoke(modelId="anthropic.claude-nope-v1:0", body=json.dumps(BODY)))[0]
        == "ValidationException"
    )
    code, message = _refused(lambda: invoke(modelId=MODEL, body=json.dumps({**BODY, "model": "x"})))
    assert code == "ValidationException" and "extraneous key [model]" in message
    old = {**BODY, "anthropic_version": "vertex-2023-10-16"}
    assert "anthropic_version" in _refused(lambda: invoke(modelId=MODEL, body=json.dumps(old)))[1]
    empty = {**BODY, "messages": [{"role": "user", "content": ""}]}
    assert (
        _refused(lambda: invoke(modelId=MODEL, body=json.dumps(empty)))[0] == "ValidationException"
    )
    wrong = _client(bedrock.url, aws_secret_access_key="not-the-secret")
    code, message = _refused(lambda: wrong.invoke_model(modelId=MODEL, body=json.dumps(BODY)))
    assert code == "InvalidSignatureException" and "signature" in message
    stranger = _client(bedrock.url, aws_access_key_id="AKIAOTHER")
    refused = _refused(lambda: stranger.invoke_model(modelId=MODEL, body=json.dumps(BODY)))
    assert refused[0] == "UnrecognizedClientException"
    elsewhere = boto3.client(
        "bedrock-runtime",
        region_name="eu-west-1",
        endpoint_url=bedrock.url,
        aws_access_key_id=TEST_CREDENTIALS.access_key,
        aws_secret_access_key=TEST_CREDENTIALS.secret_key,
        aws_session_token=TEST_CREDENTIALS.token,
    )
    assert (
        "scoped"
        in _refused(lambda: elsewhere.invoke_model(modelId=MODEL, body=json.dumps(BODY)))[1]
    )


def test_a_broken_stream_is_a_model_stream_error(bedrock: RunningStandIn) -> None:
    client = _client(bedrock.url)
    client.meta.events.register(
        "before-sign.bedrock-runtime.*",
        lambda request, **_: request.headers.__setitem__(
            "x-stand-in", json.dumps({"fault": "stream_error"})
        ),
    )
    streamed = client.invoke_model_with_response_stream(modelId=MODEL, body=json.dumps(BODY))
    with pytest.raises(botocore.exceptions.EventStreamError) as raised:
        list(streamed["body"])
    assert raised.value.response["Error"]["Code"] == "modelStreamErrorException"


def test_a_model_set_to_refuse_deferral_refuses_a_deferred_tool_in_bedrocks_shape(
    make_standin_thread: Any,
) -> None:
    """StandInOptions.refuses_deferral: as an API or a model without tool search, a
    request that defers a tool is refused (400, ValidationException, naming the field);
    the same request with the tool listed is answered, and other models take it."""
    standin = make_standin_thread(StandInOptions(refuses_deferral=("claude-sonnet-4-5*",)))
    client = _client(standin.url)
    schema = {"type": "object", "properties": {"url": {"type": "string"}}}
    tool = {"name": "Fetch", "description": "Fetch a URL.", "input_schema": schema}
    deferred = {**BODY, "tools": [{**tool, "defer_loading": True}]}
    with pytest.raises(botocore.exceptions.ClientError) as refused:
        client.invoke_model(modelId=MODEL, body=json.dumps(deferred))
    error = refused.value.response["Error"]
    assert error["Code"] == "ValidationException"
    assert error["Message"] == "tools.0.custom.defer_loading: Extra inputs are not permitted"
    listed = client.invoke_model(modelId=MODEL, body=json.dumps({**BODY, "tools": [tool]}))
    assert json.loads(listed["body"].read())["type"] == "message"
    other = "us.anthropic.claude-opus-4-5-20251101-v1:0"
    taken = client.invoke_model(modelId=other, body=json.dumps(deferred))
    assert json.loads(taken["body"].read())["type"] == "message"
