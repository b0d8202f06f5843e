"""Prometheus metrics: one registry per app, fed once per request by a middleware.

The middleware (`observe_requests`) opens the request's record (proxy/server/record.py),
runs the handler, then turns the record into metric updates and one log line. Labels are
only the route (the matched path pattern), the status and fixed words (strategy,
outcome, reason): never a tenant, a conversation, a model or anything the client chose.

For other modules: `count_budget_rejection(app, reason)` counts a request refused by a
budget or key check (`compaction_proxy_budget_rejections_total{reason}`).
"""

from __future__ import annotations

import asyncio
import time
from bisect import bisect_left
from collections.abc import Awaitable, Callable, Iterator

from aiohttp import web
from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from prometheus_client.core import (
    CounterMetricFamily,
    Exemplar,
    GaugeMetricFamily,
    HistogramMetricFamily,
    Metric,
)
from prometheus_client.exposition import CONTENT_TYPE_LATEST
from prometheus_client.openmetrics import exposition as openmetrics

from proxy.core.outcome import DECLINED
from proxy.core.reuse import Reuse
from proxy.server import record as records
from proxy.server import tasks
from proxy.server.lifecycle import LIFECYCLE
from proxy.server.logs import REQUEST_LOG
from proxy.server.record import RequestRecord, new_record_id
from proxy.server.state import STORE
from proxy.store import Store, StoreUnavailable

NS = "compaction_proxy"
# Latency buckets from a fraction of a millisecond (the proxy's own work) to minutes
# (long streams).
_SECONDS = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10,
            30, 60, 120, 300)  # fmt: skip
_PROBES = frozenset({"/healthz", "/readyz", "/metrics"})


class Metrics:
    """Every metric the proxy exports, registered in a registry of its own."""

    def __init__(self) -> None:
        r = self.registry = CollectorRegistry(auto_describe=True)
        # What every request updates: plain numbers, exported at each scrape.
        self.per_request = PerRequest()
        r.register(self.per_request)
        self.requests = self.per_request.requests_family  # (its `collect()`, for readers)
        self.rewrites = Counter(
            f"{NS}_rewrites",
            "Requests sent rewritten, by strategy (checkpoint = a frozen rewrite reapplied).",
            ["strategy"], registry=r,
        )  # fmt: skip
        self.compactions = Counter(
            f"{NS}_compactions",
            "Crossings of the trigger that made a new rewrite, by strategy.",
            ["strategy"], registry=r,
        )  # fmt: skip
        self.saved = Counter(
            f"{NS}_tokens_saved",
            "History tokens removed from requests (before - after), by strategy.",
            ["strategy"], registry=r,
        )  # fmt: skip
        self.refusals = Counter(
            f"{NS}_refusals", "Requests refused because nothing fit the window.", registry=r
        )
        self.offloads = Counter(f"{NS}_offloads", "Tool results newly offloaded.", registry=r)
        self.declined = Counter(
            f"{NS}_compaction_declined",
            "Requests over a threshold whose compaction was declined, by reason "
            "(invalid_request, invalid_rewrite, too_deep, failed): sent as they came, a "
            "warning logged.",
            ["reason"], registry=r,
        )  # fmt: skip
        self.read_rounds = Counter(
            f"{NS}_read_result_rounds", "read_result round trips answered by the proxy.",
            registry=r,
        )  # fmt: skip
        self.read_outcomes = Counter(
            f"{NS}_read_outcomes",
            "Answers that went through read_result rounds, by how the rounds ended "
            "(complete, limit, window, budget, upstream_error, broken).",
            ["outcome"], registry=r,
        )  # fmt: skip
        self.summaries = Counter(
            f"{NS}_summaries", "Summaries used, by outcome (made, ahead, waited, reused).",
            ["outcome"],
            registry=r,
        )  # fmt: skip
        self.folds_deferred = Counter(
            f"{NS}_folds_deferred",
            "Requests over the trigger sent unfolded because their fold's summary was still"
            " being made ahead (bounded: past the wait point a request waits for it).",
            registry=r,
        )
        self.summariser_calls = Counter(
            f"{NS}_summariser_calls", "Summariser calls made upstream.", registry=r
        )
        self.summariser_failures = Counter(
            f"{NS}_summariser_failures",
            "Summariser calls that failed or gave no text (the proxy packed instead).",
            registry=r,
        )
        self.conversation_lines = Histogram(
            f"{NS}_conversation_lines",
            "Lines (checkpoints) a conversation had when a request over its trigger "
            "loaded them.",
            buckets=(0, 1, 2, 3, 4, 6, 8, 16), registry=r,
        )  # fmt: skip
        self.checkpoints_evicted = Counter(
            f"{NS}_checkpoints_evicted",
            "Checkpoints of a line dropped, least recently used, beyond store.max_lines.",
            registry=r,
        )
        self.store_errors = Counter(
            f"{NS}_store_errors", "Redis calls that failed or timed out.", registry=r
        )
        self.budget_rejections = Counter(
            f"{NS}_budget_rejections", "Requests refused by a budget or key check, by reason.",
            ["reason"], registry=r,
        )  # fmt: skip
        # Budgets while Redis is unreachable (proxy/server/fleet.py).
        self.budget_uncounted = Counter(
            f"{NS}_budget_admitted_uncounted",
            "Requests admitted without a reservation while Redis was unreachable "
            '(on_store_down = "open", within the outage allowance).',
            registry=r,
        )
        self.budget_store_down = Gauge(
            f"{NS}_budget_store_unreachable",
            "1 while this replica cannot reach Redis for keys and budgets.",
            registry=r,
        )
        self.budget_store_outages = Counter(
            f"{NS}_budget_store_outages", "Outages of Redis seen by this replica.", registry=r
        )
        # The Responses WebSocket (proxy/server/responses_ws.py); each response.create
        # is also counted as a request of route /v1/responses, method WS.
        self.websocket_sessions = Counter(
            f"{NS}_websocket_sessions",
            "WebSocket upgrades of /v1/responses, by outcome (relayed; refused: 426 by "
            "the proxy's setting or the upstream's refusal; failed: the upstream "
            "unreachable or another refusal).",
            ["outcome"], registry=r,
        )  # fmt: skip
        self.websocket_open = Gauge(
            f"{NS}_websocket_open", "Client WebSockets being relayed.", registry=r
        )
        self.websocket_frames = Counter(
            f"{NS}_websocket_frames",
            "WebSocket frames relayed, by direction (client_to_upstream, upstream_to_client).",
            ["direction"], registry=r,
        )  # fmt: skip
        self.websocket_upstream_bytes = Counter(
            f"{NS}_websocket_upstream_request_bytes",
            "Bytes of response.create frames sent upstream, by form (incremental: only the "
            "new items after previous_response_id; whole: the whole input).",
            ["form"], registry=r,
        )  # fmt: skip
        self.draining = Gauge(
            f"{NS}_draining", "1 while shutting down (readiness fails).", registry=r
        )
        self.store = StoreMetrics(r)
        r.register(TaskFailures())

    def watch_reuse(self, reuse: Reuse) -> None:
        """Export the reuse cache's size and counts (read at each scrape)."""
        self.registry.register(ReuseCollector(reuse))

    def summariser_call(self, ok: bool) -> None:
        """A summariser call made outside any request (a summary made ahead)."""
        self.summariser_calls.inc()
        if not ok:
            self.summariser_failures.inc()

    def record(self, rec: RequestRecord, status: int, ended: float) -> None:
        if not self.per_request.record(rec, status, ended):
            return  # a probe: only timed as a whole
        if rec.refused:
            self.refusals.inc()
        elif rec.strategy is not None:
            label = rec.strategy.value
            self.rewrites.labels(label).inc()
            if rec.strategy.crossing:
                self.compactions.labels(label).inc()
            if rec.tokens_before > rec.tokens_after:
                self.saved.labels(label).inc(rec.tokens_before - rec.tokens_after)
        if rec.offloaded:
            self.offloads.inc(rec.offloaded)
        if rec.summary:
            self.summaries.labels(rec.summary).inc()
        if rec.reason == "summary_pending":
            self.folds_deferred.inc()
        if rec.reason in DECLINED:
            self.declined.labels(rec.reason).inc()
        if rec.read_rounds:
            self.read_rounds.inc(rec.read_rounds)
        if rec.read_outcome:
            self.read_outcomes.labels(rec.read_outcome).inc()
        if rec.summariser_calls:
            self.summariser_calls.inc(rec.summariser_calls)
        if rec.summariser_failures:
            self.summariser_failures.inc(rec.summariser_failures)


# -- the store's memory (issue 17) ----------------------------------------------------


class StoreMetrics:
    """Redis's memory as the last scrape found it, and refs that could not be read."""

    REFRESH = 5.0  # seconds between INFO calls, however often /metrics is scraped

    def __init__(self, r: CollectorRegistry) -> None:
        self.used = Gauge(
            f"{NS}_store_memory_used_bytes",
            "Memory Redis has allocated (summed over a Cluster's primaries).", registry=r,
        )  # fmt: skip
        self.limit = Gauge(
            f"{NS}_store_memory_limit_bytes", "Redis's maxmemory (0: no limit).", registry=r
        )
        self.evicted = Gauge(
            f"{NS}_store_evicted_keys",
            "Keys Redis evicted to stay under its limit since it started.", registry=r,
        )  # fmt: skip
        self.unreadable = Counter(
            f"{NS}_unreadable_refs",
            "Refs read or refreshed whose blob was not stored (evicted, expired, never "
            "stored, or another tenant's).",
            registry=r,
        )
        self._fetched = float("-inf")

    async def refresh(self, store: Store | None) -> None:
        now = time.monotonic()
        if store is None or now - self._fetched < self.REFRESH:
            return
        self._fetched = now
        try:
            memory = await store.memory()
        except StoreUnavailable:
            return  # the gauges keep the last figures; store_errors_total counts this
        self.used.set(memory.used)
        self.limit.set(memory.limit)
        self.evicted.set(memory.evicted)


# -- what is kept of each conversation line's last request (proxy/core/reuse.py) --------


class ReuseCollector:
    """The reuse cache's size and counts, read from it at each scrape."""

    def __init__(self, reuse: Reuse) -> None:
        self.reuse = reuse

    def collect(self) -> Iterator[Metric]:
        reuse, stats = self.reuse, self.reuse.stats
        yield GaugeMetricFamily(
            f"{NS}_reuse_entries",
            "Conversation lines whose last request is kept, to parse, hash and count only "
            "what the next one adds.",
            value=reuse.entries,
        )
        yield GaugeMetricFamily(
            f"{NS}_reuse_bytes",
            "Memory those lines are counted at (their bodies' bytes times the parsed "
            "objects' factor), at most server.reuse_max_bytes.",
            value=reuse.bytes,
        )
        for name, text, value in (
            ("hits", "Requests parsed as the continuation of a kept line.", stats.hits),
            ("misses", "Requests parsed in full (no kept line they continue).", stats.misses),
            ("evictions", "Kept lines dropped, least recently used first.", stats.evictions),
            ("reused_bytes", "Bytes of requests not parsed again.", stats.reused_bytes),
        ):
            yield CounterMetricFamily(f"{NS}_reuse_{name}", text, value=value)


class _Timings:
    """One route's latency histogram: each bucket's own count (not cumulative), the sum,
    and each bucket's last exemplar (a traced request's trace id)."""

    __slots__ = ("counts", "created", "exemplars", "total")

    def __init__(self) -> None:
        self.counts = [0] * (len(_SECONDS) + 1)  # the last: +Inf
        self.total = 0.0
        self.exemplars: dict[int, Exemplar] = {}
        self.created = time.time()

    def observe(self, seconds: float, trace_id: str) -> None:
        at = bisect_left(_SECONDS, seconds)  # the first bound the value is within
        self.counts[at] += 1
        self.total += seconds
        if trace_id:
            self.exemplars[at] = Exemplar({EXEMPLAR_LABEL: trace_id}, seconds, time.time())


_BOUNDS = [*(repr(float(b)) for b in _SECONDS), "+Inf"]  # as prometheus_client writes them
_USAGE_COUNTERS = (
    ("input_tokens", "Uncached input tokens the upstream reported."),
    ("output_tokens", "Output tokens the upstream reported."),
    ("cache_read_tokens", "Input tokens read from the prompt cache."),
    ("cache_write_tokens", "Input tokens written to the prompt cache."),
)
_HISTOGRAMS = (
    ("request_duration_seconds", "Whole request time as the proxy saw it (a stream: until its "
     "end)."),
    ("proxy_overhead_seconds", "The proxy's own time: before the upstream request was sent, plus "
     "the work between read_result rounds."),
    ("upstream_latency_seconds", "From sending the upstream request to its response headers "
     "(first round)."),
)  # fmt: skip


class PerRequest:
    """What every request updates (requests by route and status, the three latency
    histograms, the tokens the upstream reported, the requests in flight), as plain
    numbers exported as their Prometheus families at each scrape, the same families
    prometheus_client's own metrics would give. The event loop is their one writer (the
    metrics middleware, once a request), so they need none of prometheus_client's
    locks: its values took one on each of some ten updates a request (15 µs in process)."""

    def __init__(self) -> None:
        self.in_flight = 0
        self._requests: dict[tuple[str, str], list[float]] = {}  # -> [count, created]
        self._timings: tuple[dict[str, _Timings], ...] = ({}, {}, {})
        self._tokens = [0, 0, 0, 0]  # input, output, cache read, cache write
        self._created = time.time()
        self.requests_family = _Family(self._requests_family)

    def record(self, rec: RequestRecord, status: int, ended: float) -> bool:
        """Count `rec`'s request; False for a probe (only its duration is timed)."""
        route = rec.route
        key = (route, str(status))
        counted = self._requests.get(key)
        if counted is None:
            counted = self._requests[key] = [0, time.time()]
        counted[0] += 1
        trace_id = rec.trace_id
        self._timed(0, route).observe(ended - rec.started, trace_id)
        if route in _PROBES:
            return False
        self._timed(1, route).observe(rec.own_seconds(ended), trace_id)
        if rec.upstream_sent is not None and rec.upstream_answered is not None:
            self._timed(2, route).observe(rec.upstream_answered - rec.upstream_sent, trace_id)
        if rec.meter.rounds:
            usage = rec.meter.total()
            tokens = self._tokens
            tokens[0] += usage.input_tokens
            tokens[1] += usage.output_tokens
            tokens[2] += usage.cache_read_input_tokens
            tokens[3] += usage.cache_creation_input_tokens
        return True

    def _timed(self, which: int, route: str) -> _Timings:
        timings = self._timings[which]
        found = timings.get(route)
        if found is None:
            found = timings[route] = _Timings()
        return found

    def _requests_family(self) -> Metric:
        family = CounterMetricFamily(
            f"{NS}_requests", "Requests answered, by route and status.", labels=["route", "status"]
        )
        for (route, status), (count, created) in self._requests.items():
            family.add_metric([route, status], count, created=created)
        return family

    def collect(self) -> Iterator[Metric]:
        yield self._requests_family()
        for (name, text), timings in zip(_HISTOGRAMS, self._timings, strict=True):
            family = HistogramMetricFamily(f"{NS}_{name}", text, labels=["route"])
            for route, timed in timings.items():
                running = 0
                buckets: list[tuple[str, float] | tuple[str, float, Exemplar]] = []
                for at, bound in enumerate(_BOUNDS):
                    running += timed.counts[at]
                    exemplar = timed.exemplars.get(at)
                    buckets.append(
                        (bound, running) if exemplar is None else (bound, running, exemplar)
                    )
                family.add_metric([route], buckets, timed.total)
                family.add_sample(f"{NS}_{name}_created", {"route": route}, timed.created)
            yield family
        for (name, text), value in zip(_USAGE_COUNTERS, self._tokens, strict=True):
            yield CounterMetricFamily(f"{NS}_{name}", text, value=value, created=self._created)
        yield GaugeMetricFamily(
            f"{NS}_requests_in_flight", "Requests being handled.", value=self.in_flight
        )


class _Family:
    """One family of `PerRequest`'s, collected on its own."""

    def __init__(self, make: Callable[[], Metric]) -> None:
        self._make = make

    def collect(self) -> list[Metric]:
        return [self._make()]


class TaskFailures:
    """Background tasks that ended with an error (proxy/server/tasks.py), by task."""

    def collect(self) -> Iterator[Metric]:
        family = CounterMetricFamily(
            f"{NS}_background_task_failures",
            "Background tasks (summaries made ahead, calibration writes, budget settlements)"
            " that ended with an error, each logged once with its traceback.",
            labels=["task"],
        )
        for task, count in sorted(tasks.FAILURES.items()):
            family.add_metric([task], count)
        yield family


METRICS = web.AppKey("metrics", Metrics)
# Called with (record, status) as each request ends (the admin stats listen here).
REQUEST_ENDED = web.AppKey("request_ended", list)


def count_budget_rejection(app: web.Application, reason: str) -> None:
    """For the budget and key checks: `reason` must be a fixed word (e.g. "tokens",
    "requests", "key"), never something the client sent."""
    app[METRICS].budget_rejections.labels(reason).inc()


def route_of(request: web.Request) -> str:
    """The matched path pattern (`/admin/keys/{key_id}`, never the id): a small fixed
    set, whatever the client asks for; the pass-through catch-all is `other`."""
    info = request.match_info
    resource = info.route.resource if info.route is not None else None
    canonical = resource.canonical if resource is not None else ""
    return canonical if canonical.startswith("/") and not canonical.startswith("/{") else "other"


Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]
# The exemplar label of a traced request's trace id on the latency histograms (what
# deploy/grafana/datasources.yaml links to the trace store).
EXEMPLAR_LABEL = "trace_id"


@web.middleware
async def observe_requests(request: web.Request, handler: Handler) -> web.StreamResponse:
    app = request.app
    record = RequestRecord(new_record_id(), route_of(request), request.method)
    token = records.begin(record)
    lifecycle = app[LIFECYCLE]
    lifecycle.started()
    metrics = app[METRICS]
    metrics.per_request.in_flight += 1
    status = 500
    try:
        response = await handler(request)
        status = response.status
        return response
    except web.HTTPException as e:
        status = e.status
        raise
    except asyncio.CancelledError:
        # The client went away (499, nginx's word for it), unless it had its whole answer
        # (Codex closes as soon as response.completed arrives).
        status = 200 if record.meter.complete else 499
        raise
    finally:
        ended = time.perf_counter()
        records.end(token)
        lifecycle.finished()
        metrics.per_request.in_flight -= 1
        metrics.record(record, status, ended)
        app[REQUEST_LOG].emit(record, status, ended)
        for listener in app.get(REQUEST_ENDED, ()):
            listener(record, status)


async def handle_metrics(request: web.Request) -> web.Response:
    await request.app[METRICS].store.refresh(request.app[STORE].store)
    registry = request.app[METRICS].registry
    if "application/openmetrics-text" in request.headers.get("Accept", ""):
        # What Prometheus asks for first: the same metrics, with the latency histograms'
        # exemplars (trace ids of traced requests: docs/operating.md, "Traces").
        body = openmetrics.generate_latest(registry)  # type: ignore[no-untyped-call]
        return web.Response(body=body, headers={"Content-Type": openmetrics.CONTENT_TYPE_LATEST})
    body = generate_latest(registry)
    return web.Response(body=body, headers={"Content-Type": CONTENT_TYPE_LATEST})
