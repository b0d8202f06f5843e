"""The metrics every request updates are plain numbers exported at each scrape
(proxy/server/metrics.py, PerRequest): what /metrics says of them is what
prometheus_client's own Counter and Histogram say of the same requests, in both
exposition formats, exemplars (traced requests' ids) included."""

from __future__ import annotations

import re

from hypothesis import given, settings
from hypothesis import strategies as st
from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from prometheus_client.openmetrics import exposition as openmetrics

from proxy.core.usage import Usage, UsageMeter
from proxy.server.metrics import _SECONDS, EXEMPLAR_LABEL, NS, Metrics
from proxy.server.record import RequestRecord
from proxy.wire import ANTHROPIC

ROUTES = ["/v1/messages", "/v1/chat/completions", "other", "/healthz"]
SECONDS = st.one_of(st.sampled_from([*_SECONDS, 0.0, 1e-6, 1e4]), st.floats(0, 400))
REQUEST = st.tuples(
    st.sampled_from(ROUTES),
    st.sampled_from([200, 400, 499, 502]),
    SECONDS,  # duration
    st.none() | st.tuples(SECONDS, SECONDS),  # (own time, upstream latency)
    st.none() | st.tuples(*(st.integers(0, 10**6),) * 4),  # usage
    st.booleans(),  # traced
)


def _reference(requests: list[tuple]) -> CollectorRegistry:  # type: ignore[type-arg]
    """The same requests, counted with prometheus_client's own metrics."""
    r = CollectorRegistry(auto_describe=True)
    counted = Counter(
        f"{NS}_requests", "Requests answered, by route and status.", ["route", "status"],
        registry=r,
    )  # fmt: skip
    texts = Metrics().registry.collect()
    helps = {m.name: m.documentation for m in texts}
    timed = [
        Histogram(f"{NS}_{name}", helps[f"{NS}_{name}"], ["route"], buckets=_SECONDS, registry=r)
        for name in (
            "request_duration_seconds",
            "proxy_overhead_seconds",
            "upstream_latency_seconds",
        )
    ]
    tokens = [
        Counter(f"{NS}_{name}", helps[f"{NS}_{name}"], registry=r)
        for name in ("input_tokens", "output_tokens", "cache_read_tokens", "cache_write_tokens")
    ]
    Gauge(f"{NS}_requests_in_flight", "Requests being handled.", registry=r)
    for n, request in enumerate(requests):
        rec, status, ended = _record(n, request)
        route, usage = rec.route, request[4]
        exemplar = {EXEMPLAR_LABEL: rec.trace_id} if rec.trace_id else None
        counted.labels(route, str(status)).inc()
        timed[0].labels(route).observe(ended - rec.started, exemplar)
        if route == "/healthz":
            continue
        timed[1].labels(route).observe(rec.own_seconds(ended), exemplar)
        if rec.upstream_sent is not None and rec.upstream_answered is not None:
            timed[2].labels(route).observe(rec.upstream_answered - rec.upstream_sent, exemplar)
        if usage is not None:
            fresh, written, read, output = usage
            for counter, value in zip(tokens, (fresh, output, read, written), strict=True):
                if value:
                    counter.inc(value)
    return r


def _record(n: int, request: tuple) -> tuple[RequestRecord, int, float]:  # type: ignore[type-arg]
    route, status, duration, upstream, usage, traced = request
    rec = RequestRecord("r", route, "POST", started=100.0)
    if upstream is not None:
        own, latency = upstream
        rec.upstream_sent = 100.0 + own
        rec.upstream_answered = rec.upstream_sent + latency
    if usage is not None:
        fresh, written, read, output = usage
        rec.meter = UsageMeter(ANTHROPIC)
        rec.meter.round(Usage(fresh, written, read, output))
    if traced:
        rec.trace_id = f"{n:032x}"
    return rec, status, 100.0 + duration


def _lines(text: str) -> list[str]:
    """The exposition's lines, sorted, without the times of creation and of exemplars."""
    text = re.sub(r"(_created(\{[^}]*\})?) \S+", r"\1 T", text)
    text = re.sub(r"(# \{trace_id=\"[0-9a-f]+\"\} \S+) \S+", r"\1 T", text)
    return sorted(text.splitlines())


@settings(max_examples=60, deadline=None)
@given(st.lists(REQUEST, max_size=40))
def test_what_every_request_updates_is_exported_as_prometheus_client_would(
    requests: list[tuple],  # type: ignore[type-arg]
) -> None:
    metrics = Metrics()
    for n, request in enumerate(requests):
        metrics.record(*_record(n, request))
    alone = CollectorRegistry()  # the per-request families alone
    alone.register(metrics.per_request)
    reference = _reference(requests)
    for generate in (generate_latest, openmetrics.generate_latest):
        assert _lines(generate(alone).decode()) == _lines(generate(reference).decode())
