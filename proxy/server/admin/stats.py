"""The admin stats: gathered as each request ends, sent to Redis in the background.

`StatsCollector.observe` listens at the end of every request (the metrics middleware's
REQUEST_ENDED hook), turns its record into counter increments (proxy/core/stats.py) and
adds them to this replica's totals since start and to what is pending for Redis. A
background task sends the pending counters and events every FLUSH_SECONDS as one
pipelined call (proxy/store/stats.py), so no request waits on it; if Redis is away they
are kept (at most the minute buckets' lifetime) and sent when it returns.

`GET /admin/stats[?minutes=60&hours=24]` answers with this replica's totals since start
and the fleet's minute and hour buckets and recent events (the JSON says which is which).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import socket
import time
from collections import deque
from typing import Any

from aiohttp import web

from proxy.core import stats
from proxy.core.errors import InvalidRequest
from proxy.core.pricing import PriceTable
from proxy.core.stats import RequestFacts
from proxy.core.usage import Usage
from proxy.server.admin.answers import answer
from proxy.server.record import RequestRecord
from proxy.server.state import SETTINGS, STORE
from proxy.server.tasks import STOP_DEADLINE, is_cancelling, stop_tasks
from proxy.store import StoreUnavailable
from proxy.store.stats import MINUTE, MINUTE_TTL, RECENT_KEPT, StatsStore

log = logging.getLogger(__name__)

FLUSH_SECONDS = 1.0
# The routes that are API traffic (the admin API, the dashboard and probes are not).
COUNTED_ROUTES = frozenset(
    {"/v1/messages", "/v1/messages/count_tokens", "/v1/chat/completions", "other"}
)
MAX_MODELS = 100  # distinct model labels per replica; more are counted as "other"
MAX_MINUTES, MAX_HOURS = MINUTE_TTL // MINUTE, 192
SHOWN = {"conversations": 20, "crossings": 50, "errors": 50}
CONVERSATION_ID_CHARS = 12
COST_MODEL = (
    "with_proxy: the usage the upstream reported for every call a request made (its"
    " read_result rounds) plus its summariser calls; without_proxy: the request as the"
    " client sent it, answered once: its first answer's usage plus the history tokens the"
    " proxy removed (tokens before - after), priced as cache reads when the client uses"
    " prompt caching, else as uncached input; output taken as equal."
    " cache_model_units: uncached input 1.0, cache write 1.25, cache read 0.1, output 5.0"
    " per token; a currency when a [[price]] table matches the model."
)
UNITS = {
    "tokens": "tokens as the upstream reported them (usage)",
    "history_tokens": "tokens of the message history as the proxy counts them (calibrated)",
    "context_tokens": "input tokens of a request: reported (after), plus what the proxy"
    " removed (before)",
    "cost": "see cost_model; in cache_model_units or the [[price]] currency",
    "at": "unix seconds",
}


def _facts(record: RequestRecord, status: int, model: str) -> RequestFacts:
    meter = record.meter
    first = meter.first_round
    summariser = Usage()
    for call in meter.extra:
        summariser = summariser.plus(call)
    return RequestFacts(
        route=record.route,
        status=status,
        model=model,
        team=record.team,
        key_id=record.key_id,
        conversation=record.conversation[:CONVERSATION_ID_CHARS],
        strategy=record.strategy,
        refused=record.refused,
        tokens_before=record.tokens_before,
        tokens_after=record.tokens_after,
        summary=record.summary,
        offloaded=record.offloaded,
        read_rounds=record.read_rounds,
        summariser_failures=record.summariser_failures,
        rejected=record.rejected,
        usage=meter.total().as_dict() if meter.rounds else {},
        first_answer_usage=first.as_dict() if first is not None else {},
        summariser_usage=summariser.as_dict() if meter.extra else {},
        reason=record.reason,
        upstream_answered=record.upstream_answered is not None,
    )


class StatsCollector:
    def __init__(self, app: web.Application) -> None:
        self.app = app
        self.prices: PriceTable = app[SETTINGS].prices
        self.replica = socket.gethostname()
        self.started = time.time()
        self.totals: dict[str, int] = {}
        self.pending: dict[int, dict[str, int]] = {}
        self.pending_recent: dict[str, list[dict[str, Any]]] = {k: [] for k in RECENT_KEPT}
        # This replica's own recent events, shown when Redis is unreachable.
        self.local_recent = {k: deque[dict[str, Any]](maxlen=n) for k, n in SHOWN.items()}
        self.models: set[str] = set()
        self._lock = asyncio.Lock()
        self._task: asyncio.Task[None] | None = None
        self._stopping = False

    def _model(self, record: RequestRecord, status: int) -> str:
        """Requests are counted per model once the upstream accepted the model (a 2xx):
        the name is the client's text, so it is a bounded set of well-formed labels."""
        if not record.model or not 200 <= status < 300:
            return ""
        name = stats.label(record.model)
        if name not in self.models:
            if len(self.models) >= MAX_MODELS:
                return stats.OTHER
            self.models.add(name)
        return name

    def observe(self, record: RequestRecord, status: int) -> None:
        if record.route not in COUNTED_ROUTES:
            return
        now = time.time()
        facts = _facts(record, status, self._model(record, status))
        counted = stats.counts(facts, self.prices)
        stats.add(self.totals, counted)
        minute = int(now) - int(now) % MINUTE
        stats.add(self.pending.setdefault(minute, {}), counted)
        for kind, event in stats.events(facts, now).items():
            self.pending_recent[kind].append(event)
            self.local_recent[kind].appendleft(event)

    async def flush(self) -> None:
        """Send what is pending to Redis; keep it for the next try if Redis is away."""
        async with self._lock:
            store = self.app[STORE].store
            if store is None or not (self.pending or any(self.pending_recent.values())):
                return
            pending, self.pending = self.pending, {}
            recent = self.pending_recent
            self.pending_recent = {k: [] for k in RECENT_KEPT}
            try:
                await StatsStore(store).write(pending, recent)
            except StoreUnavailable:
                oldest = time.time() - MINUTE_TTL
                for minute, counters in pending.items():
                    if minute >= oldest:
                        stats.add(self.pending.setdefault(minute, {}), counters)
                for kind, events in recent.items():
                    kept = [*events, *self.pending_recent[kind]]
                    self.pending_recent[kind] = kept[-RECENT_KEPT[kind] :]

    def install(self, app: web.Application) -> None:
        """Flush in the background from start-up; flush once more at shutdown, which
        runs before the store closes (cleanup)."""
        app.on_startup.append(self._start)
        app.on_shutdown.append(self._stop)

    async def _start(self, app: web.Application) -> None:
        self._task = asyncio.get_running_loop().create_task(self._flush_often())

    async def _stop(self, app: web.Application) -> None:
        self._stopping = True
        if self._task is not None:
            await stop_tasks([self._task], what="admin stats flush")
        with contextlib.suppress(Exception):
            async with asyncio.timeout(STOP_DEADLINE):
                await self.flush()

    async def _flush_often(self) -> None:
        # Ends when told to, even when a cancellation arrived inside a store call and
        # came out of it as a StoreUnavailable the flush keeps for the next tick.
        while not self._stopping and not is_cancelling():
            await asyncio.sleep(FLUSH_SECONDS)
            try:
                await self.flush()
            except Exception:  # never let the stats task die; the next tick retries
                log.exception("admin stats flush failed")


STATS = web.AppKey("admin_stats", StatsCollector)


def _iso(unix: float) -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(unix))


def _point(start: int, counters: dict[str, int]) -> dict[str, Any]:
    """One bucket of a time series: the figures the charts draw."""
    summary = stats.summarise(counters)
    keep = ("requests", "errors", "tokens", "cache_read_share", "history_tokens", "crossings")
    return {
        "start": _iso(start),
        "start_unix": start,
        **{k: summary[k] for k in keep},
        "budget_refusals": summary["budget_refusals"],
        "cost": summary["cost"],
    }


def _latest_per_conversation(events: list[dict[str, Any]]) -> list[dict[str, Any]]:
    seen: set[str] = set()
    out = []
    for event in events:
        if event.get("conversation") not in seen:
            seen.add(event.get("conversation", ""))
            out.append(event)
    return out


def _count(request: web.Request, name: str, default: int, most: int) -> int:
    raw = request.query.get(name, "")
    if not raw:
        return default
    if not raw.isdigit() or not 1 <= int(raw) <= most:
        raise ValueError(f"{name} must be a whole number from 1 to {most}")
    return int(raw)


async def handle_stats(request: web.Request) -> web.Response:
    try:
        minutes = _count(request, "minutes", 60, MAX_MINUTES)
        hours = _count(request, "hours", 24, MAX_HOURS)
    except ValueError as e:
        raise InvalidRequest(str(e)) from None
    collector = request.app[STATS]
    now = time.time()
    body: dict[str, Any] = {
        "generated_at": _iso(now),
        "generated_at_unix": round(now, 3),
        "replica": {
            "name": collector.replica,
            "started_at": _iso(collector.started),
            "uptime_seconds": round(now - collector.started, 1),
        },
        "scope": {
            "since_start": "replica",
            "last_hour": "fleet",
            "last_day": "fleet",
            "minutes": "fleet",
            "hours": "fleet",
            "recent": "fleet",
        },
        "cost_model": COST_MODEL,
        "units": UNITS,
        "since_start": stats.summarise(collector.totals),
    }
    store = request.app[STORE].store
    try:
        if store is None:
            raise StoreUnavailable("no store")
        await collector.flush()
        buckets = await StatsStore(store).read(now, max(minutes, 60), max(hours, 24))
    except StoreUnavailable:
        body["scope"].update(recent="replica")
        body["fleet_error"] = "the store is unreachable: fleet figures are missing"
        body.update(last_hour=None, last_day=None, minutes=[], hours=[])
        recent = {k: list(v) for k, v in collector.local_recent.items()}
    else:
        body["last_hour"] = stats.summarise(stats.sum_of(c for _, c in buckets.minutes[-60:]))
        body["last_day"] = stats.summarise(stats.sum_of(c for _, c in buckets.hours[-24:]))
        body["minutes"] = [_point(s, c) for s, c in buckets.minutes[-minutes:]]
        body["hours"] = [_point(s, c) for s, c in buckets.hours[-hours:]]
        recent = buckets.recent
    body["recent"] = {
        "conversations": _latest_per_conversation(recent.get("conversations", []))[
            : SHOWN["conversations"]
        ],
        "crossings": recent.get("crossings", [])[: SHOWN["crossings"]],
        "errors": recent.get("errors", [])[: SHOWN["errors"]],
    }
    return answer(body)
