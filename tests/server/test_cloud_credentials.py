"""A Bedrock or Vertex upstream without the proxy's own credential: configured for it,
the proxy does not start, and says what to set; not configured, the first such request
is refused in the provider's shape, saying what to set, and nothing is sent."""

from __future__ import annotations

from pathlib import Path

import aiohttp
import pytest

from proxy.server.app import StartupError, startup_line
from tests.server.conftest import MakeProxy

BEDROCK_PATH = "/bedrock/model/us.anthropic.claude-sonnet-4-5-20250929-v1:0/invoke"
VERTEX_PATH = (
    "/vertex/v1/projects/p/locations/us-east5/publishers/anthropic/models/"
    "claude-sonnet-4-5@20250929:rawPredict"
)
BODY = {"anthropic_version": "bedrock-2023-05-31", "max_tokens": 10, "messages": []}
NOWHERE = "http://127.0.0.1:9"  # nothing may be sent: the discard port, refused


@pytest.fixture
def no_credentials(aws_env: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """No AWS credentials anywhere, and a Google credentials file that does not exist."""
    monkeypatch.setenv("AWS_REGION", "us-east-1")
    monkeypatch.setenv("GOOGLE_APPLICATION_CREDENTIALS", str(aws_env / "missing-sa.json"))


@pytest.mark.usefixtures("no_credentials")
@pytest.mark.parametrize(
    ("setting", "named"),
    [
        ("upstream.bedrock_url", "AWS_BEARER_TOKEN_BEDROCK"),
        ("upstream.vertex_url", "GOOGLE_APPLICATION_CREDENTIALS"),
    ],
)
async def test_configured_without_a_credential_the_proxy_does_not_start(
    make_proxy: MakeProxy, setting: str, named: str
) -> None:
    with pytest.raises(StartupError, match=named):
        await make_proxy(NOWHERE, **{setting: NOWHERE})


@pytest.mark.usefixtures("no_credentials")
async def test_not_configured_the_first_request_is_refused_saying_what_to_set(
    make_proxy: MakeProxy,
) -> None:
    proxy = await make_proxy(NOWHERE)  # starts: neither cloud is configured
    line = startup_line(proxy)
    assert (
        "bedrock upstream https://bedrock-runtime.us-east-1.amazonaws.com (its credential" in line
    )
    assert "vertex upstream each location's endpoint (its credential looked for" in line
    async with aiohttp.ClientSession() as session:
        async with session.post(proxy.url + BEDROCK_PATH, json=BODY) as response:
            assert response.status == 503
            assert response.headers["x-amzn-ErrorType"] == "ServiceUnavailableException"
            message = (await response.json())["message"]
            assert "cannot call Bedrock" in message and "AWS_BEARER_TOKEN_BEDROCK" in message
        vertex = {**BODY, "anthropic_version": "vertex-2023-10-16"}
        async with session.post(proxy.url + VERTEX_PATH, json=vertex) as response:
            assert response.status == 503
            error = (await response.json())["error"]
            assert error["status"] == "UNAVAILABLE"
            assert "GOOGLE_APPLICATION_CREDENTIALS" in error["message"]
