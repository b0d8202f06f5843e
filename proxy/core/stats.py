"""Admin stats, pure: what one finished request adds to the counters, what the counters
say, and what a request cost with the proxy and would have cost without it.

A finished request is reduced to `RequestFacts` (numbers, ids and fixed words: never
prompt text or credentials), then to flat integer increments `{field: n}` that can be
summed anywhere: in memory since the replica started, and in Redis hashes per minute and
per hour for the whole fleet (HINCRBY). `summarise` turns any such sum back into the one
shape /admin/stats and the dashboard show.

Cost, per request, in every unit that applies: always `cache_model_units` (uncached
input 1.0, cache write 1.25, cache read 0.1, output 5.0 per token: proxy/core/pricing.py),
and the model's currency when a `[[price]]` table matches it.
- with the proxy: the usage the upstream reported for every call the request made (its
  read_result rounds included) plus its summariser calls;
- without the proxy: the request as the client sent it, answered once: the usage of its
  first upstream answer, plus the history tokens the proxy removed (tokens before -
  tokens after). Those tokens are the old, unchanged head of the conversation, so they
  are priced as cache reads when the client uses prompt caching (the answer read or
  wrote the cache), else as uncached input. Output is taken as equal. This errs towards
  *lower* savings: a crossing (the rewritten prefix is written to the cache once, and a
  summary may be paid for) shows as a loss, and the requests that reuse the rewrite
  after it show the gain.
Costs are summed as integers in millionths of their unit.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from proxy.core.outcome import SUMMARY_STATES
from proxy.core.pricing import CACHE_MODEL, PriceTable, Rates
from proxy.core.strategy import Strategy, strategy_word

MICRO = 1_000_000
CACHE_UNITS = "cache_model_units"
USAGE_FIELDS = (
    "input_tokens",
    "output_tokens",
    "cache_read_input_tokens",
    "cache_creation_input_tokens",
)
# The counters kept per model, team and key, besides costs.
DIMENSION_METRICS = ("requests", "errors", *USAGE_FIELDS, "history_tokens_saved", "crossings")
DIMENSIONS = ("model", "team", "key")
# Why requests were refused: nothing fits the window, or a key or budget check said no.
REFUSALS = ("window", "tokens", "key", "scope", "store_unavailable")
OTHER = "other"
_LABEL = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._:@/+-]{0,79}$")
_UNIT = re.compile(r"[^A-Za-z0-9_]")


@dataclass(frozen=True, slots=True)
class RequestFacts:
    route: str
    status: int
    model: str = ""  # a label (see `label`) or "" when not counted per model
    team: str = ""
    key_id: str = ""
    conversation: str = ""
    strategy: Strategy | None = None  # the rewrite's; None when untouched or refused
    refused: bool = False  # nothing fitted the window: the proxy answered with an error
    tokens_before: int = 0  # history tokens, for rewritten requests
    tokens_after: int = 0
    summary: str = ""  # outcome.SUMMARY_STATES, or ""
    offloaded: int = 0
    read_rounds: int = 0
    summariser_failures: int = 0
    rejected: str = ""  # why a key or budget check refused it
    usage: Mapping[str, Any] = field(default_factory=dict)  # every round
    first_answer_usage: Mapping[str, Any] = field(default_factory=dict)  # before rounds
    summariser_usage: Mapping[str, Any] = field(default_factory=dict)
    reason: str = ""  # a crossing's reason when the pipeline gave one
    upstream_answered: bool = False  # the upstream sent response headers

    @property
    def strategy_word(self) -> str:
        return strategy_word(self.strategy, self.refused)

    @property
    def rewritten(self) -> bool:
        return self.strategy is not None

    @property
    def crossing(self) -> bool:
        return self.strategy is not None and self.strategy.crossing

    @property
    def removed(self) -> int:
        return max(0, self.tokens_before - self.tokens_after) if self.rewritten else 0


def label(text: str) -> str:
    """A model name fit to be a counter's label: the client chose it, so anything odd
    (too long, control or separator characters) is counted as "other"."""
    return text if _LABEL.match(text) else OTHER


def unit_name(unit: str) -> str:
    return _UNIT.sub("_", unit)[:16] or "currency"


# -- cost ----------------------------------------------------------------------------


def _micro(rates: Rates, usage: Mapping[str, int]) -> int:
    return round(rates.cost(usage) * MICRO)


def without_proxy_usage(facts: RequestFacts) -> dict[str, int]:
    """The usage had the request gone upstream untouched (see the module's cost model)."""
    first = dict(facts.first_answer_usage if facts.read_rounds else facts.usage)
    if not first:
        return {}
    caching = first.get("cache_read_input_tokens", 0) or first.get("cache_creation_input_tokens", 0)
    where = "cache_read_input_tokens" if caching else "input_tokens"
    first[where] = first.get(where, 0) + facts.removed
    return first


def costs(facts: RequestFacts, prices: PriceTable) -> dict[str, tuple[int, int]]:
    """{unit: (with the proxy, without it)} in millionths of the unit."""
    priced: list[tuple[str, Rates]] = [(CACHE_UNITS, CACHE_MODEL)]
    table = prices.rates_for(facts.model) if facts.model else None
    if table is not None:
        priced.append((unit_name(table.unit), table))
    without = without_proxy_usage(facts)
    return {
        unit: (
            _micro(rates, facts.usage) + _micro(rates, facts.summariser_usage),
            _micro(rates, without),
        )
        for unit, rates in priced
    }


# -- counters ------------------------------------------------------------------------


def _bump(out: dict[str, int], name: str, amount: int = 1) -> None:
    if amount:
        out[name] = out.get(name, 0) + amount


def counts(facts: RequestFacts, prices: PriceTable) -> dict[str, int]:
    """The counter increments of one finished request."""
    out: dict[str, int] = {}
    error = facts.status >= 400
    _bump(out, "requests")
    _bump(out, "errors", int(error))
    _bump(out, f"route|{facts.route}|{facts.status}")
    for name in USAGE_FIELDS:
        _bump(out, name, facts.usage.get(name, 0))
    for name in USAGE_FIELDS:
        _bump(out, f"summariser|{name}", facts.summariser_usage.get(name, 0))
    if facts.refused:
        _bump(out, "refusal|window")
    if facts.rejected:
        _bump(out, f"refusal|{facts.rejected}")
    if facts.rewritten:
        _bump(out, "rewritten")
        _bump(out, f"rewrite|{facts.strategy_word}")
        _bump(out, "history_tokens_before", facts.tokens_before)
        _bump(out, "history_tokens_after", facts.tokens_after)
        _bump(out, "history_tokens_saved", facts.removed)
    if facts.crossing:
        _bump(out, f"crossing|{facts.strategy_word}")
    if facts.summary:
        _bump(out, f"summary|{facts.summary}")
    _bump(out, "read_rounds", facts.read_rounds)
    _bump(out, "offloaded", facts.offloaded)
    priced = costs(facts, prices)
    for unit, (with_proxy, without) in priced.items():
        _bump(out, f"cost|{unit}|with", with_proxy)
        _bump(out, f"cost|{unit}|without", without)
    per = {
        "requests": 1,
        "errors": int(error),
        **{n: facts.usage.get(n, 0) for n in USAGE_FIELDS},
        "history_tokens_saved": facts.removed,
        "crossings": int(facts.crossing),
    }
    for dimension, name in (("model", facts.model), ("team", facts.team), ("key", facts.key_id)):
        if not name:
            continue
        for metric, amount in per.items():
            _bump(out, f"{dimension}|{name}|{metric}", amount)
        for unit, (with_proxy, without) in priced.items():
            _bump(out, f"{dimension}|{name}|cost_with:{unit}", with_proxy)
            _bump(out, f"{dimension}|{name}|cost_without:{unit}", without)
    return out


def add(total: dict[str, int], more: Mapping[str, int]) -> None:
    for name, amount in more.items():
        total[name] = total.get(name, 0) + amount


def sum_of(many: Iterable[Mapping[str, int]]) -> dict[str, int]:
    total: dict[str, int] = {}
    for one in many:
        add(total, one)
    return total


# -- the summary ---------------------------------------------------------------------


def _money(micro: int) -> float:
    return round(micro / MICRO, 6)


def _cost(with_micro: int, without_micro: int) -> dict[str, float]:
    return {
        "with_proxy": _money(with_micro),
        "without_proxy": _money(without_micro),
        "saved": _money(without_micro - with_micro),
    }


def cache_read_share(counters: Mapping[str, int]) -> float | None:
    """Cache reads over all input tokens the upstream reported (None: no input yet)."""
    read = counters.get("cache_read_input_tokens", 0)
    total = read + counters.get("input_tokens", 0) + counters.get("cache_creation_input_tokens", 0)
    return round(read / total, 4) if total else None


def summarise(counters: Mapping[str, int]) -> dict[str, Any]:
    """The shape of /admin/stats for any sum of `counts` (names carry their units)."""
    by_route: dict[str, dict[str, int]] = {}
    by_status: dict[str, int] = {}
    groups: dict[str, dict[str, int]] = {
        g: {} for g in ("rewrite", "crossing", "summary", "refusal", "summariser")
    }
    groups["refusal"] = dict.fromkeys(REFUSALS, 0)  # always there, zero or not
    cost: dict[str, dict[str, int]] = {CACHE_UNITS: {}}
    dims: dict[str, dict[str, dict[str, Any]]] = {d: {} for d in DIMENSIONS}
    for name, amount in counters.items():
        parts = name.split("|")
        if parts[0] == "route" and len(parts) == 3:
            by_route.setdefault(parts[1], {})[parts[2]] = amount
            by_status[parts[2]] = by_status.get(parts[2], 0) + amount
        elif parts[0] in groups and len(parts) == 2:
            groups[parts[0]][parts[1]] = amount
        elif parts[0] == "cost" and len(parts) == 3:
            cost.setdefault(parts[1], {})[parts[2]] = amount
        elif parts[0] in dims and len(parts) == 3:
            dims[parts[0]].setdefault(parts[1], {})[parts[2]] = amount
    return {
        "requests": counters.get("requests", 0),
        "errors": counters.get("errors", 0),
        "by_route": by_route,
        "by_status": by_status,
        "tokens": {n: counters.get(n, 0) for n in USAGE_FIELDS},
        "summariser_tokens": {n: groups["summariser"].get(n, 0) for n in USAGE_FIELDS},
        "cache_read_share": cache_read_share(counters),
        "history_tokens": {
            "rewritten_requests": counters.get("rewritten", 0),
            "before": counters.get("history_tokens_before", 0),
            "after": counters.get("history_tokens_after", 0),
            "saved": counters.get("history_tokens_saved", 0),
        },
        "rewrites_by_strategy": groups["rewrite"],
        "crossings_by_strategy": groups["crossing"],
        "crossings": sum(groups["crossing"].values()),
        "summaries": {o: groups["summary"].get(o, 0) for o in SUMMARY_STATES},
        "read_rounds": counters.get("read_rounds", 0),
        "offloaded_results": counters.get("offloaded", 0),
        "refusals": groups["refusal"],
        "budget_refusals": groups["refusal"].get("tokens", 0),
        "cost": {u: _cost(c.get("with", 0), c.get("without", 0)) for u, c in cost.items()},
        **{f"by_{d}": {n: _dimension(m) for n, m in dims[d].items()} for d in DIMENSIONS},
    }


def _dimension(metrics: Mapping[str, int]) -> dict[str, Any]:
    out: dict[str, Any] = {m: metrics.get(m, 0) for m in DIMENSION_METRICS}
    units = {CACHE_UNITS} | {m.split(":", 1)[1] for m in metrics if m.startswith("cost_with:")}
    out["cache_read_share"] = cache_read_share(metrics)
    out["cost"] = {
        u: _cost(metrics.get(f"cost_with:{u}", 0), metrics.get(f"cost_without:{u}", 0))
        for u in sorted(units)
    }
    return out


# -- recent events -------------------------------------------------------------------


def crossing_reason(facts: RequestFacts) -> str:
    """Why a rewrite happened or took the form it did, in a few fixed words."""
    if facts.reason:
        return facts.reason
    if facts.refused:
        return "nothing fits the window"
    if facts.strategy is not None and facts.strategy.packed:
        if facts.summariser_failures:
            return "summariser failed: packed instead"
        return "no summary available: packed"
    return "history over the trigger"


def _context(usage: Mapping[str, int]) -> int:
    return sum(usage.get(n, 0) for n in USAGE_FIELDS if n != "output_tokens")


def events(facts: RequestFacts, now: float) -> dict[str, dict[str, Any]]:
    """The request's entries in the recent lists: `conversations` (its context as the
    model saw it, and as the client sent it), `crossings`, `errors`."""
    out: dict[str, dict[str, Any]] = {}
    who = {"model": facts.model, "team": facts.team, "key": facts.key_id}
    first = facts.first_answer_usage if facts.read_rounds else facts.usage
    seen = _context(first)
    if facts.conversation and seen:
        out["conversations"] = {
            "at": round(now, 3),
            "conversation": facts.conversation,
            **who,
            "strategy": facts.strategy_word or "none",
            "context_tokens_before": seen + facts.removed,
            "context_tokens_after": seen,
        }
    if facts.crossing or facts.refused:
        out["crossings"] = {
            "at": round(now, 3),
            "conversation": facts.conversation,
            **who,
            "strategy": facts.strategy_word,
            "reason": crossing_reason(facts),
            "history_tokens_before": facts.tokens_before,
            "history_tokens_after": facts.tokens_after,
            "summary": facts.summary or "none",
            "offloaded": facts.offloaded,
        }
    if facts.status >= 400:
        out["errors"] = {
            "at": round(now, 3),
            "route": facts.route,
            "status": facts.status,
            **who,
            "kind": error_kind(facts),
        }
    return out


_REFUSED = {
    "key": "invalid or missing key",
    "scope": "outside the key's provider or scopes",
    "tokens": "over budget",
    "store_unavailable": "store unreachable: keys or budgets unchecked",
}


def error_kind(facts: RequestFacts) -> str:
    """Who answered with an error, in a few fixed words."""
    if facts.rejected:
        return "refused: " + _REFUSED.get(facts.rejected, facts.rejected)
    if facts.refused:
        return "refused: nothing fits the window"
    if facts.status == 499:
        return "the client went away"
    if facts.upstream_answered:
        return "upstream error"
    if facts.status >= 500:
        return "upstream unreachable or too slow"
    return "rejected by the proxy (bad request)"
