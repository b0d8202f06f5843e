"""The proxy's own Bedrock credential, and requests signed with it.

The proxy rewrites what it forwards, so no signature a client made can cover it: every
request to Bedrock is authorised here, over exactly the method, path, query and bytes
sent. Either a Bedrock API key (`AWS_BEARER_TOKEN_BEDROCK`, sent as `Authorization:
Bearer`), or SigV4 (botocore's `SigV4Auth`, service `bedrock`, the configured region)
with credentials from botocore's standard chain: the environment, the shared config and
credentials files (profiles, SSO, credential processes, assumed roles), the container
and instance roles. Refreshable ones are refreshed ahead of their expiry, off the event
loop (refresh_ahead.py).

Signed headers are `host`, `x-amz-date` and, with temporary credentials,
`x-amz-security-token`: none a client sends, so nothing a client adds can break a
signature. The client's own credentials (`Authorization`, `x-amz-*` signing headers)
never go upstream.

botocore logs each canonical request at DEBUG, session token included: its loggers are
held at WARNING whatever the proxy's level, so no credential reaches a log.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Mapping
from typing import Any, Protocol

import botocore.session
from botocore.auth import SigV4Auth
from botocore.awsrequest import AWSRequest
from botocore.credentials import Credentials, ReadOnlyCredentials
from botocore.exceptions import BotoCoreError

from proxy.server.refresh_ahead import MissingCredential, RefreshAhead

logging.getLogger("botocore").setLevel(logging.WARNING)

SERVICE = "bedrock"
BEARER_ENV = "AWS_BEARER_TOKEN_BEDROCK"
REGION_ENVS = ("AWS_REGION", "AWS_DEFAULT_REGION")
# botocore's own advisory and mandatory refresh points for temporary credentials.
REFRESH_AHEAD = 15 * 60.0
REFRESH_LEAST = 10 * 60.0
_NOT_LOADED = "AWS credentials for Bedrock could not be loaded: {}"
# What a client sends to authorise itself to AWS; never forwarded.
CLIENT_AUTH = frozenset(
    {"authorization", "x-amz-date", "x-amz-security-token", "x-amz-content-sha256"}
)


def runtime_url(region: str) -> str:
    return f"https://bedrock-runtime.{region}.amazonaws.com"


def control_plane_url(region: str) -> str:
    return f"https://bedrock.{region}.amazonaws.com"


def region_of(setting: str, env: Mapping[str, str]) -> str:
    """The region Bedrock is called in: the setting, else the environment's."""
    for value in (setting, *(env.get(name, "") for name in REGION_ENVS)):
        if value.strip():
            return value.strip()
    return ""


def never_sent(name: str) -> bool:
    """What a client sends that must not reach AWS (`name` in lower case): its own
    signature, and a proxy key. Its other `x-amz-*` headers (an SDK's user agent) go too:
    AWS wants every `x-amz-*` header signed, and the proxy signs only its own."""
    return name in CLIENT_AUTH or name == "x-api-key" or name.startswith("x-amz-")


class BedrockAuth(Protocol):
    """Authorises one request: the headers to add to it."""

    region: str
    described: str  # which credential, for the start-up line (never the credential)

    async def headers(self, method: str, url: str, body: bytes) -> list[tuple[str, str]]: ...
    async def close(self) -> None: ...


class BearerAuth:
    def __init__(self, token: str, region: str) -> None:
        self._token = token
        self.region = region
        self.described = f"a Bedrock API key ({BEARER_ENV})"

    async def headers(self, method: str, url: str, body: bytes) -> list[tuple[str, str]]:
        return [("Authorization", f"Bearer {self._token}")]

    async def close(self) -> None:
        return None


class SigV4:
    def __init__(self, credentials: Credentials, region: str, described: str) -> None:
        self.region = region
        self.described = described
        self._credentials = credentials
        self._frozen: ReadOnlyCredentials | None = None
        self._refresh = RefreshAhead(
            self._freeze,
            self._expires_within,
            ahead=REFRESH_AHEAD,
            least=REFRESH_LEAST,
            provider="AWS",
        )

    def _freeze(self) -> None:
        """Blocking: may refresh temporary credentials (STS, SSO, a metadata server)."""
        self._frozen = self._credentials.get_frozen_credentials()

    def _expires_within(self, seconds: float) -> bool:
        if self._frozen is None:
            return True
        refresh_needed = getattr(self._credentials, "refresh_needed", None)
        return bool(refresh_needed(seconds)) if refresh_needed is not None else False

    async def load(self) -> None:
        """The first load, off the loop, so that a chain that cannot give credentials
        stops start-up rather than a request."""
        try:
            await asyncio.to_thread(self._freeze)
        except (BotoCoreError, ValueError) as e:
            raise MissingCredential(
                f"AWS credentials for Bedrock could not be loaded: {e}"
            ) from None

    async def headers(self, method: str, url: str, body: bytes) -> list[tuple[str, str]]:
        await self._refresh.ready()
        assert self._frozen is not None
        return sign(method, url, body, self._frozen, self.region)

    async def close(self) -> None:
        await self._refresh.close()


def sign(
    method: str, url: str, body: bytes, credentials: Any, region: str
) -> list[tuple[str, str]]:
    """SigV4 headers for a request to `url` (its path and query exactly as sent)."""
    request = AWSRequest(method=method, url=url, data=body)
    SigV4Auth(credentials, SERVICE, region).add_auth(request)
    names = ("Authorization", "X-Amz-Date", "X-Amz-Security-Token")
    return [(name, request.headers[name]) for name in names if name in request.headers]


async def resolve(region_setting: str, env: Mapping[str, str]) -> BedrockAuth:
    """The proxy's Bedrock credential; raises MissingCredential naming what to set.
    Runs the credential chain in a worker thread: it may call metadata servers."""
    region = region_of(region_setting, env)
    if not region:
        raise MissingCredential(
            "no AWS region for Bedrock: set upstream.bedrock_region, AWS_REGION or "
            "AWS_DEFAULT_REGION"
        )
    token = env.get(BEARER_ENV, "").strip()
    if token:
        return BearerAuth(token, region)
    session = botocore.session.Session()
    try:
        credentials = await asyncio.to_thread(session.get_credentials)
    except BotoCoreError as e:
        raise MissingCredential(_NOT_LOADED.format(e)) from None
    if credentials is None:
        raise MissingCredential(
            f"no AWS credentials for Bedrock: set {BEARER_ENV} (a Bedrock API key), or "
            "credentials botocore finds (AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY, "
            "AWS_PROFILE with a config or credentials file, SSO, a container or "
            "instance role)"
        )
    auth = SigV4(credentials, region, f"AWS credentials ({credentials.method}), SigV4")
    await auth.load()
    return auth
