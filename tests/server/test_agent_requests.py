"""Recorded agent requests reach the upstream byte for byte, headers included."""

from __future__ import annotations

import gzip
import json
from pathlib import Path

import pytest

from tests.plugins.standin import RunningStandIn
from tests.server.conftest import MakeProxy
from tests.server.rawhttp import send

# The Messages requests (Claude Code); the Codex ones (Responses) get their own test once
# the proxy reads /v1/responses (issue 15).
AGENT_REQUESTS = sorted(
    (Path(__file__).parents[1] / "fixtures" / "agent-requests").glob("claude-code-*.json")
)
HOP_BY_HOP = {"connection", "keep-alive", "host", "content-length", "te", "trailer", "upgrade"}
NOT_FORWARDED = HOP_BY_HOP | {"x-hop", "proxy-authorization", "expect"}


@pytest.mark.parametrize("path", AGENT_REQUESTS, ids=lambda p: p.stem)
@pytest.mark.parametrize("layout", ["compact", "indented"])
async def test_agent_request_reaches_upstream_unchanged(
    path: Path, layout: str, standin: RunningStandIn, make_proxy: MakeProxy
) -> None:
    recorded = json.loads(path.read_bytes())  # noqa: ASYNC240 (a small local file)
    # An unusual but valid serialisation: a proxy that re-encoded would change it.
    if layout == "indented":
        body = json.dumps(recorded["body"], indent=1, ensure_ascii=False).encode()
    else:
        body = json.dumps(recorded["body"], separators=(",", ":")).encode()
    headers = list(recorded["headers"].items())
    headers += [
        ("x-api-key", "sk-ant-test"),
        ("Host", "proxy.local"),
        ("Content-Length", str(len(body))),
        ("Connection", "keep-alive, X-Hop"),
        ("X-Hop", "only for the proxy"),
        ("Proxy-Authorization", "Basic cHJveHk="),
        ("TE", "trailers"),
        ("Expect", "100-continue"),
    ]
    proxy = await make_proxy(standin.url)

    response = await send(proxy.url, recorded["method"], recorded["path"], headers, body)

    assert response.status == 200, response.body
    seen = standin.recorded[-1]
    assert seen.body == body
    assert seen.path_qs == recorded["path"]
    expected = [(k, v) for k, v in headers if k.lower() not in NOT_FORWARDED]
    forwarded = [(k, v) for k, v in seen.headers.items() if k.lower() not in HOP_BY_HOP]
    assert forwarded == expected
    assert seen.headers["Host"] == standin.url.removeprefix("http://")
    assert seen.headers["Content-Length"] == str(len(body))
    assert response.header("request-id") is not None


async def test_a_compressed_request_is_forwarded_as_sent(
    standin: RunningStandIn, make_proxy: MakeProxy
) -> None:
    recorded = json.loads(AGENT_REQUESTS[0].read_bytes())
    body = gzip.compress(json.dumps(recorded["body"]).encode())
    headers = [*recorded["headers"].items(), ("x-api-key", "k"), ("Content-Encoding", "gzip")]
    proxy = await make_proxy(standin.url)
    response = await send(proxy.url, "POST", recorded["path"], headers, body)
    assert response.status == 200, response.body
    # The stand-in (aiohttp) decompresses what it receives: the proxy sent the gzip bytes.
    assert standin.recorded[-1].body == gzip.decompress(body)
    assert standin.recorded[-1].headers["Content-Encoding"] == "gzip"
    assert standin.recorded[-1].headers["Content-Length"] == str(len(body))
