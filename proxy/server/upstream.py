"""An upstream: where requests go, the one HTTP client that sends them, and what its
failures mean to the client.

Bytes pass unchanged both ways: no automatic decompression, no default headers added
(Accept, Accept-Encoding, User-Agent, Content-Type come only from the client), no cookie
jar (cookies would leak between tenants), no redirects followed. Timeouts: connect, and
an idle read timeout; never a total timeout, so long streams are not cut.

aiohttp's errors are mapped here once, into the proxy's error tree (proxy/core/errors.py):
`send`, `read`, `chunks` and `connect_ws` raise an `UpstreamError` and nothing else of
the road behind the proxy. Before a stream started it is the client's answer (502, or
504 for silence); once one started, a transport ends it (proxy/server/transport.py): an
`UpstreamTimeout` (the upstream went silent) with a clean error event, any other with a
cut, as the upstream's own broken stream would have reached the client.

A `Signer` (upstream auth over the exact bytes sent: SigV4, a refreshed OAuth token) is
applied to every request an upstream sends: an exchange's rounds and its summaries alike.
"""

from __future__ import annotations

from collections.abc import AsyncGenerator, AsyncIterator, Sequence
from typing import TYPE_CHECKING, Any, Protocol

import aiohttp
from yarl import URL

from proxy import tracing
from proxy.config import UpstreamSettings
from proxy.core.errors import UpstreamError, UpstreamGarbage, UpstreamTimeout, UpstreamUnreachable
from proxy.server.logs import redacted_url

if TYPE_CHECKING:  # at run time imported only when tracing is on (proxy/tracing.py)
    from opentelemetry.trace import Span

# aiohttp adds these when the caller does not send them; a transparent proxy must not.
_NO_AUTO_HEADERS = ("Accept", "Accept-Encoding", "User-Agent", "Content-Type")


# path prefix -> (gen_ai.provider.name, gen_ai.operation.name) of an upstream call's span
_GENAI_PATHS = (
    ("/v1/messages/count_tokens", ("anthropic", "")),
    ("/v1/messages", ("anthropic", "chat")),
    ("/v1/chat/completions", ("openai", "chat")),
    ("/v1/responses", ("openai", "chat")),
    ("/model/", ("aws.bedrock", "chat")),  # bedrock-runtime (its own upstream)
    ("/v1/projects/", ("gcp.vertex_ai", "chat")),  # Vertex AI (its own upstream)
    ("/v1beta/", ("gcp.gemini", "")),  # the Gemini API (a call's method is in its path)
)

Headers = list[tuple[str, str]]


class Signer(Protocol):
    """Upstream auth that covers the exact request sent (SigV4 over method, path, query,
    headers and the body's hash; or a bearer token refreshed before it expires): the
    headers to send instead of `headers`. Given every request of an upstream, so the
    credential is the proxy's and never the client's; it is never logged."""

    async def sign(self, method: str, url: URL, headers: Headers, body: bytes) -> Headers: ...


class TracedResponse(aiohttp.ClientResponse):
    """An upstream answer (with tracing on) that ends its call's CLIENT span once read to
    its end, released or closed, whichever comes first: a stream's span lasts as long
    as the stream."""

    span: Span | None = None

    def traced(self, span: Span) -> None:
        self.span = span
        span.set_attribute("http.response.status_code", self.status)
        if self.status >= 400 and (active := tracing.ACTIVE) is not None:
            active.failed(span, str(self.status))  # a client span's 4xx is an error too
        self.content.on_eof(self._end_span)

    def _end_span(self) -> None:
        span, self.span = self.span, None
        if span is not None:
            span.end()

    def release(self) -> Any:
        self._end_span()
        return super().release()

    def close(self) -> None:
        self._end_span()
        super().close()


class AnswerTooLarge(aiohttp.ClientPayloadError):
    """An upstream answer (or one event of it) over the cap the proxy reads it within."""

    def __init__(self, what: str, limit: int, setting: str) -> None:
        super().__init__(f"{what} over {limit} bytes ({setting})")
        self.limit = limit


def too_large(error: AnswerTooLarge | str) -> UpstreamGarbage:
    return UpstreamGarbage(f"compaction-proxy will not read the upstream's answer: {error}")


def unreadable(error: Exception) -> UpstreamGarbage:
    """An answer the upstream said was one (200) that is none of this API's."""
    if isinstance(error, AnswerTooLarge):
        return too_large(error)
    return UpstreamGarbage(
        f"compaction-proxy could not read the upstream's answer ({type(error).__name__})"
    )


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
        "signer",
    )

    def __init__(self, settings: UpstreamSettings, *, signer: Signer | None = None) -> None:
        self.settings = settings
        self.signer = signer
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
            # With tracing on, an answer ends its call's span (see TracedResponse).
            response_class=TracedResponse if tracing.ACTIVE is not None else aiohttp.ClientResponse,
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

    # -- what a failure means to the client (the one mapping of aiohttp's errors) -------

    def failure(self, error: BaseException, *, stream: bool) -> UpstreamError:
        """What the client is told when the upstream gave no usable answer: 504 when it
        stayed silent past its read timeout, 502 otherwise."""
        if isinstance(error, UpstreamError):
            return error
        if isinstance(error, AnswerTooLarge):
            return too_large(error)
        shown = self.shown_url
        if isinstance(error, aiohttp.ConnectionTimeoutError):
            return _unreachable(shown, "connection timed out")
        if isinstance(error, TimeoutError):  # aiohttp's SocketTimeoutError is one too
            seconds = self.timeout_for(stream)
            return UpstreamTimeout(
                f"compaction-proxy got no answer from the upstream {shown} within {seconds:g} s"
            )
        if isinstance(error, aiohttp.ClientConnectorError):
            return _unreachable(shown, f"connection failed ({error.os_error.strerror})")
        if isinstance(error, aiohttp.ServerDisconnectedError):
            return _unreachable(shown, "the connection closed before an answer")
        return _unreachable(shown, type(error).__name__)

    # -- sending and reading ------------------------------------------------------------

    async def send(
        self,
        method: str,
        path_qs: str,
        headers: Sequence[tuple[str, str]],
        data: bytes | AsyncIterator[bytes] | None,
        *,
        stream: bool,
        purpose: str = "request",
        model: str = "",
    ) -> aiohttp.ClientResponse:
        """Send a request; returns once the response headers are in (an UpstreamError
        when none came). The caller must release() or close() the response. With tracing
        on the call has its own CLIENT span (`purpose`: request, read_round, summary;
        `model`: the one asked for, as its sender knows it), whose context the upstream
        gets as its `traceparent`."""
        url = self.url(path_qs)
        sent = list(headers)
        try:
            if self.signer is not None:
                # Signed over the very bytes sent: a streamed body cannot be.
                assert data is None or isinstance(data, bytes), "a signed body is whole"
                sent = await self.signer.sign(method, url, sent, data or b"")
            active = tracing.ACTIVE
            if active is not None:
                return await self._traced(
                    active, method, url, sent, data, stream=stream, purpose=purpose, model=model
                )
            return await self.session.request(
                method,
                url,
                headers=sent,
                data=data,
                allow_redirects=False,
                timeout=self._stream_timeout if stream else self._response_timeout,
            )
        except (aiohttp.ClientError, TimeoutError) as e:
            raise self.failure(e, stream=stream) from None

    async def _traced(
        self,
        active: tracing.Tracing,
        method: str,
        url: URL,
        headers: Headers,
        data: bytes | AsyncIterator[bytes] | None,
        *,
        stream: bool,
        purpose: str,
        model: str,
    ) -> aiohttp.ClientResponse:
        path = url.raw_path
        attributes: dict[str, Any] = {
            "http.request.method": method,
            "server.address": url.host or "",
            "url.path": path,  # never the query string
            "compaction.purpose": purpose,
        }
        if url.port is not None:
            attributes["server.port"] = url.port
        name = f"{method} {path}"
        provider, operation = next((v for p, v in _GENAI_PATHS if path.startswith(p)), ("", ""))
        if provider:
            attributes["gen_ai.provider.name"] = attributes["gen_ai.system"] = provider
            if model:
                attributes["gen_ai.request.model"] = model
        if operation:
            attributes["gen_ai.operation.name"] = operation
            name = f"{operation} {model}" if model else operation
        with active.client_span(name, attributes) as span:
            try:
                response = await self.session.request(
                    method,
                    url,
                    headers=active.outgoing(headers),
                    data=data,
                    allow_redirects=False,
                    timeout=self._stream_timeout if stream else self._response_timeout,
                )
            except BaseException as error:
                active.failed(span, error)
                span.end()
                raise
        if isinstance(response, TracedResponse):
            response.traced(span)
        else:
            span.set_attribute("http.response.status_code", response.status)
            span.end()
        return response

    async def read(
        self, response: aiohttp.ClientResponse, *, limit: int | None = None, stream: bool = False
    ) -> bytes:
        """A whole answer, within `limit` bytes (upstream.max_answer_bytes unless said),
        the response released after (closed on a failure: an UpstreamError)."""
        try:
            raw = await read_bounded(response, limit or self.settings.max_answer_bytes)
        except (aiohttp.ClientError, TimeoutError) as e:
            response.close()
            raise self.failure(e, stream=stream) from None
        response.release()
        return raw

    async def chunks(self, response: aiohttp.ClientResponse) -> AsyncGenerator[bytes, None]:
        """A streamed answer's bytes as they arrive. Ends with an UpstreamTimeout when the
        upstream goes silent past upstream.stream_idle_timeout, another UpstreamError when
        the stream breaks; the response is released at its end, closed otherwise."""
        done = False
        try:
            async for chunk in response.content.iter_any():
                yield chunk
            done = True
        except (TimeoutError, aiohttp.ClientError) as e:
            raise self.stream_failure(e) from None
        finally:
            if done:
                response.release()
            else:
                response.close()

    def stream_failure(self, error: TimeoutError | aiohttp.ClientError) -> UpstreamError:
        """What a streamed answer's read failing means: an UpstreamTimeout when the
        upstream went silent past upstream.stream_idle_timeout, else as `failure` says."""
        if isinstance(error, TimeoutError):
            return UpstreamTimeout(
                "compaction-proxy: the upstream stream went silent for"
                f" {self.settings.stream_idle_timeout:g} s; ended by the proxy"
            )
        return self.failure(error, stream=True)

    async def connect_ws(self, path_qs: str, **options: Any) -> aiohttp.ClientWebSocketResponse:
        """A WebSocket to the upstream. An upgrade it refuses raises aiohttp's
        WSServerHandshakeError (its status is the client's to see); no answer at all, an
        UpstreamError."""
        try:
            socket: aiohttp.ClientWebSocketResponse = await self.session.ws_connect(
                self.url(path_qs), **options
            )
            return socket
        except aiohttp.WSServerHandshakeError:
            raise
        except (aiohttp.ClientError, TimeoutError) as e:
            raise self.failure(e, stream=False) from e

    def timeout_for(self, stream: bool) -> float:
        s = self.settings
        return s.stream_idle_timeout if stream else s.response_timeout

    async def close(self) -> None:
        await self.session.close()


def _unreachable(upstream: str, reason: str) -> UpstreamUnreachable:
    return UpstreamUnreachable(
        f"compaction-proxy could not reach the upstream {upstream}: {reason}"
    )
