"""The proxy's own error answers, in the Messages API's error shape.

Upstream errors never come through here: they are relayed unchanged. The proxy answers
with an error itself only for what it checks (400 invalid JSON, 413 too large) and when
it cannot get an answer from the upstream at all: 502 (connection failed) and 504 (no
answer within the response timeout), both with error type `api_error`. Both are 5xx, so
the anthropic SDK retries them like any upstream 5xx; `x-should-retry: true` says so
explicitly. They are not caused by the proxy's own parts but by the road behind it.
"""

from __future__ import annotations

import secrets

import aiohttp
import orjson
from aiohttp import web


def new_request_id() -> str:
    return "req_proxy_" + secrets.token_hex(12)


def error_body(error_type: str, message: str, request_id: str) -> bytes:
    return orjson.dumps(
        {
            "type": "error",
            "error": {"type": error_type, "message": message},
            "request_id": request_id,
        }
    )


def error_response(
    status: int,
    error_type: str,
    message: str,
    *,
    retry: bool | None = None,
    close: bool = False,
) -> web.Response:
    """An API-shaped error. `close` ends the connection after it (used when the client's
    body was not read, so nothing of it is left to parse as the next request)."""
    request_id = new_request_id()
    response = web.Response(
        status=status,
        body=error_body(error_type, message, request_id),
        content_type="application/json",
        headers={"request-id": request_id},
    )
    if retry is not None:
        response.headers["x-should-retry"] = "true" if retry else "false"
    if close:
        response.force_close()
    return response


def invalid_request(message: str) -> web.Response:
    return error_response(400, "invalid_request_error", message)


def not_a_path(target: str) -> web.Response:
    # An absolute-form target (`POST http://host/...`) would let a request pick the
    # upstream; the upstream comes only from the configuration.
    return invalid_request(f"The request target must be a path, got {target[:200]!r}.")


def request_too_large(limit: int) -> web.Response:
    return error_response(
        413,
        "request_too_large",
        f"Request exceeds the maximum allowed number of bytes ({limit}).",
        close=True,
    )


def upstream_unreachable(upstream: str, reason: str) -> web.Response:
    return error_response(
        502,
        "api_error",
        f"compaction-proxy could not reach the upstream {upstream}: {reason}",
        retry=True,
    )


def upstream_timeout(upstream: str, seconds: float) -> web.Response:
    return error_response(
        504,
        "api_error",
        f"compaction-proxy got no answer from the upstream {upstream} within {seconds:g} s",
        retry=True,
    )


def stream_error_event(error_type: str, message: str) -> bytes:
    """An SSE `event: error` in the API's shape, to end a stream the proxy must cut."""
    data = orjson.dumps({"type": "error", "error": {"type": error_type, "message": message}})
    return b"event: error\ndata: " + data + b"\n\n"


def for_upstream_failure(exc: BaseException, upstream: str, read_timeout: float) -> web.Response:
    """The answer when the upstream gave no usable response (nothing sent to the client
    yet): 504 when it stayed silent past the read timeout, 502 for everything else."""
    if isinstance(exc, aiohttp.SocketTimeoutError):
        return upstream_timeout(upstream, read_timeout)
    if isinstance(exc, aiohttp.ConnectionTimeoutError):
        return upstream_unreachable(upstream, "connection timed out")
    if isinstance(exc, TimeoutError):
        return upstream_timeout(upstream, read_timeout)
    if isinstance(exc, aiohttp.ClientConnectorError):
        return upstream_unreachable(upstream, f"connection failed ({exc.os_error.strerror})")
    if isinstance(exc, aiohttp.ServerDisconnectedError):
        return upstream_unreachable(upstream, "the connection closed before an answer")
    return upstream_unreachable(upstream, type(exc).__name__)


# -- OpenAI Chat Completions: the same errors in `{"error": {message, type, param, code}}` --

_OPENAI_TYPES = {"api_error": "server_error", "overloaded_error": "server_error"}


def openai_error(
    status: int,
    message: str,
    error_type: str,
    *,
    code: str | None = None,
    param: str | None = None,
    retry: bool | None = None,
    close: bool = False,
) -> web.Response:
    request_id = new_request_id()
    body = {"error": {"message": message, "type": error_type, "param": param, "code": code}}
    response = web.Response(
        status=status,
        body=orjson.dumps(body),
        content_type="application/json",
        headers={"x-request-id": request_id},
    )
    if retry is not None:
        response.headers["x-should-retry"] = "true" if retry else "false"
    if close:
        response.force_close()
    return response


def as_openai(response: web.Response) -> web.Response:
    """One of the proxy's own (Messages-shaped) errors above, in OpenAI's shape."""
    assert isinstance(response.body, bytes)
    error = orjson.loads(response.body)["error"]
    kind = str(error.get("type", "api_error"))
    retry = response.headers.get("x-should-retry")
    return openai_error(
        response.status,
        str(error.get("message", "")),
        _OPENAI_TYPES.get(kind, kind),
        code=kind if kind == "request_too_large" else None,
        retry=None if retry is None else retry == "true",
        close=response.keep_alive is False,
    )
