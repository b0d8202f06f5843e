"""The one upstream HTTP client of the process.

Bytes pass unchanged both ways: no automatic decompression, no default headers added
(Accept, Accept-Encoding, User-Agent, Content-Type come only from the client), no cookie
jar (cookies would leak between tenants), no redirects followed. Timeouts: connect, and
an idle read timeout; never a total timeout, so long streams are not cut.
"""

from __future__ import annotations

from collections.abc import Sequence

import aiohttp
from yarl import URL

from proxy.config import UpstreamSettings
from proxy.server.logs import redacted_url

# aiohttp adds these when the caller does not send them; a transparent proxy must not.
_NO_AUTO_HEADERS = ("Accept", "Accept-Encoding", "User-Agent", "Content-Type")


class AnswerTooLarge(aiohttp.ClientPayloadError):
    """An upstream answer (or one event of it) over the cap the proxy reads it within."""

    def __init__(self, what: str, limit: int, setting: str) -> None:
        super().__init__(f"{what} over {limit} bytes ({setting})")
        self.limit = limit


async def read_bounded(response: aiohttp.ClientResponse, limit: int) -> bytes:
    """A whole answer, never more than `limit` bytes of it held (raises AnswerTooLarge
    as soon as it is known to be longer: its Content-Length, or what has arrived)."""
    length = response.content_length
    if length is not None and length > limit:
        raise AnswerTooLarge("the answer", limit, "upstream.max_answer_bytes")
    if length is not None:
        return await response.read()  # the parser stops at Content-Length
    body = bytearray()
    async for chunk in response.content.iter_any():
        body += chunk
        if len(body) > limit:
            raise AnswerTooLarge("the answer", limit, "upstream.max_answer_bytes")
    return bytes(body)


class Upstream:
    """Where requests go (from the configuration only) and the session that sends them."""

    __slots__ = (
        "_base",
        "_response_timeout",
        "_stream_timeout",
        "session",
        "settings",
        "shown_url",
    )

    def __init__(self, settings: UpstreamSettings) -> None:
        self.settings = settings
        self._base = settings.url.rstrip("/")
        # For answers, logs and /readyz: any password in the URL masked.
        self.shown_url = redacted_url(self._base)
        connector = aiohttp.TCPConnector(
            limit=settings.pool_limit,
            limit_per_host=settings.pool_limit_per_host,
            keepalive_timeout=settings.keepalive_timeout,
            ttl_dns_cache=300,
        )
        self._stream_timeout = aiohttp.ClientTimeout(
            total=None,
            sock_connect=settings.connect_timeout,
            sock_read=settings.stream_idle_timeout,
        )
        self._response_timeout = aiohttp.ClientTimeout(
            total=None,
            sock_connect=settings.connect_timeout,
            sock_read=settings.response_timeout,
        )
        self.session = aiohttp.ClientSession(
            connector=connector,
            auto_decompress=False,
            skip_auto_headers=_NO_AUTO_HEADERS,
            cookie_jar=aiohttp.DummyCookieJar(),
            timeout=self._response_timeout,
            trust_env=False,
            # Response header lines can be long (anthropic-ratelimit-*, long ids).
            max_line_size=65536,
            max_field_size=65536,
            read_bufsize=2**18,
        )

    @property
    def base_url(self) -> str:
        return self._base

    @property
    def configured(self) -> bool:
        """False for an OpenAI upstream left unset with keys required (routing.py)."""
        return bool(self._base)

    def url(self, path_qs: str) -> URL:
        # encoded=True: the path and query go on exactly as the client wrote them.
        return URL(self._base + path_qs, encoded=True)

    async def send(
        self,
        method: str,
        path_qs: str,
        headers: Sequence[tuple[str, str]],
        data: bytes | aiohttp.StreamReader | None,
        *,
        stream: bool,
    ) -> aiohttp.ClientResponse:
        """Send a request; returns once the response headers are in. The caller must
        release() or close() the response."""
        return await self.session.request(
            method,
            self.url(path_qs),
            headers=headers,
            data=data,
            allow_redirects=False,
            timeout=self._stream_timeout if stream else self._response_timeout,
        )

    async def read(self, response: aiohttp.ClientResponse) -> bytes:
        """A whole answer the proxy must parse, within upstream.max_answer_bytes."""
        return await read_bounded(response, self.settings.max_answer_bytes)

    def timeout_for(self, stream: bool) -> float:
        s = self.settings
        return s.stream_idle_timeout if stream else s.response_timeout

    async def close(self) -> None:
        await self.session.close()
