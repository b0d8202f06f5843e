"""The proxy's Bedrock credential: botocore's real chain (the environment, a profile's
credential process), SigV4 over exactly what is sent (checked by recomputing it as AWS
does), a Bedrock API key, refreshes ahead of expiry off the event loop, and no
credential in any log line."""

from __future__ import annotations

import asyncio
import datetime
import json
import logging
import sys
import time
from pathlib import Path

import pytest
import yarl

from proxy.server.bedrock import signer
from proxy.server.bedrock_auth import (
    BEARER_ENV,
    CLIENT_AUTH,
    BearerAuth,
    SigV4,
    region_of,
    resolve,
    sign,
)
from proxy.server.refresh_ahead import MissingCredential
from proxy.testing.aws_sigv4 import TEST_BEDROCK_KEY, TEST_CREDENTIALS, check_request

URL = "http://127.0.0.1:9/model/us.anthropic.claude-sonnet-4-5-20250929-v1%3A0/invoke"
BODY = b'{"anthropic_version":"bedrock-2023-05-31","max_tokens":1,"messages":[]}'


def _now() -> datetime.datetime:
    return datetime.datetime.now(datetime.UTC)


def test_a_signature_covers_exactly_the_method_path_query_and_bytes_sent() -> None:
    headers = dict(sign("POST", URL, BODY, TEST_CREDENTIALS, "us-east-1"))
    headers["Host"] = "127.0.0.1:9"
    ok = check_request("POST", URL, headers, BODY, region="us-east-1", now=_now())
    assert ok is None
    assert "SignedHeaders=host;x-amz-date;x-amz-security-token," in headers["Authorization"]
    for method, url, body in (
        ("POST", URL, BODY + b" "),
        ("POST", URL.replace("%3A", ":"), BODY),  # the path spelt otherwise
        ("POST", URL + "?x=1", BODY),
        ("PUT", URL, BODY),
    ):
        refused = check_request(method, url, headers, body, region="us-east-1", now=_now())
        assert refused is not None and refused.error == "InvalidSignatureException"
    wrong_region = check_request("POST", URL, headers, BODY, region="eu-west-1", now=_now())
    assert wrong_region is not None and "scoped" in wrong_region.message
    later = _now() + datetime.timedelta(minutes=6)
    expired = check_request("POST", URL, headers, BODY, region="us-east-1", now=later)
    assert expired is not None and "expired" in expired.message


async def test_the_clients_own_signature_never_goes_upstream() -> None:
    client = [
        ("Authorization", "AWS4-HMAC-SHA256 Credential=theirs"),
        ("X-Amz-Date", "20260101T000000Z"),
        ("x-amz-security-token", "theirs"),
        ("Content-Type", "application/json"),
    ]
    # The signer the Bedrock upstreams use: the client's signature out, the proxy's in.
    signs = signer("us-east-1", {BEARER_ENV: "the-proxys-key"})
    sent = await signs.sign("POST", yarl.URL(URL), client, BODY)
    assert sent == [
        ("Content-Type", "application/json"),
        ("Authorization", "Bearer the-proxys-key"),
    ]
    assert {"authorization", "x-amz-security-token"} <= CLIENT_AUTH


def test_the_region_is_the_setting_else_the_environments() -> None:
    assert region_of("eu-west-1", {"AWS_REGION": "us-east-1"}) == "eu-west-1"
    assert region_of("", {"AWS_REGION": "us-east-1", "AWS_DEFAULT_REGION": "x"}) == "us-east-1"
    assert region_of("", {"AWS_DEFAULT_REGION": "us-west-2"}) == "us-west-2"
    assert region_of("", {}) == ""


async def test_environment_credentials_sign(aws_env: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", TEST_CREDENTIALS.access_key)
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", TEST_CREDENTIALS.secret_key)
    monkeypatch.setenv("AWS_SESSION_TOKEN", TEST_CREDENTIALS.token or "")
    auth = await resolve("", {"AWS_REGION": "us-east-1"})
    assert isinstance(auth, SigV4) and auth.region == "us-east-1"
    assert "env" in auth.described and TEST_CREDENTIALS.secret_key not in auth.described
    headers = dict(await auth.headers("POST", URL, BODY))
    headers["Host"] = "127.0.0.1:9"
    assert check_request("POST", URL, headers, BODY, region="us-east-1", now=_now()) is None


async def test_a_bedrock_api_key_is_sent_as_a_bearer_token(aws_env: Path) -> None:
    auth = await resolve("us-west-2", {BEARER_ENV: TEST_BEDROCK_KEY})
    assert isinstance(auth, BearerAuth) and BEARER_ENV in auth.described
    headers = dict(await auth.headers("POST", URL, BODY))
    assert headers == {"Authorization": f"Bearer {TEST_BEDROCK_KEY}"}
    assert check_request("POST", URL, headers, BODY, region="us-west-2", now=_now()) is None


async def test_missing_credentials_or_region_stop_with_what_to_set(aws_env: Path) -> None:
    with pytest.raises(MissingCredential, match=r"AWS_REGION or AWS_DEFAULT_REGION"):
        await resolve("", {})
    with pytest.raises(MissingCredential, match=rf"{BEARER_ENV}.*AWS_ACCESS_KEY_ID.*AWS_PROFILE"):
        await resolve("us-east-1", {})


def _credential_process(tmp: Path, lifetimes: list[int], delay: float = 0.0) -> Path:
    """A profile whose credential_process gives credentials living `lifetimes[n]`
    seconds on its n-th run (the last one after that), and counts its runs."""
    runs = tmp / "runs"
    script = tmp / "creds.py"
    script.write_text(
        "import datetime, json, pathlib, time\n"
        f"runs = pathlib.Path({str(runs)!r})\n"
        "n = int(runs.read_text()) if runs.exists() else 0\n"
        "runs.write_text(str(n + 1))\n"
        f"time.sleep({delay})\n"
        f"lifetimes = {lifetimes!r}\n"
        "life = lifetimes[min(n, len(lifetimes) - 1)]\n"
        "end = datetime.datetime.now(datetime.timezone.utc) + datetime.timedelta(seconds=life)\n"
        "print(json.dumps({'Version': 1, 'AccessKeyId': %r, 'SecretAccessKey': %r,\n"
        "    'SessionToken': %r + str(n), 'Expiration': end.isoformat()}))\n"
        % (TEST_CREDENTIALS.access_key, TEST_CREDENTIALS.secret_key, "session-")
    )
    (tmp / "config").write_text(
        f"[profile standin]\ncredential_process = {sys.executable} {script}\n"
    )
    return runs


async def test_credentials_near_expiry_are_refreshed_in_the_background(
    aws_env: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # 12 minutes left: inside botocore's advisory window (15), outside its mandatory (10).
    # (botocore runs the process twice on loading: once found, once refreshed.)
    runs = _credential_process(aws_env, [12 * 60, 12 * 60, 3600], delay=0.3)
    monkeypatch.setenv("AWS_PROFILE", "standin")
    auth = await resolve("", {"AWS_REGION": "us-east-1"})
    assert isinstance(auth, SigV4) and "custom-process" in auth.described
    assert runs.read_text() == "2"
    began = time.monotonic()
    first = dict(await auth.headers("POST", URL, BODY))
    assert time.monotonic() - began < 0.2  # the current credentials serve meanwhile
    assert first["X-Amz-Security-Token"] == "session-1"
    token = first["X-Amz-Security-Token"]
    for _ in range(100):  # each request meanwhile is served at once, and starts no refresh
        await asyncio.sleep(0.05)
        token = dict(await auth.headers("POST", URL, BODY))["X-Amz-Security-Token"]
        if token != "session-1":
            break
    assert token == "session-2" and runs.read_text() == "3"
    await auth.close()


async def test_credentials_about_to_expire_are_awaited_without_blocking_the_loop(
    aws_env: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    runs = _credential_process(aws_env, [5 * 60, 5 * 60, 3600], delay=0.5)
    monkeypatch.setenv("AWS_PROFILE", "standin")
    auth = await resolve("", {"AWS_REGION": "us-east-1"})
    ticks = 0

    async def tick() -> None:
        nonlocal ticks
        while True:
            await asyncio.sleep(0.02)
            ticks += 1

    ticker = asyncio.create_task(tick())
    headers = dict(await auth.headers("POST", URL, BODY))
    ticker.cancel()
    assert headers["X-Amz-Security-Token"] == "session-2" and runs.read_text() == "3"
    assert ticks >= 10  # the loop ran on while the credential process did
    await auth.close()


async def test_no_credential_reaches_a_log_line(
    aws_env: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", TEST_CREDENTIALS.access_key)
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", TEST_CREDENTIALS.secret_key)
    monkeypatch.setenv("AWS_SESSION_TOKEN", TEST_CREDENTIALS.token or "")
    with caplog.at_level(logging.DEBUG):
        logging.getLogger().setLevel(logging.DEBUG)
        auth = await resolve("", {"AWS_REGION": "us-east-1"})
        await auth.headers("POST", URL, BODY)
    text = "\n".join(r.getMessage() for r in caplog.records)
    for secret in (TEST_CREDENTIALS.secret_key, TEST_CREDENTIALS.token or "", "Signature="):
        assert secret not in text
    assert json.dumps(text)  # the records were read
