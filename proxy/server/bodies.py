"""Reading request bodies: bounded in size and in time, decoded for inspection, and the
fields budgets read checked; `read_request` is the one read step (a conversation's
exchange over HTTP and a metered pass-through call both read their body with it).

A body must arrive within `server.body_timeout` seconds plus one second per 64 KiB
received: a client that trickles a few bytes now and then (or sends nothing) is answered
408 and disconnected rather than holding a connection and its memory for ever, while a
large upload on a slow line still gets through. A body sent with `Content-Encoding` is
decoded (proxy/core/content_encoding.py, never past `server.max_body_bytes`) only so
budgets can read it; what goes upstream is the body as sent.

Decoding a large body and checking its fields run off the event loop past
`server.off_loop_bytes` (proxy/server/off_loop.py).
"""

from __future__ import annotations

import asyncio
import functools
from collections.abc import AsyncIterator, Callable, Mapping
from typing import Any

import orjson
from aiohttp import web

from proxy.config import ServerSettings
from proxy.core import content_encoding
from proxy.core.budget import BadRequestField, output_reservation
from proxy.core.duplicate_keys import duplicate_field
from proxy.core.errors import (
    InvalidRequest,
    RequestTimeout,
    RequestTooLarge,
    UnsupportedEncoding,
)
from proxy.core.identity import header_id
from proxy.core.model_names import model_problem
from proxy.core.per_request import per_request
from proxy.core.reuse import Reuse, Seen, key_of
from proxy.core.wire_format import Request
from proxy.server.off_loop import off_loop

MIN_RATE = 64 * 1024  # bytes a second a body must keep up, past its grace
BAD_JSON = "The request body is not valid JSON"


@per_request
class Incoming:
    """A request as read, and what its API's own step said of it."""

    body: bytes  # as sent: what goes upstream unless compaction rewrites it
    payload: dict[str, Any] | None  # parsed (decoded first when encoded); None: unread
    encoded: bool = False  # sent with a Content-Encoding: inspected only, never rewritten
    # False: no read_result for this request (an API's own step decided it, before the
    # planner, which then writes no stub naming it).
    read_result: bool = True
    # What was computed for its conversation line's last request (proxy/core/reuse.py),
    # when it was parsed as that line's continuation.
    seen: Seen | None = None


# How a body is parsed: orjson's value, and what the reuse cache kept of its line.
Parse = Callable[[bytes], tuple[Any, Seen | None]]


def plain_parse(text: bytes) -> tuple[Any, Seen | None]:
    """orjson's value, and nothing kept."""
    return orjson.loads(text), None


def continuing(reuse: Reuse, wire: Request, tenant: str, headers: Mapping[str, str]) -> Parse:
    """How a body of a conversation is parsed: as the continuation of its line's last
    request when it repeats its bytes (only what is new is parsed: proxy/core/reuse.py),
    with what was kept of it."""
    return functools.partial(_continued, reuse, wire.history_field, tenant, headers)


def _continued(
    reuse: Reuse, field: str, tenant: str, headers: Mapping[str, str], text: bytes
) -> tuple[Any, Seen | None]:
    return reuse.parse(key_of(tenant, header_id(headers), text), text, field)


async def read_request(
    request: web.Request,
    settings: ServerSettings,
    *,
    must_read: bool,
    key_checks: bool,
    bad_json: str = BAD_JSON,
    parse: Parse = plain_parse,
) -> Incoming:
    """The read step: the body within its limit and time, decoded and parsed when it can
    be (`parse`: as the continuation of its conversation line, `continuing`), its
    model name and (`key_checks`: a proxy key's, the operator pays) its duplicate fields
    checked. A body that cannot be decoded or parsed goes through unread, unless
    `must_read` (budgets must read it): then it is refused, as a body sent uncompressed
    that is not JSON always is."""
    limit = settings.max_body_bytes
    try:
        body = await read_body(request, settings)
    except BodyTooLarge:
        raise too_large(limit) from None
    except asyncio.IncompleteReadError:
        raise InvalidRequest("The request body ended before its Content-Length.") from None
    codings = codings_of(request)  # read once: whether encoded, and how to decode
    encoded = bool(codings)
    text = await decoded(body, codings, settings)
    if text is None:
        if must_read:
            raise unreadable_encoding(request)
        return Incoming(body, None, encoded)
    try:
        parsed, seen = parse(text)
    except orjson.JSONDecodeError as e:
        if encoded and not must_read:
            return Incoming(body, None, encoded)
        raise InvalidRequest(f"{bad_json}: {e}") from None
    if not isinstance(parsed, dict):
        raise InvalidRequest("The request body must be a JSON object.")
    check_model(parsed)
    if key_checks:
        await off_loop(len(text), settings.off_loop_bytes, check_duplicates, text, parsed)
    return Incoming(body, parsed, encoded, seen=seen)


def unreadable_encoding(request: web.Request) -> UnsupportedEncoding:
    coding = ", ".join(request.headers.getall("Content-Encoding", []))
    return UnsupportedEncoding(
        f"compaction-proxy cannot read a body sent with Content-Encoding: {coding}, and"
        " this key's budgets must: send it uncompressed, or gzip or deflate."
    )


class BodyTooLarge(Exception):
    pass


class BodyClock:
    """The deadline a body keeps: `grace` seconds, plus one per MIN_RATE bytes read."""

    def __init__(self, grace: float) -> None:
        self.loop = asyncio.get_running_loop()
        self.start = self.loop.time()
        self.grace = grace
        self.received = 0
        self.expired = False

    async def read(self, request: web.Request) -> bytes:
        """The next chunk (b"" at the end); RequestTimeout once the deadline passed."""
        deadline = self.start + self.grace + self.received / MIN_RATE
        try:
            async with asyncio.timeout_at(deadline):
                chunk = await request.content.readany()
        except TimeoutError:
            self.expired = True
            raise too_slow(self.grace) from None
        self.received += len(chunk)
        return chunk


def too_slow(grace: float) -> RequestTimeout:
    return RequestTimeout(
        f"The request body did not arrive in time ({grace:g} s, plus 1 s per 64 KiB)."
    )


def too_large(limit: int) -> RequestTooLarge:
    return RequestTooLarge(f"Request exceeds the maximum allowed number of bytes ({limit}).")


async def read_body(request: web.Request, settings: ServerSettings) -> bytes:
    """The whole body, refusing early once it is over server.max_body_bytes
    (BodyTooLarge): by Content-Length before reading anything, else by counting while
    reading; and RequestTimeout when it does not arrive in time."""
    limit = settings.max_body_bytes
    length = request.content_length
    if length is not None and length > limit:
        raise BodyTooLarge
    # What has arrived with the headers (on loopback or a fast line, usually all of it)
    # is taken without a wait, so without a deadline to keep.
    content = request.content
    chunks = [content.read_nowait()]
    total = len(chunks[0])
    if total > limit:
        raise BodyTooLarge
    if not content.at_eof():
        clock = BodyClock(settings.body_timeout)
        clock.received = total
        while chunk := await clock.read(request):
            total += len(chunk)
            if total > limit:
                raise BodyTooLarge
            chunks.append(chunk)
    body = chunks[0] if len(chunks) == 1 else b"".join(chunks)
    if length is not None and total < length:
        raise asyncio.IncompleteReadError(body, length)
    return body


async def stream_body(request: web.Request, clock: BodyClock) -> AsyncIterator[bytes]:
    """The body as it arrives (for a pass-through upload), on `clock`'s deadline."""
    while chunk := await clock.read(request):
        yield chunk


async def decoded(body: bytes, codings: list[str], settings: ServerSettings) -> bytes | None:
    """The body with its Content-Encoding (`codings`, `codings_of` the request) undone,
    for inspection: the body itself when it has none, None when it cannot be decoded (an
    unknown coding, corrupt data). RequestTooLarge when it would decode past
    `server.max_body_bytes`."""
    if not codings:
        return body
    limit = settings.max_body_bytes
    try:
        return await off_loop(
            len(body), settings.off_loop_bytes, content_encoding.decode, body, codings, limit
        )
    except content_encoding.TooLarge:
        raise RequestTooLarge(
            f"The request body decodes to more than the maximum allowed number of bytes ({limit})."
        ) from None


def codings_of(request: web.Request) -> list[str]:
    """The request's content codings, in the order they were applied."""
    values = request.headers.getall("Content-Encoding", ())
    return content_encoding.encodings(values) if values else []


def is_encoded(request: web.Request) -> bool:
    return bool(codings_of(request))


def invalid_field(param: str, message: str) -> InvalidRequest:
    error = InvalidRequest(message)
    error.param = param
    return error


def check_model(payload: dict[str, object]) -> None:
    """400 for a model name out of bounds (proxy/core/model_names.py)."""
    if "model" in payload:
        problem = model_problem(payload["model"])
        if problem is not None:
            raise invalid_field("model", problem)


def check_duplicates(raw: bytes, payload: dict[str, object]) -> None:
    """400 for a body where a field the proxy reads appears twice in one object: the
    proxy would read the last, an upstream may obey the first (proxy/core/duplicate_keys.py)."""
    name = duplicate_field(raw, payload)
    if name is not None:
        raise invalid_field(
            name,
            f"The request body has the key {name!r} more than once in one object; send it once.",
        )


def output_tokens(payload: dict[str, object]) -> int:
    """What the request may generate (its largest cap times its choices), or 400."""
    try:
        return output_reservation(payload)
    except BadRequestField as e:
        raise invalid_field(e.param, str(e)) from None
