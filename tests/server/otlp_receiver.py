"""A real OTLP/HTTP trace receiver on a loopback port: `POST /v1/traces` with an
`ExportTraceServiceRequest` protobuf (as the proxy's exporter sends it), decoded into
plain `ReceivedSpan`s. The raw bodies are kept too, for searching them byte by byte.
The `receiver` fixture serves one for a test; the helpers below read its spans."""

from __future__ import annotations

import asyncio
import gzip
import secrets
import time
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from typing import Any

import pytest
from aiohttp import web
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
    ExportTraceServiceRequest,
    ExportTraceServiceResponse,
)
from opentelemetry.proto.common.v1.common_pb2 import AnyValue, KeyValue

SERVER, CLIENT, INTERNAL = 2, 3, 1  # Span.SpanKind values


def _value(value: AnyValue) -> Any:
    kind = value.WhichOneof("value")
    if kind == "array_value":
        return [_value(v) for v in value.array_value.values]
    if kind == "kvlist_value":
        return _attributes(value.kvlist_value.values)
    return getattr(value, kind) if kind else None


def _attributes(pairs: Any) -> dict[str, Any]:
    return {kv.key: _value(kv.value) for kv in pairs if isinstance(kv, KeyValue)}


@dataclass
class ReceivedSpan:
    name: str
    kind: int
    trace_id: str  # hex
    span_id: str
    parent_span_id: str  # "" for a root
    trace_state: str
    attributes: dict[str, Any]
    events: list[tuple[str, dict[str, Any]]]
    links: list[tuple[str, str]]  # (trace id, span id)
    status_code: int  # 0 unset, 1 ok, 2 error
    resource: dict[str, Any]
    start_ns: int = 0
    end_ns: int = 0

    def attr(self, name: str) -> Any:
        return self.attributes.get(name)


@dataclass
class Receiver:
    url: str = ""
    bodies: list[bytes] = field(default_factory=list)
    spans: list[ReceivedSpan] = field(default_factory=list)
    paths: list[str] = field(default_factory=list)

    def add(self, raw: bytes) -> None:
        self.bodies.append(raw)
        request = ExportTraceServiceRequest()
        request.ParseFromString(raw)
        for resource_spans in request.resource_spans:
            resource = _attributes(resource_spans.resource.attributes)
            for scope_spans in resource_spans.scope_spans:
                for span in scope_spans.spans:
                    self.spans.append(
                        ReceivedSpan(
                            name=span.name,
                            kind=span.kind,
                            trace_id=span.trace_id.hex(),
                            span_id=span.span_id.hex(),
                            parent_span_id=span.parent_span_id.hex(),
                            trace_state=span.trace_state,
                            attributes=_attributes(span.attributes),
                            events=[(e.name, _attributes(e.attributes)) for e in span.events],
                            links=[(lk.trace_id.hex(), lk.span_id.hex()) for lk in span.links],
                            status_code=span.status.code,
                            resource=resource,
                            start_ns=span.start_time_unix_nano,
                            end_ns=span.end_time_unix_nano,
                        )
                    )

    async def wait_for(
        self, found: Callable[[list[ReceivedSpan]], bool], seconds: float = 15.0
    ) -> list[ReceivedSpan]:
        """The spans received, once `found` says they are all there (else an error)."""
        deadline = time.monotonic() + seconds
        while not found(self.spans):
            if time.monotonic() > deadline:
                names = sorted({s.name for s in self.spans})
                raise AssertionError(f"spans never arrived; received {names}")
            await asyncio.sleep(0.05)
        return self.spans

    def where(self, **attributes: Any) -> list[ReceivedSpan]:
        return [s for s in self.spans if all(s.attr(k) == v for k, v in attributes.items())]


def create_app(receiver: Receiver) -> web.Application:
    async def traces(request: web.Request) -> web.Response:
        raw = await request.read()
        if request.headers.get("Content-Encoding") == "gzip":
            raw = gzip.decompress(raw)
        assert request.content_type == "application/x-protobuf", request.content_type
        receiver.paths.append(request.path)
        receiver.add(raw)
        body = ExportTraceServiceResponse().SerializeToString()
        return web.Response(body=body, content_type="application/x-protobuf")

    app = web.Application(client_max_size=64 * 2**20)
    app.router.add_post("/v1/traces", traces)
    return app


async def start_receiver() -> tuple[Receiver, web.AppRunner]:
    receiver = Receiver()
    runner = web.AppRunner(create_app(receiver))
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    host, port = runner.addresses[0][:2]
    receiver.url = f"http://{host}:{port}"
    return receiver, runner


@pytest.fixture
async def receiver() -> AsyncIterator[Receiver]:
    received, runner = await start_receiver()
    yield received
    await runner.cleanup()


def client_context() -> tuple[str, str, str]:
    """(trace id, span id, traceparent) of a client's span."""
    trace_id, span_id = secrets.token_hex(16), secrets.token_hex(8)
    return trace_id, span_id, f"00-{trace_id}-{span_id}-01"


def traceparent_of(span: ReceivedSpan) -> str:
    """The span's W3C context, flags left out (a root span of the proxy's own may set
    the random-trace-id flag as well as sampled)."""
    return f"00-{span.trace_id}-{span.span_id}"


def contexts(recorded: list[Any]) -> set[str]:
    """The traceparents the upstream received, flags left out."""
    return {r.headers.get("traceparent", "")[:52] for r in recorded}


def server_spans(spans: list[ReceivedSpan], trace_id: str) -> list[ReceivedSpan]:
    return [s for s in spans if s.kind == SERVER and s.trace_id == trace_id]


def children(spans: list[ReceivedSpan], parent: ReceivedSpan, kind: int) -> list[ReceivedSpan]:
    return [s for s in spans if s.parent_span_id == parent.span_id and s.kind == kind]


def upstream_calls(spans: list[ReceivedSpan], parent: ReceivedSpan) -> list[ReceivedSpan]:
    """The CLIENT spans of the upstream calls made under `parent` (Redis ones left out)."""
    return [s for s in children(spans, parent, CLIENT) if s.attr("compaction.purpose")]
