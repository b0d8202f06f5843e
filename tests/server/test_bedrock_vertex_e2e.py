"""Claude through Bedrock and Vertex AI, end to end: the anthropic SDK's AnthropicBedrock
and AnthropicVertex (unmodified) and boto3's bedrock-runtime -> a real serve (real Redis,
a small window) -> the strict stand-ins, which verify every request's SigV4 signature
(recomputed with botocore) or access token (issued by their own OAuth endpoint).

A long tool-using conversation is compacted in each mode (offload, read_result rounds
merged into the client's answer, summaries through the same provider and model), whole
and streamed; the event streams the clients receive are decoded here, so a frame with a
bad CRC (which Claude Code would silently fall back from) fails the test.
"""

from __future__ import annotations

import asyncio
import base64
import json
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Any

import anthropic
import boto3
import botocore.exceptions
import httpx2
import orjson
import pytest
from botocore.config import Config

from proxy.core.eventstream import EventStreamDecoder
from proxy.core.tokens import default_counter
from proxy.server.app import RunningProxy, startup_line
from proxy.server.state import COMPACTOR
from proxy.store import Store
from proxy.store.accounts import Accounts, Scope
from proxy.testing.agent import run_agent
from proxy.testing.aws_sigv4 import TEST_CREDENTIALS
from proxy.testing.google_oauth import PROJECT, TOKEN_PATH, write_service_account
from proxy.testing.standin import RecordedRequest, StandInOptions
from tests.server.conftest import SMALL_WINDOW, MakeProxy

BEDROCK_MODEL = "us.anthropic.claude-sonnet-4-5-20250929-v1:0"
VERTEX_MODEL = "claude-sonnet-4-5@20250929"
REGION = "us-east5"
PURPOSE = "x-compaction-proxy-purpose"
TURNS = 24
RESULT_CHARS = 8_000
ASK: dict[str, Any] = {
    "anthropic_version": "bedrock-2023-05-31",
    "max_tokens": 200,
    "messages": [{"role": "user", "content": "What does src/app.py do?"}],
}

MakeStandIn = Callable[[StandInOptions], Awaitable[Any]]


async def _serve(
    make_standin: MakeStandIn, make_compacting_proxy: MakeProxy, key: Path, **settings: Any
) -> tuple[Any, RunningProxy]:
    standin = await make_standin(StandInOptions(windows={"*": SMALL_WINDOW}, max_recorded=None))
    write_service_account(key, standin.url + TOKEN_PATH)
    proxy = await make_compacting_proxy(
        standin.url,
        **{"upstream.bedrock_url": standin.url, "upstream.vertex_url": standin.url, **settings},
    )
    return standin, proxy


class StreamTee(httpx2.AsyncBaseTransport):
    """The SDK's own transport, keeping the bytes of every event stream it receives, and
    every whole answer with its headers."""

    def __init__(self) -> None:
        self.inner = httpx2.AsyncHTTPTransport()
        self.streams: list[bytearray] = []
        self.wholes: list[tuple[httpx2.Headers, bytes]] = []

    async def handle_async_request(self, request: httpx2.Request) -> httpx2.Response:
        response = await self.inner.handle_async_request(request)
        if request.url.path.endswith("/invoke"):  # a whole answer: kept with its headers
            body = await response.aread()
            self.wholes.append((response.headers, body))
            return httpx2.Response(response.status_code, headers=response.headers, content=body)
        if not request.url.path.endswith("/invoke-with-response-stream"):
            return response
        kept = bytearray()
        self.streams.append(kept)
        return httpx2.Response(
            response.status_code,
            headers=response.headers,
            stream=_Kept(response.stream, kept),  # type: ignore[arg-type]
            extensions=response.extensions,
        )


class _Kept(httpx2.AsyncByteStream):
    def __init__(self, inner: Any, kept: bytearray) -> None:
        self.inner, self.kept = inner, kept

    async def __aiter__(self) -> AsyncIterator[bytes]:
        async for chunk in self.inner:
            self.kept += chunk
            yield chunk

    async def aclose(self) -> None:
        await self.inner.aclose()


def bedrock_client(
    proxy: RunningProxy, tee: StreamTee | None = None
) -> anthropic.AsyncAnthropicBedrock:
    """The SDK signing with credentials of its own (the proxy re-signs what it sends)."""
    return anthropic.AsyncAnthropicBedrock(
        aws_access_key="AKIACLIENTOWN0000001",
        aws_secret_key="the-clients-own-secret",
        aws_region="us-east-1",
        base_url=proxy.url + "/bedrock",
        max_retries=0,
        http_client=httpx2.AsyncClient(transport=tee) if tee is not None else None,
    )


def vertex_client(proxy: RunningProxy) -> anthropic.AsyncAnthropicVertex:
    return anthropic.AsyncAnthropicVertex(
        region=REGION,
        project_id=PROJECT,
        access_token="ya29.the-clients-own-token",
        base_url=proxy.url + "/vertex/v1",
        max_retries=0,
    )


def _model_calls(recorded: list[RecordedRequest]) -> list[RecordedRequest]:
    return [r for r in recorded if r.path_qs != TOKEN_PATH]


async def _session(proxy: RunningProxy, client: Any, model: str, stream: bool) -> list[Any]:
    """The scripted agent's long session through the SDK's client (its summaries, made
    ahead in the background too, settled before it returns)."""
    turns = await run_agent(
        client,
        turns=TURNS,
        result_chars=RESULT_CHARS,
        model=model,
        stream=stream,
        read_every=4,
        conversation=f"{model}-{uuid.uuid4().hex}",
    )
    await proxy.app[COMPACTOR].settled()
    return turns


def _assert_compacted(standin: Any, turns: list[Any], path_part: str) -> None:
    calls = _model_calls(standin.recorded)
    # Every upstream request was authorised and valid (the stand-in refuses otherwise)
    # and fits the window.
    assert {r.outcome for r in calls} == {"complete"}
    assert all(path_part in r.path_qs for r in calls)
    counter = default_counter()
    for r in calls:
        body = orjson.loads(r.body)
        assert "model" not in body and "anthropic_version" in body
        assert counter.count_request({**body, "model": "x"}) <= SMALL_WINDOW
    strategies = {t.headers.get("x-compaction-strategy") for t in turns}
    assert "offload" in strategies, strategies
    assert any(s and "summary" in s for s in strategies), strategies
    # read_result rounds were answered by the proxy, never seen by the SDK.
    assert [r for r in calls if b"characters 0 to" in r.body]
    for t in turns:
        assert all(b.type != "tool_use" or b.name != "read_result" for b in t.message.content)
        assert t.message.stop_reason == "tool_use"
    summaries = [r for r in calls if r.headers.get(PURPOSE) == "summary"]
    assert summaries, "summaries went through the same provider"


@pytest.mark.parametrize("stream", [False, True], ids=["whole", "stream"])
async def test_anthropic_bedrock_through_the_proxy_is_compacted(
    make_standin: MakeStandIn,
    make_compacting_proxy: MakeProxy,
    cloud_credentials: Path,
    stream: bool,
) -> None:
    standin, proxy = await _serve(make_standin, make_compacting_proxy, cloud_credentials)
    tee = StreamTee()
    turns = await _session(proxy, bedrock_client(proxy, tee), BEDROCK_MODEL, stream)
    _assert_compacted(standin, turns, "/model/us.anthropic.claude-sonnet-4-5-20250929-v1%3A0/")
    # Signed by the proxy, over the path as botocore writes it; none of the client's
    # own signing headers went on.
    for r in _model_calls(standin.recorded):
        assert TEST_CREDENTIALS.access_key in r.headers["Authorization"]
        amz = {k.lower() for k in r.headers if k.lower().startswith("x-amz-")}
        assert amz == {"x-amz-date", "x-amz-security-token"}
    # Every event stream the client got decodes (CRCs, boundaries); merged ones carry
    # the usage the client was told as their invocation metrics.
    assert len(tee.streams) == (TURNS if stream else 0)
    for raw, turn in zip(tee.streams, turns, strict=False):
        events = decoded_stream(bytes(raw))
        metrics = events[-1]["amazon-bedrock-invocationMetrics"]
        usage = turn.message.usage
        assert metrics["outputTokenCount"] == usage.output_tokens
        assert metrics["inputTokenCount"] == usage.input_tokens
        assert metrics["cacheReadInputTokenCount"] == usage.cache_read_input_tokens
    # Every whole answer's invocation metric headers are its usage's, merged ones too.
    assert len(tee.wholes) == (0 if stream else TURNS)
    merged = 0
    for headers, body in tee.wholes:
        usage = orjson.loads(body)["usage"]
        merged += "x-compaction-read-rounds" in headers
        assert headers["x-amzn-bedrock-input-token-count"] == str(usage["input_tokens"])
        assert headers["x-amzn-bedrock-output-token-count"] == str(usage["output_tokens"])
        cached = headers["x-amzn-bedrock-cache-read-input-token-count"]
        assert cached == str(usage["cache_read_input_tokens"])
    assert merged or stream, "no whole answer was merged from read rounds"


@pytest.mark.parametrize("stream", [False, True], ids=["whole", "stream"])
async def test_anthropic_vertex_through_the_proxy_is_compacted(
    make_standin: MakeStandIn,
    make_compacting_proxy: MakeProxy,
    cloud_credentials: Path,
    stream: bool,
) -> None:
    standin, proxy = await _serve(make_standin, make_compacting_proxy, cloud_credentials)
    turns = await _session(proxy, vertex_client(proxy), VERTEX_MODEL, stream)
    prefix = f"/v1/projects/{PROJECT}/locations/{REGION}/publishers/anthropic/models/"
    _assert_compacted(standin, turns, prefix + VERTEX_MODEL)
    for r in _model_calls(standin.recorded):
        assert r.headers["Authorization"] != "Bearer ya29.the-clients-own-token"


# -- boto3, and the event stream's bytes -----------------------------------------------


def _boto3(proxy: RunningProxy, service: str = "bedrock-runtime") -> Any:
    """boto3 signing with AWS credentials of its own (the proxy signs what it sends)."""
    return boto3.client(
        service,
        region_name="us-east-1",
        endpoint_url=proxy.url + "/bedrock",
        aws_access_key_id="AKIACLIENTOWN0000001",
        aws_secret_access_key="the-clients-own-secret",
        config=Config(retries={"total_max_attempts": 1}),
    )


def decoded_stream(raw: bytes) -> list[dict[str, Any]]:
    """The Anthropic events of an event stream's bytes, every CRC checked (botocore's
    parser raises on a bad one), the stream ending on a message boundary."""
    decoder = EventStreamDecoder()
    messages = decoder.feed(raw)
    assert not decoder.pending, "the stream ended inside a message"
    events = []
    for message in messages:
        assert message.header(":message-type") == "event", message.headers
        payload = orjson.loads(message.payload)
        events.append(orjson.loads(base64.b64decode(payload["bytes"])))
    return events


async def test_boto3_invoke_stream_and_count_tokens(
    make_standin: MakeStandIn, make_compacting_proxy: MakeProxy, cloud_credentials: Path
) -> None:
    standin, proxy = await _serve(make_standin, make_compacting_proxy, cloud_credentials)
    line = startup_line(proxy)  # configured: the credentials were found at start-up
    assert f"bedrock upstream {standin.url} (signed with AWS credentials (env), SigV4)" in line
    assert f"vertex upstream {standin.url} (authorised with Google" in line
    client = _boto3(proxy)
    body = json.dumps(ASK)
    # boto3 blocks: in a thread, so the proxy and the stand-in (this loop) answer it.
    whole = await asyncio.to_thread(client.invoke_model, modelId=BEDROCK_MODEL, body=body)
    message = json.loads(whole["body"].read())
    assert message["type"] == "message"
    headers = whole["ResponseMetadata"]["HTTPHeaders"]
    assert headers["x-amzn-bedrock-input-token-count"] == str(message["usage"]["input_tokens"])
    streamed = await asyncio.to_thread(
        client.invoke_model_with_response_stream, modelId=BEDROCK_MODEL, body=body
    )
    parts = await asyncio.to_thread(list, streamed["body"])
    events = [json.loads(part["chunk"]["bytes"]) for part in parts]
    assert events[-1]["type"] == "message_stop"
    metrics = events[-1]["amazon-bedrock-invocationMetrics"]
    assert metrics["outputTokenCount"] == message["usage"]["output_tokens"]
    counted = await asyncio.to_thread(
        client.count_tokens, modelId=BEDROCK_MODEL, input={"invokeModel": {"body": body.encode()}}
    )
    assert counted["inputTokens"] > 0
    # The control plane's read Claude Code makes, forwarded signed.
    control = _boto3(proxy, "bedrock")
    profiles = await asyncio.to_thread(control.list_inference_profiles, typeEquals="SYSTEM_DEFINED")
    ids = [p["inferenceProfileId"] for p in profiles["inferenceProfileSummaries"]]
    assert BEDROCK_MODEL in ids
    calls = _model_calls(standin.recorded)
    assert {r.outcome for r in calls} == {"complete"}
    assert all(TEST_CREDENTIALS.access_key in r.headers["Authorization"] for r in calls)
    # The AnthropicVertex SDK's token count, forwarded.
    vertex = vertex_client(proxy)
    count = await vertex.messages.count_tokens(model=VERTEX_MODEL, messages=ASK["messages"])
    assert count.input_tokens == message["usage"]["input_tokens"]


@pytest.mark.parametrize(
    ("script", "exception"),
    [
        ('{"fault": "stream_error"}', "modelStreamErrorException"),  # the upstream's own
        ('{"fault": "stall", "stall_seconds": 5}', "modelTimeoutException"),  # the proxy's
    ],
)
async def test_a_broken_stream_ends_with_bedrocks_exception(
    make_standin: MakeStandIn,
    make_compacting_proxy: MakeProxy,
    cloud_credentials: Path,
    script: str,
    exception: str,
) -> None:
    """The upstream's exception passes through; an upstream gone silent mid-stream is
    ended by the proxy with its own exception message, both as boto3 raises them."""
    _, proxy = await _serve(
        make_standin, make_compacting_proxy, cloud_credentials,
        **{"upstream.stream_idle_timeout": 1.0},
    )  # fmt: skip
    client = _boto3(proxy)
    client.meta.events.register(
        "before-sign.bedrock-runtime.*",
        lambda request, **_: request.headers.__setitem__("x-stand-in", script),
    )
    streamed = await asyncio.to_thread(
        client.invoke_model_with_response_stream, modelId=BEDROCK_MODEL, body=json.dumps(ASK)
    )
    with pytest.raises(botocore.exceptions.EventStreamError) as broken:
        await asyncio.to_thread(list, streamed["body"])
    assert broken.value.response["Error"]["Code"] == exception


async def test_bedrock_refusals_are_in_bedrocks_shape(
    make_standin: MakeStandIn, make_compacting_proxy: MakeProxy, cloud_credentials: Path
) -> None:
    standin, proxy = await _serve(make_standin, make_compacting_proxy, cloud_credentials)
    client = _boto3(proxy)
    with pytest.raises(botocore.exceptions.ClientError) as refused:
        body = json.dumps({**ASK, "model": "x"})
        await asyncio.to_thread(client.invoke_model, modelId=BEDROCK_MODEL, body=body)
    assert refused.value.response["Error"]["Code"] == "ValidationException"
    assert "extraneous key [model]" in refused.value.response["Error"]["Message"]
    assert _model_calls(standin.recorded) == [], "the proxy's own refusal: nothing was sent"


# -- proxy keys and budgets ------------------------------------------------------------


async def _settled(accounts: Accounts, scope: Scope, below: int) -> None:
    """Waits until the scope's day output (used and still reserved) is under `below`."""
    for _ in range(300):
        if (await accounts.usage(scope, time.time()))["day"]["output"] < below:
            return
        await asyncio.sleep(0.05)
    raise AssertionError(f"the reservations were not settled under {below} in 15 s")


async def test_keys_and_budgets_hold_in_both_modes(
    make_standin: MakeStandIn,
    make_proxy: MakeProxy,
    cloud_credentials: Path,
    store: Store,
) -> None:
    """A proxy key is the caller's credential in either mode (a Bedrock API key or an
    access token to the SDKs), never sent on; its budget refuses in the provider's shape.
    The key's own upstream credential variable is unset: the proxy's cloud credential is
    the one used."""
    standin = await make_standin(StandInOptions())
    write_service_account(cloud_credentials, standin.url + TOKEN_PATH)
    proxy = await make_proxy(
        standin.url,
        **{
            "auth.keys": "required",
            "auth.cache_seconds": 0.0,
            "store.key_prefix": store.prefix,
            "upstream.bedrock_url": standin.url,
            "upstream.vertex_url": standin.url,
        },
    )
    accounts = Accounts(store)
    key, record = await accounts.create_key(
        team="cloud", upstream_env="CP_TEST_UNSET_UPSTREAM", upstream_scheme="x-api-key",
        provider="anthropic",
    )  # fmt: skip
    await accounts.set_conf(Scope("key", record["id"]), {"day:output": 450})
    bedrock = anthropic.AsyncAnthropicBedrock(
        api_key=key, aws_region="us-east-1", base_url=proxy.url + "/bedrock", max_retries=0
    )
    vertex = anthropic.AsyncAnthropicVertex(
        region=REGION, project_id=PROJECT, access_token=key,
        base_url=proxy.url + "/vertex/v1", max_retries=0,
    )  # fmt: skip
    ask = {"max_tokens": 200, "messages": ASK["messages"]}
    await bedrock.messages.create(model=BEDROCK_MODEL, **ask)
    await vertex.messages.create(model=VERTEX_MODEL, **ask)
    # Each answer's reservation (its max_tokens, 200) is settled to what it used a moment
    # after it ends (settlements are batched: fleet.settle_later); under load that moment
    # can outlast the calls below, whose last one fits only once both have landed.
    await _settled(accounts, Scope("key", record["id"]), below=200)
    calls = _model_calls(standin.recorded)
    assert len(calls) == 2
    for r in calls:
        assert not any(key in value for value in r.headers.values())
    # Over the budget (its output cap alone): refused before anything is sent.
    with pytest.raises(anthropic.RateLimitError) as throttled:
        await bedrock.messages.create(model=BEDROCK_MODEL, **{**ask, "max_tokens": 500})
    assert throttled.value.response.headers["x-amzn-ErrorType"] == "ThrottlingException"
    assert "whole day budget of 450" in throttled.value.message
    with pytest.raises(anthropic.RateLimitError) as exhausted:
        await vertex.messages.create(model=VERTEX_MODEL, **{**ask, "max_tokens": 500})
    assert exhausted.value.body["error"]["status"] == "RESOURCE_EXHAUSTED"  # type: ignore[index]
    # No key (boto3 signing with AWS credentials of its own): 401 in Bedrock's shape.
    client = _boto3(proxy)
    with pytest.raises(botocore.exceptions.ClientError) as refused:
        body = json.dumps(ASK)
        await asyncio.to_thread(client.invoke_model, modelId=BEDROCK_MODEL, body=body)
    assert refused.value.response["Error"]["Code"] == "UnrecognizedClientException"
    assert len(_model_calls(standin.recorded)) == 2
    # boto3 with the proxy key in a header of its own (botocore sends a Bedrock API key
    # over HTTPS only).
    keyed = _boto3(proxy)

    def with_key(request: Any, **_: Any) -> None:
        request.headers["x-api-key"] = key

    keyed.meta.events.register("before-sign.bedrock-runtime.*", with_key)
    answer = await asyncio.to_thread(keyed.invoke_model, modelId=BEDROCK_MODEL, body=body)
    assert json.loads(answer["body"].read())["type"] == "message"
    assert len(_model_calls(standin.recorded)) == 3
