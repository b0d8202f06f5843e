"""A real OTLP/HTTP trace receiver on a loopback port: `POST /v1/traces` with an
`ExportTraceServiceRequest` protobuf (as the proxy's exporter sends it), decoded into
plain `ReceivedSpan`s. The raw bodies are kept too, for searching them byte by byte."""

from __future__ import annotations

import asyncio
import gzip
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

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
