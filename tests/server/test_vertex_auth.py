"""The proxy's Vertex credential: google-auth's application default credentials from a
service-account file, its real token exchange against a local OAuth endpoint (the file's
token_uri), tokens refreshed ahead of expiry off the event loop, no token in a log."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from aiohttp import web

from proxy.server.refresh_ahead import CredentialUnavailable, MissingCredential
from proxy.server.vertex_auth import VertexAuth, resolve
from proxy.testing.google_oauth import PROJECT, TOKEN_PATH, TokenEndpoint, write_service_account


@pytest.fixture
async def endpoint() -> AsyncIterator[tuple[TokenEndpoint, str, web.AppRunner]]:
    tokens = TokenEndpoint()
    app = web.Application()
    tokens.add_to(app)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    host, port = runner.addresses[0][:2]
    yield tokens, f"http://{host}:{port}{TOKEN_PATH}", runner
    await runner.cleanup()


@pytest.fixture
def adc(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, endpoint: tuple[TokenEndpoint, str, object]
) -> Path:
    path = write_service_account(tmp_path / "sa.json", endpoint[1])
    monkeypatch.setenv("GOOGLE_APPLICATION_CREDENTIALS", str(path))
    monkeypatch.setenv("NO_GCE_CHECK", "True")
    return path


async def _bearer(auth: VertexAuth) -> str:
    ((name, value),) = await auth.headers()
    assert name == "Authorization" and value.startswith("Bearer ")
    return value.removeprefix("Bearer ")


async def test_a_service_account_files_token_exchange_gives_an_accepted_token(
    adc: Path, endpoint: tuple[TokenEndpoint, str, object]
) -> None:
    tokens = endpoint[0]
    auth = await resolve()
    assert auth.project == PROJECT and "service account" in auth.described
    token = await _bearer(auth)
    assert tokens.valid(token) and tokens.exchanges == 1
    assert await _bearer(auth) == token and tokens.exchanges == 1  # reused while it lives
    await auth.close()


async def test_a_token_near_expiry_is_renewed_in_the_background(
    adc: Path, endpoint: tuple[TokenEndpoint, str, object]
) -> None:
    tokens = endpoint[0]
    tokens.lifetime = 200  # inside the five minutes ahead, outside the last one
    auth = await resolve()
    first = await _bearer(auth)
    tokens.lifetime = 3600
    assert await _bearer(auth) == first  # served at once; the exchange runs meanwhile
    for _ in range(100):
        await asyncio.sleep(0.02)
        if (latest := await _bearer(auth)) != first:
            break
    assert latest != first and tokens.valid(latest) and tokens.exchanges == 2
    await auth.close()


async def test_a_token_about_to_expire_is_awaited(
    adc: Path, endpoint: tuple[TokenEndpoint, str, object]
) -> None:
    tokens = endpoint[0]
    tokens.lifetime = 30  # inside the last minute: no request may use it
    auth = await resolve()
    (loaded,) = tokens.issued
    tokens.lifetime = 3600
    token = await _bearer(auth)
    assert token != loaded and tokens.valid(token) and tokens.exchanges == 2
    await auth.close()


async def test_a_failed_refresh_is_an_error_naming_the_provider_not_the_reason(
    adc: Path, endpoint: tuple[TokenEndpoint, str, web.AppRunner], caplog: pytest.LogCaptureFixture
) -> None:
    tokens, _, runner = endpoint
    tokens.lifetime = 30
    auth = await resolve()
    await runner.cleanup()  # the token endpoint goes away
    with pytest.raises(CredentialUnavailable, match="Google Cloud credentials") as raised:
        await auth.headers()
    assert raised.value.status == 503 and "127.0.0.1" not in raised.value.message
    assert any(
        "refreshing the Google Cloud credentials failed" in r.getMessage() for r in caplog.records
    )
    await auth.close()


async def test_missing_credentials_stop_with_what_to_set(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("GOOGLE_APPLICATION_CREDENTIALS", str(tmp_path / "absent.json"))
    with pytest.raises(MissingCredential, match="GOOGLE_APPLICATION_CREDENTIALS"):
        await resolve()


async def test_no_token_reaches_a_log_line(adc: Path, caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.DEBUG):
        logging.getLogger().setLevel(logging.DEBUG)
        auth = await resolve()
        token = await _bearer(auth)
    assert caplog.records  # something was logged (the token endpoint's access line)
    assert all(token not in r.getMessage() for r in caplog.records)
    assert all("PRIVATE KEY" not in r.getMessage() for r in caplog.records)
    await auth.close()
