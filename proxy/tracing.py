"""OpenTelemetry traces: off, and nothing imported, unless the standard OTEL_* variables
ask for them.

On when `OTEL_TRACES_EXPORTER` names `otlp` (or `console`), or when it is unset and an
OTLP endpoint is (`OTEL_EXPORTER_OTLP_ENDPOINT` / `OTEL_EXPORTER_OTLP_TRACES_ENDPOINT`);
`OTEL_SDK_DISABLED=true` or `OTEL_TRACES_EXPORTER=none` keep it off. Everything else is
read by the SDK itself where it reads it: the exporter's endpoint, headers, timeout and
compression, the batch processor's `OTEL_BSP_*`, the sampler (`OTEL_TRACES_SAMPLER`),
`OTEL_SERVICE_NAME` and `OTEL_RESOURCE_ATTRIBUTES`. The protocol is `http/protobuf`
(the exporter the install brings); `grpc` works when its exporter is installed.

`ACTIVE` is the process's `Tracing`, or None: every hook in the hot path (the server
middleware, the upstream client, the store's calls) tests it first and does nothing
more when it is None. With tracing on:

- a SERVER span per client request continues the client's `traceparent`/`tracestate`
  (`server_span`, through proxy/server/traces.py: its middleware, and `request_span` for
  a transport of its own, such as one WebSocket frame);
- a CLIENT span per upstream call (`client_span`), whose context replaces the client's
  `traceparent` on that call (`outgoing`);
- a span per Redis round trip (`store_span`);
- work that outlives its request (a summary made ahead) gets a trace of its own, linked
  to the request that asked for it (`detached`, for the context of its task).

Attributes are numbers, ids, model names and fixed words: never prompt text, tool
output, a header's value or a credential.
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import logging
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # at run time imported only when tracing is on (start-up time)
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.trace import Span, SpanContext

log = logging.getLogger(__name__)

ACTIVE: Tracing | None = None

TRACE_HEADERS = frozenset({"traceparent", "tracestate"})
_TRUE = ("true", "1", "yes")


def wanted(environ: Mapping[str, str]) -> bool:
    """Do the OTEL_* variables ask for traces?"""
    if environ.get("OTEL_SDK_DISABLED", "").strip().lower() in _TRUE:
        return False
    exporters = _exporters(environ)
    if exporters is not None:
        return bool(exporters - {"none"})
    return bool(
        environ.get("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", "").strip()
        or environ.get("OTEL_EXPORTER_OTLP_ENDPOINT", "").strip()
    )


def _exporters(environ: Mapping[str, str]) -> frozenset[str] | None:
    raw = environ.get("OTEL_TRACES_EXPORTER", "").strip().lower()
    if not raw:
        return None
    return frozenset(part.strip() for part in raw.split(",") if part.strip())


def _protocol(environ: Mapping[str, str]) -> str:
    for name in ("OTEL_EXPORTER_OTLP_TRACES_PROTOCOL", "OTEL_EXPORTER_OTLP_PROTOCOL"):
        value = environ.get(name, "").strip().lower()
        if value:
            return value
    return "http/protobuf"


_MISSING = (
    "OTEL_* asks for traces but OpenTelemetry's SDK cannot be imported (a dependency of"
    " compaction-proxy, removed from this install): reinstall compaction-proxy (or unset"
    " OTEL_TRACES_EXPORTER and the OTEL_EXPORTER_OTLP_*ENDPOINT variables)"
)


class TracingUnavailable(Exception):
    """Traces were asked for and cannot be had (the SDK removed from the install, a protocol it
    does not speak): the message says which and what to do."""


def _otlp_exporter(environ: Mapping[str, str]) -> Any:
    protocol = _protocol(environ)
    if protocol == "http/protobuf":
        try:
            from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
        except ImportError:
            raise TracingUnavailable(_MISSING) from None
        return OTLPSpanExporter()
    if protocol == "grpc":
        try:
            from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import (  # type: ignore[import-not-found,unused-ignore]
                OTLPSpanExporter as GrpcExporter,
            )
        except ImportError:
            raise TracingUnavailable(
                "OTEL_EXPORTER_OTLP_PROTOCOL=grpc needs opentelemetry-exporter-otlp-proto-grpc"
                " (or use http/protobuf, port 4318)"
            ) from None
        return GrpcExporter()
    raise TracingUnavailable(
        f"OTEL_EXPORTER_OTLP_PROTOCOL={protocol} is not supported: use http/protobuf (or grpc)"
    )


def from_environment(environ: Mapping[str, str], version: str = "") -> Tracing | None:
    """The tracing the environment asks for, or None (off). Raises TracingUnavailable
    when traces are asked for and cannot be had (see TracingUnavailable)."""
    if not wanted(environ):
        return None
    try:
        from opentelemetry.sdk.resources import Resource
        from opentelemetry.sdk.trace import TracerProvider
        from opentelemetry.sdk.trace.export import BatchSpanProcessor, ConsoleSpanExporter
    except ImportError:
        raise TracingUnavailable(_MISSING) from None
    own: dict[str, str] = {}
    if not environ.get("OTEL_SERVICE_NAME") and "service.name=" not in environ.get(
        "OTEL_RESOURCE_ATTRIBUTES", ""
    ):
        own["service.name"] = "compaction-proxy"
    if version:
        own["service.version"] = version
    # Resource.create reads OTEL_SERVICE_NAME and OTEL_RESOURCE_ATTRIBUTES itself.
    provider = TracerProvider(resource=Resource.create(own))
    exporters = _exporters(environ) or frozenset({"otlp"})
    for name in sorted(exporters - {"none"}):
        if name == "otlp":
            exporter = _otlp_exporter(environ)
        elif name == "console":
            exporter = ConsoleSpanExporter()
        else:
            raise TracingUnavailable(
                f"OTEL_TRACES_EXPORTER={name} is not supported: use otlp (or console)"
            )
        # The batch processor reads OTEL_BSP_* (delay, queue and batch sizes, timeout).
        provider.add_span_processor(BatchSpanProcessor(exporter))
    return Tracing(provider)


class Tracing:
    """The process's tracer and W3C propagator (only built when tracing is on)."""

    def __init__(self, provider: TracerProvider) -> None:
        try:
            from opentelemetry import context, trace
            from opentelemetry.trace import Link, SpanKind, Status, StatusCode
            from opentelemetry.trace.propagation.tracecontext import (
                TraceContextTextMapPropagator,
            )
        except ImportError:
            raise TracingUnavailable(_MISSING) from None

        self.provider = provider
        self.tracer = provider.get_tracer("compaction-proxy")
        self.propagator = TraceContextTextMapPropagator()
        self._trace = trace
        self._context = context
        self._kind = SpanKind
        self._link = Link
        self._status = Status
        self._error = StatusCode.ERROR

    # -- spans -----------------------------------------------------------------------

    @contextlib.contextmanager
    def server_span(
        self,
        name: str,
        headers: Mapping[str, str],
        attributes: Mapping[str, Any] | None = None,
    ) -> Iterator[Span]:
        """A SERVER span, current while the block runs, continuing the trace the client's
        `traceparent`/`tracestate` headers carry (a new trace without them). For any
        transport: the HTTP routes use it through proxy/server/traces.py; a WebSocket
        frame can open one with the upgrade's headers."""
        parent = self.propagator.extract(headers)
        with self.tracer.start_as_current_span(
            name,
            context=parent,
            kind=self._kind.SERVER,
            attributes=attributes,
            record_exception=False,
            set_status_on_exception=False,
        ) as span:
            yield span

    @contextlib.contextmanager
    def client_span(self, name: str, attributes: Mapping[str, Any]) -> Iterator[Span]:
        """A CLIENT span for one upstream call, child of the current span; not ended by
        the block (the call's answer ends it: TracedResponse, proxy/server/upstream.py)."""
        span = self.tracer.start_span(name, kind=self._kind.CLIENT, attributes=attributes)
        with self._trace.use_span(span, end_on_exit=False):
            yield span

    @contextlib.contextmanager
    def store_span(self, operation: str) -> Iterator[Span | None]:
        """A CLIENT span for one Redis round trip (a command, a pipeline or a script) made
        for a traced request or its background work; none for the process's own upkeep
        (start-up checks, heartbeats, calibration flushes), which has no span around it."""
        if not self._trace.get_current_span().is_recording():
            yield None
            return
        with self.tracer.start_as_current_span(
            f"redis {operation}",
            kind=self._kind.CLIENT,
            attributes={"db.system.name": "redis", "db.operation.name": operation},
            record_exception=False,
            set_status_on_exception=False,
        ) as span:
            try:
                yield span
            except BaseException as error:
                self.failed(span, error)
                raise

    def failed(self, span: Span, error: BaseException | str) -> None:
        """Mark a span failed with the error's type only (its message may quote data)."""
        kind = error if isinstance(error, str) else type(error).__qualname__
        span.set_attribute("error.type", kind)
        span.set_status(self._status(self._error))

    def outgoing(self, headers: Sequence[tuple[str, str]]) -> list[tuple[str, str]]:
        """`headers` with the current span's `traceparent`/`tracestate` in place of the
        client's: the upstream sees the proxy's span as the caller."""
        out = [(n, v) for n, v in headers if n.lower() not in TRACE_HEADERS]
        carrier: dict[str, str] = {}
        self.propagator.inject(carrier)
        out.extend(carrier.items())
        return out

    # -- work that outlives its request ------------------------------------------------

    def here(self) -> SpanContext | None:
        """The current span's context, to link later work to (None outside a span)."""
        context = self._trace.get_current_span().get_span_context()
        return context if context.is_valid else None

    def detached(
        self, name: str, origin: SpanContext | None, context: contextvars.Context
    ) -> Callable[[asyncio.Future[Any]], None]:
        """Make `context` (that of a task about to be created) run under a root span of
        a trace of its own, linked to `origin` (the span of the request that asked for
        the work); returns the task's done callback, which ends the span."""
        links = [self._link(origin)] if origin is not None else None
        span = self.tracer.start_span(
            name, context=self._context.Context(), kind=self._kind.INTERNAL, links=links
        )
        context.run(self._context.attach, self._trace.set_span_in_context(span))

        def done(task: asyncio.Future[Any]) -> None:
            if task.cancelled():
                self.failed(span, "cancelled")
            elif (error := task.exception()) is not None:
                self.failed(span, error)
            span.end()

        return done

    # -- events ----------------------------------------------------------------------

    def event(self, name: str, attributes: Mapping[str, Any]) -> None:
        """An event on the current span (a fold, a pack)."""
        span = self._trace.get_current_span()
        if span.is_recording():
            span.add_event(name, attributes)

    def note(self, attributes: Mapping[str, Any]) -> None:
        """Attributes on the current span (when it is sampled)."""
        span = self._trace.get_current_span()
        if span.is_recording():
            span.set_attributes(attributes)

    # -- lifetime --------------------------------------------------------------------

    def shutdown(self, timeout_ms: int = 5_000) -> None:
        """Export what is still queued (at most `timeout_ms`), then stop. Blocks: run it
        off the event loop."""
        try:
            self.provider.force_flush(timeout_ms)
        finally:
            self.provider.shutdown()


def install(tracing: Tracing | None) -> None:
    global ACTIVE
    ACTIVE = tracing


def event(name: str, attributes: Mapping[str, Any]) -> None:
    """An event on the current span, when tracing is on."""
    if ACTIVE is not None:
        ACTIVE.event(name, attributes)


def note(attributes: Mapping[str, Any]) -> None:
    """Attributes on the current span, when tracing is on (and it is sampled)."""
    if ACTIVE is not None:
        ACTIVE.note(attributes)
