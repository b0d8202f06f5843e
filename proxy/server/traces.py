"""The HTTP server's traces (proxy/tracing.py holds the tracer; off, nothing here runs).

- `trace_requests`, a middleware installed only with tracing on: one SERVER span per
  client request (health probes and scrapes left out), continuing the client's trace,
  named and described with the GenAI semantic conventions plus `compaction.*`: what the
  proxy did, from the request's record (proxy/server/record.py) once it is answered.
- `request_span`, the same span for any transport: a WebSocket frame gets one with a
  single `with` (it does nothing with tracing off).
- the upstream calls' CLIENT spans are opened by the upstream client
  (proxy/server/upstream.py), the Redis calls' by the store (proxy/store/redis.py);
- `tracing_lifetime`: installs the tracer for the app's life; on shutdown the spans
  still queued are exported, within a bound.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import threading
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from aiohttp import web

from proxy import tracing
from proxy.core.identity import tenant_of
from proxy.core.usage import Usage
from proxy.server import record as records
from proxy.server.caller import caller_of
from proxy.server.record import RequestRecord

if TYPE_CHECKING:  # at run time imported only when tracing is on (proxy/tracing.py)
    from opentelemetry.trace import Span

log = logging.getLogger(__name__)

FLUSH_SECONDS = 5.0  # the longest shutdown waits for the last spans to be exported
_UNTRACED = frozenset({"/healthz", "/readyz", "/metrics"})

# route -> (gen_ai.provider.name, gen_ai.operation.name or "" when not an inference)
GENAI_ROUTES: Mapping[str, tuple[str, str]] = {
    "/v1/messages": ("anthropic", "chat"),
    "/v1/messages/count_tokens": ("anthropic", ""),
    "/v1/chat/completions": ("openai", "chat"),
    "/v1/responses": ("openai", "chat"),
    # Gemini's calls on a model (generateContent, countTokens, ...: the method is in the
    # path, not the route)
    "/v1beta/models/{target}": ("gcp.gemini", ""),
    "/v1/models/{target}": ("gcp.gemini", ""),
}

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


@web.middleware
async def trace_requests(request: web.Request, handler: Handler) -> web.StreamResponse:
    if tracing.ACTIVE is None or request.path in _UNTRACED:
        return await handler(request)
    with request_span(request, records.current()) as outcome:
        response = await handler(request)
        outcome.status = response.status
        return response


@dataclass(slots=True)
class Outcome:
    """How the traced request or frame ended: set `status` (an HTTP status; for a
    WebSocket frame, the status its error event names, else 200)."""

    status: int = 500


@contextlib.contextmanager
def request_span(
    request: web.Request,
    record: RequestRecord | None,
    *,
    route: str | None = None,
    transport: str = "http",
) -> Iterator[Outcome]:
    """One SERVER span around one client request, or one message of a longer exchange
    (a WebSocket `response.create` frame: give the upgrade's request, the frame's own
    record, `transport="websocket"`). It continues the trace of the request's
    `traceparent`; once the block ends it is described from `record` (GenAI and
    compaction attributes) and given `Outcome.status`. An exception sets the status
    (HTTPException's; 499 for a client gone before its answer's end; else what the block
    set, 500 by default) and goes on. With tracing off it only yields an `Outcome`:

        with request_span(upgrade, frame_record, transport="websocket") as outcome:
            ...  # the frame's work
            outcome.status = 200
    """
    outcome = Outcome()
    active = tracing.ACTIVE
    if active is None:
        yield outcome
        return
    route = route or (record.route if record is not None else "other")
    attributes: dict[str, Any] = {
        "http.request.method": request.method,
        "http.route": route,
        "url.path": request.path,  # never the query string (it may carry a key)
    }
    if transport != "http":
        attributes["network.protocol.name"] = transport
    provider, operation = GENAI_ROUTES.get(route, ("", ""))
    name = f"{request.method} {route}" if transport == "http" else f"{transport} {route}"
    if provider:
        attributes["gen_ai.provider.name"] = provider
        attributes["gen_ai.system"] = provider  # the older name, for older backends
    if operation:
        attributes["gen_ai.operation.name"] = operation
        name = operation
    with active.server_span(name, request.headers, attributes) as span:
        if record is not None and span.is_recording():  # for the metrics' exemplars
            record.trace_id = format(span.get_span_context().trace_id, "032x")
        try:
            yield outcome
        except web.HTTPException as e:
            outcome.status = e.status
            raise
        except asyncio.CancelledError:
            outcome.status = 200 if record is not None and record.meter.complete else 499
            raise
        except BaseException:
            # Any other failure is a 500 unless the block said what it was (a WebSocket
            # frame whose client or upstream went away: 499, 502).
            raise
        finally:
            status = outcome.status
            span.set_attribute("http.response.status_code", status)
            if status >= 500 or status == 499:
                active.failed(span, str(status))
            if record is not None and span.is_recording():  # (not sampled: nothing to say)
                describe(span, record, request, operation if provider else None)


def describe(
    span: Span, record: RequestRecord, request: web.Request, operation: str | None
) -> None:
    """The request's GenAI and compaction attributes, from its record (numbers, ids,
    model names and fixed words only). `operation`: the GenAI operation's name ("" for a
    route of a GenAI API that is no inference), None for any other route."""
    genai = operation is not None
    out: dict[str, Any] = {}  # set at once: one pass of the SDK's checks, not one each
    if record.model and genai:
        if operation:  # named as the conventions say: "{operation} {model}"
            span.update_name(f"{operation} {record.model}")
        out["gen_ai.request.model"] = record.model
    if record.meter.response_model:
        out["gen_ai.response.model"] = record.meter.response_model
    if record.meter.rounds:
        usage = record.meter.total()
        # The conventions' input includes cached input (Anthropic's input_tokens does not).
        out["gen_ai.usage.input_tokens"] = usage.total_input
        out["gen_ai.usage.output_tokens"] = usage.output_tokens
        out["gen_ai.usage.cache_read.input_tokens"] = usage.cache_read_input_tokens
        out["gen_ai.usage.cache_creation.input_tokens"] = usage.cache_creation_input_tokens
    if record.upstream_request_id:
        out["gen_ai.response.id"] = record.upstream_request_id
    out["compaction.request_id"] = record.request_id
    # What did not happen is left out (fewer attributes to export on every request).
    for name, value in record.compaction_fields().items():
        out[f"compaction.{name}"] = value
    if record.summariser_calls:
        out["compaction.summariser_calls"] = record.summariser_calls
        out["compaction.summariser_failures"] = record.summariser_failures
    if record.meter.extra:  # what the summariser calls made for this request used
        spent = Usage()
        for usage in record.meter.extra:
            spent = spent.plus(usage)
        out["compaction.summariser.input_tokens"] = spent.total_input
        out["compaction.summariser.output_tokens"] = spent.output_tokens
    if record.conversation:
        out["compaction.conversation"] = record.conversation
    if record.key_id:
        out["compaction.key_id"] = record.key_id  # the id, never the key
    if record.team:
        out["compaction.team"] = record.team
    if record.rejected:
        out["compaction.rejected"] = record.rejected
    if genai:
        # A hash of the key or credential (proxy/core/identity.py), never the credential.
        tenant = caller_of(request).tenant or tenant_of(request.headers)
        out["compaction.tenant"] = tenant
    span.set_attributes(out)


# -- lifetime --------------------------------------------------------------------------


def tracing_lifetime(
    active: tracing.Tracing,
) -> Callable[[web.Application], AsyncIterator[None]]:
    async def lifetime(app: web.Application) -> AsyncIterator[None]:
        tracing.install(active)
        try:
            yield
        finally:
            tracing.install(None)
            await flush(active, FLUSH_SECONDS)

    return lifetime


async def flush(active: tracing.Tracing, seconds: float) -> None:
    """Export the spans still queued and stop the exporter, waiting at most `seconds`
    (in a daemon thread: an exporter that hangs never holds the process up)."""
    loop = asyncio.get_running_loop()
    done = loop.create_future()

    def finished() -> None:
        if not done.done():
            done.set_result(None)

    def run() -> None:
        try:
            active.shutdown(int(seconds * 1000))
        except Exception:
            log.exception("exporting the last spans failed")
        finally:
            with contextlib.suppress(RuntimeError):  # the loop closed meanwhile
                loop.call_soon_threadsafe(finished)

    threading.Thread(target=run, name="otel-flush", daemon=True).start()
    try:
        await asyncio.wait_for(done, seconds + 1.0)
    except TimeoutError:
        log.warning("the last spans were not exported within %.0f s", seconds)
