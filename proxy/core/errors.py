"""The proxy's own errors: one tree, rendered by each wire format in its API's shape.

Upstream answers (errors included) are relayed unchanged and never pass through here.
These are the answers the proxy gives itself, when it checks something (the request, a
key, a budget) or cannot get an answer from the upstream at all. Each error knows its
HTTP status and the Anthropic error type naming it; proxy/wire/* render it (Messages:
`{"type":"error","error":{"type","message"}}`, OpenAI: `{"error":{"message","type",
"param","code"}}`), the server adds the headers.

    ProxyError
    ├── ClientError           the request cannot be served as sent (4xx)
    │   ├── InvalidRequest    400 invalid_request_error (bad JSON, bad fields, a bad target)
    │   ├── ContextTooLong    400 invalid_request_error: nothing fits the window
    │   ├── RequestTooLarge   413 request_too_large
    │   ├── RequestTimeout    408: the body did not arrive in time (the connection closes)
    │   ├── UnsupportedEncoding 415: a Content-Encoding a budget cannot look through
    │   ├── ExpectationFailed 417
    │   ├── UpgradeRequired   426: a WebSocket asked for where only HTTP is served
    │   ├── NotAuthenticated  401 authentication_error
    │   ├── Forbidden         403 permission_error
    │   └── NotFound          404 not_found_error (a path the proxy does not serve)
    ├── BudgetRefused         429 rate_limit_error, with retry-after
    ├── StoreUnavailable      503 api_error: the proxy's store cannot check what it must
    └── UpstreamError         the road behind the proxy (5xx, the SDKs retry them)
        ├── UpstreamUnreachable 502 api_error
        ├── UpstreamTimeout     504 api_error
        └── UpstreamGarbage     502 api_error: an answer the proxy cannot read
"""

from __future__ import annotations


class ProxyError(Exception):
    status = 500
    type = "api_error"  # Anthropic's error type; OpenAI renderers map it
    code: str | None = None  # OpenAI's `code`, when the API has one for it
    param: str | None = None
    retry: bool | None = None  # x-should-retry, when the proxy has a view
    close = False  # end the connection after answering (the body was not read)

    def __init__(self, message: str, *, retry_after: int | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.retry_after = retry_after  # seconds, for retry-after

    def headers(self) -> dict[str, str]:
        out: dict[str, str] = {}
        if self.retry is not None:
            out["x-should-retry"] = "true" if self.retry else "false"
        if self.retry_after is not None:
            out["retry-after"] = str(self.retry_after)
        return out


class ClientError(ProxyError):
    status = 400
    type = "invalid_request_error"
    retry = None


class InvalidRequest(ClientError):
    pass


class ContextTooLong(ClientError):
    code = "context_length_exceeded"
    param = "messages"


class RequestTooLarge(ClientError):
    status = 413
    type = "request_too_large"
    code = "request_too_large"
    close = True  # the body was not read: nothing of it may be parsed as the next request


class RequestTimeout(ClientError):
    status = 408
    code = "request_timeout"
    close = True  # the rest of the body may still come: nothing of it is a next request


class UnsupportedEncoding(ClientError):
    status = 415
    code = "unsupported_content_encoding"


class ExpectationFailed(ClientError):
    status = 417


class UpgradeRequired(ClientError):
    status = 426
    code = "websocket_not_supported"


class NotAuthenticated(ClientError):
    status = 401
    type = "authentication_error"


class Forbidden(ClientError):
    status = 403
    type = "permission_error"


class NotFound(ClientError):
    status = 404
    type = "not_found_error"


class BudgetRefused(ProxyError):
    status = 429
    type = "rate_limit_error"
    retry = True


class StoreUnavailable(ProxyError):
    status = 503
    type = "api_error"
    retry = True


class UpstreamError(ProxyError):
    status = 502
    type = "api_error"
    retry = True


class UpstreamUnreachable(UpstreamError):
    pass


class UpstreamTimeout(UpstreamError):
    status = 504


class UpstreamGarbage(UpstreamError):
    pass
