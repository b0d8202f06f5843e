"""One structured log line per request, and the process's log format.

`server.log_format` picks "human" (`key=value` pairs after the usual time, level and
logger) or "json" (one JSON object per line, for log shippers; then every log line of
the process is JSON). A request line holds ids, the route, status, strategy, token counts
and timings: numbers and fixed words only, never prompt text, headers or credentials.
Health probes and /metrics scrapes are logged at DEBUG so they do not drown the rest.
aiohttp's own server logs a malformed request with the offending raw line (which may be
a header holding a credential): such lines keep only the error's kind (`ScrubHttpErrors`).
"""

from __future__ import annotations

import logging
import sys
import time
from typing import Any
from urllib.parse import urlsplit, urlunsplit

import orjson
from aiohttp import web
from aiohttp.http_exceptions import HttpProcessingError

from proxy.server.record import RequestRecord

REQUEST_LOGGER = "compaction_proxy.requests"
_PROBES = frozenset({"/healthz", "/readyz", "/metrics"})


def request_fields(record: RequestRecord, status: int, ended: float) -> dict[str, Any]:
    fields: dict[str, Any] = {
        "request_id": record.request_id,
        "method": record.method,
        "route": record.route,
        "status": status,
        "duration_ms": round((ended - record.started) * 1000, 2),
    }
    if record.route in _PROBES:
        return fields
    fields["proxy_ms"] = round(record.own_seconds(ended) * 1000, 2)
    if record.upstream_sent is not None and record.upstream_answered is not None:
        fields["upstream_ms"] = round((record.upstream_answered - record.upstream_sent) * 1000, 2)
    if record.upstream_request_id:
        fields["upstream_request_id"] = record.upstream_request_id
    fields.update(record.compaction_fields())
    if record.meter.rounds:
        for key, value in record.meter.total().as_dict().items():
            if isinstance(value, int):
                fields[key] = value
    if record.summariser_calls or record.summariser_failures:
        fields["summariser_calls"] = record.summariser_calls
        fields["summariser_failures"] = record.summariser_failures
    return fields


class RequestLog:
    def __init__(self, fmt: str = "human") -> None:
        self.format = fmt
        self.logger = logging.getLogger(REQUEST_LOGGER)

    def emit(self, record: RequestRecord, status: int, ended: float) -> None:
        level = logging.DEBUG if record.route in _PROBES else logging.INFO
        if not self.logger.isEnabledFor(level):
            return
        fields = request_fields(record, status, ended)
        if self.format == "json":
            # The JSON formatter puts these fields at the top level of the line.
            self.logger.log(level, "request", extra={"fields": fields})
        else:
            text = " ".join(f"{k}={v}" for k, v in fields.items())
            self.logger.log(level, "request %s", text, extra={"fields": fields})


REQUEST_LOG = web.AppKey("request_log", RequestLog)


class JSONFormatter(logging.Formatter):
    """One JSON object per line: time, level, logger, message, and a request's fields."""

    def format(self, record: logging.LogRecord) -> str:
        line: dict[str, Any] = {
            "ts": time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(record.created))
            + f".{int(record.msecs):03d}Z",
            "level": record.levelname.lower(),
            "logger": record.name,
            "message": record.getMessage(),
        }
        fields = getattr(record, "fields", None)
        if isinstance(fields, dict):
            line.update(fields)
        if record.exc_info:
            line["exception"] = self.formatException(record.exc_info)
        return orjson.dumps(line).decode()


class ScrubHttpErrors(logging.Filter):
    """aiohttp logs a request it cannot parse with a traceback quoting the raw bytes (a
    header line with an API key in it, say). Keep the line, drop the bytes: the error's
    kind and status only, at INFO (a client's mistake, not the proxy's)."""

    def filter(self, record: logging.LogRecord) -> bool:
        if not record.name.startswith("aiohttp") or not record.exc_info:
            return True
        error = record.exc_info[1]
        if isinstance(error, HttpProcessingError):
            record.msg = f"{record.getMessage()}: malformed request ({type(error).__name__},"
            record.msg += f" {error.code})"
            record.args = ()
            record.exc_info = None
            record.exc_text = None
            if record.levelno > logging.INFO:
                record.levelno, record.levelname = logging.INFO, "INFO"
        return True


def configure(fmt: str, level: str | int = "INFO") -> None:
    """Set up the root logger for `serve` (stderr, the chosen format)."""
    handler = logging.StreamHandler(sys.stderr)
    handler.addFilter(ScrubHttpErrors())
    if fmt == "json":
        handler.setFormatter(JSONFormatter())
    else:
        handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
    root = logging.getLogger()
    for old in list(root.handlers):
        root.removeHandler(old)
    root.addHandler(handler)
    root.setLevel(level)


def redacted_url(url: str) -> str:
    """A URL fit for a log line, an answer or /readyz: any password in it replaced by
    `***` (a user name alone, which may be a token, too)."""
    try:
        parts = urlsplit(url)
        password = parts.password
    except ValueError:
        return "<unparseable URL>"
    if "@" not in parts.netloc:
        return url
    host = parts.netloc.rpartition("@")[2]
    user = "***" if password is None else f"{parts.username or ''}:***"
    return urlunsplit(parts._replace(netloc=f"{user}@{host}"))
