"""The proxy's own Vertex AI credential: an OAuth2 access token from google-auth's
application default credentials (GOOGLE_APPLICATION_CREDENTIALS naming a service account
or workload identity federation file, the gcloud user's, or the metadata server of a
GCE/GKE/Cloud Run workload), scope cloud-platform, sent as `Authorization: Bearer`.

Tokens live about an hour: refreshed five minutes ahead of expiry in a worker thread
(google-auth's own HTTP, through urllib3), so no request waits for one unless the
refresh failed. A client's own `Authorization` never goes upstream: it cannot cover a
request the proxy rewrote, and the proxy's credential is the one Vertex sees.
"""

from __future__ import annotations

import asyncio
import datetime
import logging
from typing import Any

import google.auth
import google.auth.exceptions
import google.auth.transport.urllib3
import urllib3

from proxy.server.refresh_ahead import MissingCredential, RefreshAhead

# google-auth logs requests (token exchanges included) at DEBUG.
logging.getLogger("google.auth").setLevel(logging.WARNING)

SCOPE = "https://www.googleapis.com/auth/cloud-platform"
REFRESH_AHEAD = 5 * 60.0
REFRESH_LEAST = 60.0


class VertexAuth:
    def __init__(self, credentials: Any, project: str | None) -> None:
        self._credentials = credentials
        self.project = project or ""  # the credentials' own project, if they name one
        kind = type(credentials).__module__.removeprefix("google.").replace("_", " ")
        self.described = f"Google application default credentials ({kind})"
        self._http = urllib3.PoolManager(num_pools=2)
        self._refresh = RefreshAhead(
            self._renew, self._expires_within, ahead=REFRESH_AHEAD, least=REFRESH_LEAST,
            provider="Google Cloud",
        )  # fmt: skip

    def _renew(self) -> None:
        """Blocking: a token exchange (an OAuth endpoint or the metadata server)."""
        request = google.auth.transport.urllib3.Request(self._http)  # type: ignore[no-untyped-call]
        self._credentials.refresh(request)

    def _expires_within(self, seconds: float) -> bool:
        credentials = self._credentials
        if not credentials.token:
            return True
        expiry = credentials.expiry  # naive UTC, as google-auth keeps it
        if expiry is None:
            return False
        now = datetime.datetime.now(datetime.UTC).replace(tzinfo=None)
        return bool(now + datetime.timedelta(seconds=seconds) >= expiry)

    async def load(self) -> None:
        """The first token, so that credentials that cannot give one stop start-up."""
        try:
            await asyncio.to_thread(self._renew)
        except google.auth.exceptions.GoogleAuthError as e:
            raise MissingCredential(f"no access token for Vertex AI: {e}") from None

    async def headers(self, *_: object) -> list[tuple[str, str]]:
        """(Whatever the request: a bearer token covers any.)"""
        await self._refresh.ready()
        return [("Authorization", f"Bearer {self._credentials.token}")]

    async def close(self) -> None:
        await self._refresh.close()
        self._http.clear()


async def resolve() -> VertexAuth:
    """The proxy's Vertex credential; raises MissingCredential naming what to set.
    Application default credentials are looked for in a worker thread (the metadata
    server's check is a network call)."""
    try:
        credentials, project = await asyncio.to_thread(google.auth.default, scopes=[SCOPE])
    except google.auth.exceptions.GoogleAuthError as e:
        raise MissingCredential(
            "no Google credentials for Vertex AI: set GOOGLE_APPLICATION_CREDENTIALS to a "
            "service account (or workload identity federation) file, run `gcloud auth "
            f"application-default login`, or run on Google Cloud with a service account ({e})"
        ) from None
    auth = VertexAuth(credentials, project)
    await auth.load()
    return auth
