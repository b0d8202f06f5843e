"""The admin stats' arithmetic: counters per request, their sum, and the cost model."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from proxy.core import stats
from proxy.core.outcome import SUMMARY_STATES
from proxy.core.pricing import PriceTable, parse_price_table
from proxy.core.stats import CACHE_UNITS, RequestFacts
from proxy.core.strategy import Strategy

NO_PRICES = PriceTable()
SONNET = parse_price_table([{"match": "claude-sonnet-*", "input": 3.0, "output": 15.0}])


def cost(facts: RequestFacts, prices: PriceTable = NO_PRICES) -> dict[str, float]:
    return stats.summarise(stats.counts(facts, prices))["cost"][CACHE_UNITS]


def test_an_untouched_request_costs_the_same_with_and_without_the_proxy() -> None:
    usage = {"input_tokens": 100, "cache_read_input_tokens": 1_000, "output_tokens": 20}
    facts = RequestFacts("/v1/messages", 200, usage=usage)
    assert cost(facts) == {"with_proxy": 300.0, "without_proxy": 300.0, "saved": 0.0}


def test_removed_history_is_priced_as_cache_reads_for_a_caching_client() -> None:
    usage = {"input_tokens": 100, "cache_read_input_tokens": 1_000, "output_tokens": 20}
    facts = RequestFacts(
        "/v1/messages", 200, strategy=Strategy.CHECKPOINT, tokens_before=9_000, tokens_after=4_000,
        usage=usage,
    )  # fmt: skip
    assert cost(facts) == {"with_proxy": 300.0, "without_proxy": 800.0, "saved": 500.0}


def test_removed_history_is_uncached_input_for_a_client_without_caching() -> None:
    usage = {"input_tokens": 1_000, "output_tokens": 20}
    facts = RequestFacts(
        "/v1/messages",
        200,
        strategy=Strategy.PACK,
        tokens_before=9_000,
        tokens_after=4_000,
        usage=usage,
    )
    assert cost(facts) == {"with_proxy": 1_100.0, "without_proxy": 6_100.0, "saved": 5_000.0}


def test_read_rounds_and_summaries_are_paid_only_with_the_proxy() -> None:
    first = {"input_tokens": 10, "cache_creation_input_tokens": 4_000, "output_tokens": 30}
    second = {"input_tokens": 900, "cache_read_input_tokens": 4_000, "output_tokens": 50}
    facts = RequestFacts(
        "/v1/messages",
        200,
        strategy=Strategy.OFFLOAD_SUMMARY,
        tokens_before=20_000,
        tokens_after=5_000,
        read_rounds=1,
        usage={k: first.get(k, 0) + second.get(k, 0) for k in stats.USAGE_FIELDS},
        first_answer_usage=first,
        summariser_usage={"input_tokens": 12_000, "output_tokens": 800},
    )
    with_proxy = 10 + 4_000 * 1.25 + 30 * 5 + 900 + 4_000 * 0.1 + 50 * 5 + 12_000 + 800 * 5
    without = 10 + 4_000 * 1.25 + 30 * 5 + 15_000 * 0.1  # a crossing: a loss, said so
    assert cost(facts) == {
        "with_proxy": with_proxy,
        "without_proxy": without,
        "saved": pytest.approx(without - with_proxy),
    }


def test_a_priced_model_is_also_counted_in_its_currency() -> None:
    usage = {"input_tokens": 1_000_000, "output_tokens": 100_000}
    facts = RequestFacts("/v1/messages", 200, model="claude-sonnet-4-5", usage=usage)
    summary = stats.summarise(stats.counts(facts, SONNET))
    assert summary["cost"]["USD"] == {"with_proxy": 4.5, "without_proxy": 4.5, "saved": 0.0}
    assert set(summary["by_model"]["claude-sonnet-4-5"]["cost"]) == {CACHE_UNITS, "USD"}
    # A model no [[price]] fits is priced from the model table (gpt-4.1: 2 and 8 USD/MTok)...
    other = stats.summarise(
        stats.counts(RequestFacts("/v1/messages", 200, model="gpt-4.1", usage=usage), SONNET)
    )
    assert other["cost"]["USD"]["with_proxy"] == pytest.approx(2.8)
    # ...and one the table lacks only in relative units.
    unknown = RequestFacts("/v1/messages", 200, model="claude-test-1", usage=usage)
    assert "cost|USD|with" not in stats.counts(unknown, SONNET)


def test_refusals_count_but_cost_nothing() -> None:
    refused = stats.summarise(
        stats.sum_of(
            stats.counts(f, NO_PRICES)
            for f in (
                RequestFacts("/v1/messages", 429, rejected="tokens"),
                RequestFacts("/v1/messages", 400, refused=True),
            )
        )
    )
    assert refused["refusals"] == {
        "window": 1,
        "tokens": 1,
        "key": 0,
        "scope": 0,
        "store_unavailable": 0,
    }
    assert refused["budget_refusals"] == 1
    assert refused["errors"] == 2 and refused["crossings"] == 0
    assert refused["cost"][CACHE_UNITS]["with_proxy"] == 0.0


@pytest.mark.parametrize(
    ("name", "expected"),
    [
        ("claude-sonnet-4-5", "claude-sonnet-4-5"),
        ("anthropic.claude-3-5:0", "anthropic.claude-3-5:0"),
        ("gpt-4.1/2025@x", "gpt-4.1/2025@x"),
        ("a|b", "other"),
        ("has space", "other"),
        ("", "other"),
        ("x" * 81, "other"),
        ("-leading", "other"),
    ],
)
def test_model_labels(name: str, expected: str) -> None:
    assert stats.label(name) == expected


usage_counts = st.fixed_dictionaries(
    {}, optional={k: st.integers(0, 10**6) for k in stats.USAGE_FIELDS}
)


@st.composite
def request_facts(draw: Any) -> RequestFacts:
    word = draw(st.sampled_from(["", "refuse", "checkpoint", "offload", "offload+pack"]))
    strategy = Strategy(word) if word not in ("", "refuse") else None
    after = draw(st.integers(0, 10**5))
    return RequestFacts(
        route=draw(st.sampled_from(["/v1/messages", "/v1/chat/completions", "other"])),
        status=draw(st.sampled_from([200, 400, 429, 500, 529])),
        model=draw(st.sampled_from(["", "claude-sonnet-4-5", "gpt-4.1"])),
        team=draw(st.sampled_from(["", "infra", "web"])),
        key_id=draw(st.sampled_from(["", "0123456789ab"])),
        conversation=draw(st.sampled_from(["", "c0123456789a"])),
        strategy=strategy,
        refused=word == "refuse",
        tokens_before=after + draw(st.integers(0, 10**5)),
        tokens_after=after,
        summary=draw(st.sampled_from(["", *SUMMARY_STATES])),
        read_rounds=draw(st.integers(0, 3)),
        usage=draw(usage_counts),
        first_answer_usage=draw(usage_counts),
        summariser_usage=draw(usage_counts),
    )


@given(st.lists(request_facts(), max_size=12))
def test_summing_counters_sums_every_figure(many: list[RequestFacts]) -> None:
    summary = stats.summarise(stats.sum_of(stats.counts(f, SONNET) for f in many))
    assert summary["requests"] == len(many)
    assert summary["errors"] == sum(f.status >= 400 for f in many)
    assert sum(sum(by.values()) for by in summary["by_route"].values()) == len(many)
    for name in stats.USAGE_FIELDS:
        assert summary["tokens"][name] == sum(f.usage.get(name, 0) for f in many)
    assert summary["history_tokens"]["saved"] == sum(f.removed for f in many)
    assert summary["crossings"] == sum(f.crossing for f in many)
    unit = summary["cost"][CACHE_UNITS] if many else None
    if unit is not None:
        each = [stats.costs(f, SONNET)[CACHE_UNITS] for f in many]
        assert unit["with_proxy"] == round(sum(w for w, _ in each) / stats.MICRO, 6)
        assert unit["without_proxy"] == round(sum(w for _, w in each) / stats.MICRO, 6)
    for team in ("infra", "web"):
        counted = summary["by_team"].get(team, {"requests": 0})["requests"]
        assert counted == sum(f.team == team for f in many)
    assert sum(m["requests"] for m in summary["by_model"].values()) == sum(
        bool(f.model) for f in many
    )


@given(request_facts())
def test_an_event_never_hides_what_was_removed(facts: RequestFacts) -> None:
    found = stats.events(facts, 1_800_000_000.0)
    seen = found.get("conversations")
    if seen is not None:
        assert seen["context_tokens_before"] - seen["context_tokens_after"] == facts.removed
    assert ("crossings" in found) == (facts.crossing or facts.refused)
    assert ("errors" in found) == (facts.status >= 400)


def test_crossing_reasons() -> None:
    def reason(**fields: Any) -> str:
        return stats.crossing_reason(RequestFacts("/v1/messages", 200, **fields))

    assert reason(strategy=Strategy.OFFLOAD) == "history over the trigger"
    failed = reason(strategy=Strategy.OFFLOAD_PACK, summariser_failures=1)
    assert failed.startswith("summariser failed")
    assert reason(strategy=Strategy.PACK) == "no summary available: packed"
    assert reason(strategy=Strategy.OFFLOAD_SUMMARY) == "history over the trigger"
    assert reason(refused=True) == "nothing fits the window"
    assert reason(strategy=Strategy.PACK, reason="the store is down") == "the store is down"
