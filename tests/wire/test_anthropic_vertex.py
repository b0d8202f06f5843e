"""Vertex's envelope: the paths the anthropic SDK's AnthropicVertex writes, the body it
sends, and Google's error shape as that SDK reads it."""

from __future__ import annotations

import anthropic
import httpx2
import orjson
import pytest

from proxy.core.commands import GetSummary
from proxy.core.errors import BudgetRefused
from proxy.wire.anthropic_vertex import (
    ANTHROPIC_VERSION,
    VERTEX,
    VERTEX_ENVELOPE,
    VertexTarget,
    envelope_problem,
    google_error,
    host_for,
    vertex_target,
)

BASE = "/v1/projects/p-1/locations/us-east5/publishers/anthropic/models"


def test_the_sdks_paths_are_read() -> None:
    assert vertex_target(f"{BASE}/claude-sonnet-4-5@20250929:streamRawPredict") == VertexTarget(
        "p-1", "us-east5", "claude-sonnet-4-5@20250929", "streamRawPredict"
    )
    plain = vertex_target(f"{BASE}/claude-haiku-4-5%4020251001:rawPredict")
    assert plain is not None and plain.model == "claude-haiku-4-5@20251001" and not plain.streams
    counting = vertex_target(f"{BASE}/count-tokens:rawPredict")
    assert counting is not None and counting.counts_tokens
    for other in (
        f"{BASE}/count-tokens:streamRawPredict",
        f"{BASE}/claude-x:predict",
        "/v1/projects/p/locations/l/publishers/google/models/gemini:rawPredict",
        f"{BASE}/claude-x:rawPredict/more",
    ):
        assert vertex_target(other) is None


@pytest.mark.parametrize(
    ("location", "host"),
    [
        ("us-east5", "https://us-east5-aiplatform.googleapis.com"),
        ("global", "https://aiplatform.googleapis.com"),
        ("eu", "https://aiplatform.eu.rep.googleapis.com"),
    ],
)
def test_a_locations_host(location: str, host: str) -> None:
    assert host_for(location) == host


def test_the_envelope_is_checked() -> None:
    target = VertexTarget("p", "l", "claude-sonnet-4-5@20250929", "rawPredict")
    counting = VertexTarget("p", "l", "count-tokens", "rawPredict")
    good = {"anthropic_version": ANTHROPIC_VERSION, "max_tokens": 1, "messages": []}
    assert envelope_problem(good, target) is None
    assert "model" in (envelope_problem({**good, "model": "m"}, target) or "")
    assert envelope_problem({**good, "model": "claude-sonnet-4-5@20250929"}, counting) is None
    assert "model" in (envelope_problem(good, counting) or "")
    assert "missing" in (envelope_problem({"messages": []}, target) or "")
    assert envelope_problem({**good, "anthropic_version": "2026-10-21"}, target) is None
    wrong = {**good, "anthropic_version": "bedrock-2023-05-31"}
    assert "invalid" in (envelope_problem(wrong, target) or "")


def test_google_errors_are_read_by_the_anthropic_sdk() -> None:
    body = google_error(429, "Quota exceeded for tokens per minute.")
    assert orjson.loads(body) == {
        "error": {
            "code": 429,
            "message": "Quota exceeded for tokens per minute.",
            "status": "RESOURCE_EXHAUSTED",
        }
    }

    def answer(request: httpx2.Request) -> httpx2.Response:
        return httpx2.Response(429, content=body, headers={"content-type": "application/json"})

    client = anthropic.AnthropicVertex(
        region="us-east5",
        project_id="p-1",
        access_token="token",
        max_retries=0,
        http_client=httpx2.Client(transport=httpx2.MockTransport(answer)),
    )
    with pytest.raises(anthropic.RateLimitError, match="Quota exceeded"):
        client.messages.create(model="claude-sonnet-4-5@20250929", max_tokens=1, messages=[])


# -- the envelope as the exchange reads it ----------------------------------------------

PREDICT = (
    "/vertex/v1/projects/p/locations/us-east5/publishers/anthropic/models/"
    "claude-sonnet-4-5@20250929:streamRawPredict"
)


def test_the_exchange_reads_model_betas_and_stream_from_the_envelope() -> None:
    body = {"anthropic_version": ANTHROPIC_VERSION, "stream": True}
    assert VERTEX_ENVELOPE.model(PREDICT, body) == "claude-sonnet-4-5@20250929"
    assert VERTEX_ENVELOPE.stream(PREDICT, body)
    assert not VERTEX_ENVELOPE.stream(PREDICT.replace("streamRawPredict", "rawPredict"), body)
    counting = PREDICT.replace(
        "claude-sonnet-4-5@20250929:streamRawPredict", "count-tokens:rawPredict"
    )
    assert VERTEX_ENVELOPE.model(counting, {"model": "claude-haiku-4-5@20251001"}) == (
        "claude-haiku-4-5@20251001"
    )
    assert VERTEX_ENVELOPE.betas({"anthropic-beta": "a,b"}, body) == "a,b"


def test_a_summary_is_a_raw_predict_in_the_requests_project_and_location() -> None:
    transcript = {"model": "m", "max_tokens": 10, "messages": []}
    path, sent = VERTEX_ENVELOPE.summary(PREDICT, GetSummary("k", transcript, 10, ""))
    assert path == (
        "/v1/projects/p/locations/us-east5/publishers/anthropic/models/"
        "claude-sonnet-4-5@20250929:rawPredict"
    )
    assert sent.body == {"max_tokens": 10, "messages": [], "anthropic_version": ANTHROPIC_VERSION}


def test_the_proxys_own_errors_in_googles_shape() -> None:
    body = orjson.loads(VERTEX.error_body(BudgetRefused("over budget"), "req"))
    assert body == {
        "error": {"code": 429, "message": "over budget", "status": "RESOURCE_EXHAUSTED"}
    }
