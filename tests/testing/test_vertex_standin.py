"""The Vertex stand-in through the anthropic SDK's AnthropicVertex, its access token from
google-auth's real exchange with the stand-in's token endpoint (a service-account file
whose token_uri names it); what Vertex refuses, in Google's shape or the model's."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import anthropic
import httpx2
import pytest
from google.oauth2 import service_account

from proxy.testing.google_oauth import PROJECT, TOKEN_PATH, write_service_account
from proxy.testing.standin import StandInOptions
from tests.plugins.standin import RunningStandIn

MODEL = "claude-sonnet-4-5@20250929"
SCOPE = "https://www.googleapis.com/auth/cloud-platform"
ASK: dict[str, Any] = {
    "model": MODEL,
    "max_tokens": 200,
    "messages": [{"role": "user", "content": "What does src/app.py do?"}],
}


@pytest.fixture
def vertex(make_standin_thread: Any) -> Iterator[RunningStandIn]:
    yield make_standin_thread(StandInOptions())


def _client(standin: RunningStandIn, tmp_path: Path, **options: Any) -> anthropic.AnthropicVertex:
    key = write_service_account(tmp_path / "sa.json", standin.url + TOKEN_PATH)
    credentials = service_account.Credentials.from_service_account_file(  # type: ignore[no-untyped-call]
        str(key), scopes=[SCOPE]
    )
    return anthropic.AnthropicVertex(
        region="us-east5",
        project_id=PROJECT,
        base_url=standin.url + "/v1",
        max_retries=0,
        **({"credentials": credentials} | options),
    )


def test_the_anthropic_sdks_vertex_client_with_a_service_accounts_token(
    vertex: RunningStandIn, tmp_path: Path
) -> None:
    client = _client(vertex, tmp_path)
    message = client.messages.create(**ASK)
    assert message.model == "claude-sonnet-4-5-20250929" and message.stop_reason == "end_turn"
    with client.messages.stream(**ASK) as stream:
        streamed = stream.get_final_message()
    assert streamed.content[0].text == message.content[0].text  # type: ignore[union-attr]
    counted = client.messages.count_tokens(model=MODEL, messages=ASK["messages"])
    assert counted.input_tokens == message.usage.input_tokens
    paths = [r.path_qs for r in vertex.recorded]
    assert paths[0] == TOKEN_PATH  # google-auth's exchange, then the calls
    assert paths[1:] == [
        f"/v1/projects/{PROJECT}/locations/us-east5/publishers/anthropic/models/{m}"
        for m in (f"{MODEL}:rawPredict", f"{MODEL}:streamRawPredict", "count-tokens:rawPredict")
    ]


def test_what_vertex_refuses(vertex: RunningStandIn, tmp_path: Path) -> None:
    stranger = _client(vertex, tmp_path, credentials=None, access_token="ya29.not-issued")
    with pytest.raises(anthropic.AuthenticationError) as raised:
        stranger.messages.create(**ASK)
    body = raised.value.body
    assert isinstance(body, dict) and body["error"]["status"] == "UNAUTHENTICATED"
    client = _client(vertex, tmp_path)
    with pytest.raises(anthropic.NotFoundError, match="Publisher Model"):
        client.messages.create(**{**ASK, "model": "claude-nope@20990101"})
    with pytest.raises(anthropic.BadRequestError, match="must have non-empty content"):
        client.messages.create(**{**ASK, "messages": [{"role": "user", "content": ""}]})
    token = client._ensure_access_token()
    url = f"{vertex.url}/v1/projects/{PROJECT}/locations/us-east5/publishers/anthropic/models"
    headers = {"Authorization": f"Bearer {token}"}
    body = {"anthropic_version": "vertex-2023-10-16", **ASK}
    answer = httpx2.post(f"{url}/{MODEL}:rawPredict", json=body, headers=headers)
    assert answer.status_code == 400 and "model" in answer.json()["error"]["message"]
    body = {k: v for k, v in body.items() if k not in ("model", "anthropic_version")}
    answer = httpx2.post(f"{url}/{MODEL}:rawPredict", json=body, headers=headers)
    assert answer.status_code == 400 and "anthropic_version" in json.dumps(answer.json())
