"""Upstream credentials that expire, refreshed without blocking the event loop.

The providers' own libraries (botocore, google-auth) refresh with blocking network
calls (STS, SSO, the instance or GKE metadata server, an OAuth token endpoint). Here such
a refresh runs in a worker thread: in the background once the credential is within
`ahead` seconds of expiring (requests keep using the current one meanwhile), and awaited
only when it is within `least` seconds of it, or has never been loaded. One refresh runs
at a time; every request that needs it waits for that one.

A failed refresh is logged by its kind and message (the libraries never put a secret in
either) and raised to the request as `CredentialUnavailable`, which names the provider
and never the library's words: those stay in the proxy's log.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from typing import Protocol

from yarl import URL

from proxy.core.errors import UpstreamError

log = logging.getLogger(__name__)


class CredentialUnavailable(UpstreamError):
    """The proxy has no usable credential for an upstream (none configured, or its
    refresh failed): a fault of the proxy's setup, not of the request."""

    status = 503
    retry = False


class MissingCredential(Exception):
    """No credential can be found for a provider: stops start-up, naming what to set."""


class RefreshAhead:
    def __init__(
        self,
        refresh: Callable[[], None],
        expires_within: Callable[[float], bool],
        *,
        ahead: float,
        least: float,
        provider: str,
    ) -> None:
        """`refresh` (blocking) renews the credential; `expires_within(seconds)` says
        whether it is missing or expires within that many seconds (no I/O)."""
        self._refresh = refresh
        self._expires_within = expires_within
        self._ahead, self._least = ahead, least
        self.provider = provider
        self._running: asyncio.Task[None] | None = None

    async def ready(self) -> None:
        """Return once the credential is good for at least `least` seconds."""
        if not self._expires_within(self._least):
            if self._running is None and self._expires_within(self._ahead):
                self._start()  # in the background: the current one still serves
            return
        task = self._running or self._start()
        try:
            await asyncio.shield(task)
        except Exception:
            raise CredentialUnavailable(
                f"The proxy could not refresh its {self.provider} credentials; "
                "its operator can see why in the proxy's log."
            ) from None

    def _start(self) -> asyncio.Task[None]:
        task = asyncio.get_running_loop().create_task(self._run())
        self._running = task
        return task

    async def _run(self) -> None:
        try:
            await asyncio.to_thread(self._refresh)
        except Exception as e:
            log.warning(
                "refreshing the %s credentials failed: %s: %s", self.provider, type(e).__name__, e
            )
            raise
        finally:
            self._running = None

    async def close(self) -> None:
        """Wait for a refresh under way (a worker thread cannot be cancelled)."""
        task = self._running
        if task is not None:
            await asyncio.gather(task, return_exceptions=True)


class Credential(Protocol):
    """The proxy's credential for one provider: the headers that authorise one request."""

    described: str  # which credential, for the start-up line (never the credential)

    async def headers(self, method: str, url: str, body: bytes, /) -> list[tuple[str, str]]: ...
    async def close(self) -> None: ...


Headers = list[tuple[str, str]]


class ProxySigner:
    """Authorises (`Signer`) every request of a provider's upstreams with the proxy's own
    credential, found once by `find` (raising MissingCredential naming what to set); the
    client's own credential headers (`never_sent`) are dropped."""

    def __init__(
        self,
        provider: str,
        find: Callable[[], Awaitable[Credential]],
        never_sent: Callable[[str], bool],
        verb: str,
    ) -> None:
        self._provider, self._find, self._never_sent, self._verb = provider, find, never_sent, verb
        self._auth: Credential | None = None
        self._finding = asyncio.Lock()

    async def auth(self) -> Credential:
        async with self._finding:
            if self._auth is None:
                self._auth = await self._find()
            return self._auth

    async def sign(self, method: str, url: URL, headers: Headers, body: bytes) -> Headers:
        try:
            auth = await self.auth()
        except MissingCredential as e:
            message = f"compaction-proxy cannot call {self._provider}: {e}"
            raise CredentialUnavailable(message) from None
        kept = [(n, v) for n, v in headers if not self._never_sent(n.lower())]
        return kept + await auth.headers(method, str(url), body)

    @property
    def described(self) -> str:
        """Which credential (never the credential), for the start-up line."""
        if self._auth is None:
            return "its credential looked for at the first request"
        return f"{self._verb} with {self._auth.described}"

    async def close(self) -> None:
        if self._auth is not None:
            await self._auth.close()
