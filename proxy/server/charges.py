"""The usage meter of the request being handled, fed from wherever upstream bytes pass.

The budget admission makes a `UsageMeter` current (a context variable, so it follows the
handler's task); the relay, the read_result loop and the summariser feed it with the one
line calls below, without the meter being passed down. With no meter current (budgets not
in play, other routes, benchmarks) they do nothing.
"""

from __future__ import annotations

from collections.abc import Mapping
from contextvars import ContextVar, Token
from typing import Any

from proxy.core.meter import UsageMeter
from proxy.server import observe

_current: ContextVar[UsageMeter | None] = ContextVar("compaction_proxy_meter", default=None)


def begin(meter: UsageMeter) -> Token[UsageMeter | None]:
    return _current.set(meter)


def end(token: Token[UsageMeter | None]) -> None:
    _current.reset(token)


def upstream_chunk(chunk: bytes) -> None:
    """Bytes of a 200 event-stream answer from the upstream."""
    meter = _current.get()
    if meter is not None:
        meter.chunk(chunk)


def upstream_body(body: bytes) -> None:
    """A whole 200 JSON answer from the upstream."""
    meter = _current.get()
    if meter is not None:
        meter.body(body)


def summariser_usage(usage: Mapping[str, Any]) -> None:
    """The usage of a summariser call made for this request (charged to its caller)."""
    observe.summariser_usage(usage)  # and priced in the admin stats
    meter = _current.get()
    if meter is not None:
        meter.summariser(usage)
