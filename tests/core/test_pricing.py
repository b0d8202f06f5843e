"""Prices: the cache model's ratios, and [[price]] tables per model."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from proxy.core.pricing import CACHE_MODEL, PriceError, PriceTable, parse_price_table

USAGE = {
    "input_tokens": 1_000,
    "cache_creation_input_tokens": 2_000,
    "cache_read_input_tokens": 10_000,
    "output_tokens": 100,
}


def test_cache_model_weights_each_kind_of_token() -> None:
    # 1,000 x 1.0 + 2,000 x 1.25 + 10,000 x 0.1 + 100 x 5.0
    assert CACHE_MODEL.cost(USAGE) == pytest.approx(1_000 + 2_500 + 1_000 + 500)


def test_one_hour_writes_cost_twice_the_input() -> None:
    usage = {**USAGE, "cache_creation": {"ephemeral_1h_input_tokens": 500}}
    assert CACHE_MODEL.cost(usage) == pytest.approx(1_000 + 1_500 * 1.25 + 500 * 2 + 1_000 + 500)


def test_a_table_prices_its_models_per_million_tokens() -> None:
    table = parse_price_table(
        [
            {"match": "claude-sonnet-*", "input": 3.0, "cache_read": 0.3, "output": 15.0},
            {"match": "*", "currency": "EUR", "input": 1.0, "output": 2.0},
        ]
    )
    cost, unit = table.cost("claude-sonnet-4-6", USAGE)
    # write defaults to 1.25 x input = 3.75 per million
    assert unit == "USD"
    assert cost == pytest.approx((1_000 * 3 + 2_000 * 3.75 + 10_000 * 0.3 + 100 * 15) / 1e6)
    assert table.cost("gpt-5", {"output_tokens": 1_000_000})[1] == "EUR"
    assert table.currencies == {"USD", "EUR"}


def test_an_unpriced_model_is_billed_in_cache_model_units() -> None:
    assert PriceTable().cost("any", USAGE) == (CACHE_MODEL.cost(USAGE), "units")


@pytest.mark.parametrize(
    ("table", "words"),
    [
        ({"match": "x", "output": 1}, "input is required"),
        ({"match": "x", "input": 1}, "output is required"),
        ({"match": "x", "input": -1, "output": 1}, "input must be a number >= 0"),
        ({"match": "x", "input": 1, "output": 1, "cache_wrte": 2}, "unknown field(s) cache_wrte"),
        ({"match": "", "input": 1, "output": 1}, "match must be a non-empty glob"),
    ],
)
def test_a_wrong_table_is_named(table: dict[str, object], words: str) -> None:
    with pytest.raises(PriceError, match=words.replace("(", r"\(").replace(")", r"\)")):
        parse_price_table([table])


@given(
    st.dictionaries(
        st.sampled_from(list(USAGE)), st.integers(min_value=0, max_value=10**9), min_size=1
    )
)
def test_cost_is_additive_over_kinds(usage: dict[str, int]) -> None:
    parts = sum(CACHE_MODEL.cost({k: v}) for k, v in usage.items())
    assert CACHE_MODEL.cost(usage) == pytest.approx(parts)
