"""Budget arithmetic: calendar buckets, reservations, costs, proxy keys."""

from __future__ import annotations

import datetime as dt

import pytest
from hypothesis import given
from hypothesis import strategies as st

from proxy.core import proxy_keys
from proxy.core.budget import (
    Amounts,
    BadRequestField,
    bucket,
    limits_of,
    output_reservation,
    policy_override,
    reservation,
    usage_cost,
)

# 1970 .. 2200, in seconds
instants = st.floats(min_value=0, max_value=7_258_118_400, allow_nan=False)


@given(instants)
def test_month_bucket_matches_the_calendar(now: float) -> None:
    moment = dt.datetime.fromtimestamp(now, dt.UTC)
    found = bucket("month", now)
    assert found.name == f"{moment.year:04d}{moment.month:02d}"
    first_next = (
        dt.datetime(moment.year + 1, 1, 1, tzinfo=dt.UTC)
        if moment.month == 12
        else dt.datetime(moment.year, moment.month + 1, 1, tzinfo=dt.UTC)
    )
    assert found.ends_in == int(first_next.timestamp()) - int(now)


@given(instants)
def test_minute_and_day_buckets_close_at_their_boundary(now: float) -> None:
    minute, day = bucket("minute", now), bucket("day", now)
    assert 1 <= minute.ends_in <= 60 and (int(now) + minute.ends_in) % 60 == 0
    assert 1 <= day.ends_in <= 86_400 and (int(now) + day.ends_in) % 86_400 == 0
    assert minute.name == str(int(now) // 60) and day.name == str(int(now) // 86_400)
    assert bucket("minute", now + minute.ends_in).name != minute.name


def test_unknown_period() -> None:
    with pytest.raises(ValueError, match="hour"):
        bucket("hour", 0)


usage_fields = st.fixed_dictionaries(
    {
        "input_tokens": st.integers(0, 10**6),
        "cache_creation_input_tokens": st.integers(0, 10**6),
        "cache_read_input_tokens": st.integers(0, 10**6),
        "output_tokens": st.integers(0, 10**5),
    }
)


@given(usage_fields, st.integers(0, 10**5))
def test_a_reservation_covers_any_single_answer_within_it(
    usage: dict[str, int], max_tokens: int
) -> None:
    """When the estimate is not below the reported input and output is capped by
    max_tokens (the API's rule), settling never adds: the reservation was enough."""
    cost = usage_cost(usage)
    held = reservation(cost.input, max_tokens, one_hour_cache=False)
    capped = Amounts(cost.input, min(cost.output, max_tokens), cost.weighted)
    assert capped.input <= held.input
    assert capped.output <= held.output
    assert capped.weighted <= held.weighted


def test_usage_cost_weights_cache_writes_and_reads() -> None:
    usage = {
        "input_tokens": 100,
        "cache_creation_input_tokens": 1000,
        "cache_read_input_tokens": 10_000,
        "output_tokens": 7,
        "cache_creation": {"ephemeral_1h_input_tokens": 200, "ephemeral_5m_input_tokens": 800},
    }
    # 100 + 800 * 1.25 + 200 * 2 + 10_000 * 0.1
    assert usage_cost(usage) == Amounts(11_100, 7, 2_500)
    assert usage_cost({"input_tokens": True, "output_tokens": "9"}) == Amounts()


def test_one_hour_cache_reserves_double_weight() -> None:
    assert reservation(100, 5, one_hour_cache=True) == Amounts(100, 5, 200)
    assert reservation(101, 5, one_hour_cache=False) == Amounts(101, 5, 127)


def test_limits_and_policy_from_a_stored_conf() -> None:
    conf = {"minute:input": "10", "day:output": "5", "policy:window": "9000", "junk": "x"}
    assert limits_of(conf) == {("minute", "input"): 10, ("day", "output"): 5}
    team = {"policy:window": "9000", "policy:trigger": "6000"}
    key = {"policy:trigger": "5000"}
    assert policy_override(team, key) == {"window": 9000, "trigger": 5000}


def test_proxy_key_text_digest_and_id() -> None:
    text = proxy_keys.format_key("0123456789ab", "A" * 43)
    assert proxy_keys.key_id_of(text) == "0123456789ab"
    assert proxy_keys.key_id_of(text[:-1]) is None
    assert proxy_keys.key_id_of("sk-ant-api03-whatever") is None
    stored = proxy_keys.digest(text)
    assert text not in stored and proxy_keys.matches(text, stored)
    assert not proxy_keys.matches(text.replace("A", "B", 1), stored)
    with pytest.raises(ValueError):
        proxy_keys.check_team("has space")
    with pytest.raises(ValueError):
        proxy_keys.check_env_name("lower")


def test_a_gemini_request_reserves_its_generation_configs_cap_per_candidate() -> None:
    config = {"maxOutputTokens": 8_192, "candidateCount": 2}
    assert output_reservation({"contents": [], "generationConfig": config}) == 16_384
    assert output_reservation({"generation_config": {"max_output_tokens": 100}}) == 100
    assert output_reservation({"contents": [], "generationConfig": {}}) == 4_096
    with pytest.raises(BadRequestField) as bad:
        output_reservation({"generationConfig": {"maxOutputTokens": 6.4e4}})
    assert bad.value.param == "generationConfig.maxOutputTokens"


def test_gemini_paths_need_the_scopes_their_openai_and_anthropic_kin_need() -> None:
    assert proxy_keys.passthrough_rule("GET", "/v1beta/models").scope == "models"
    counting = proxy_keys.passthrough_rule("POST", "/v1beta/models/gemini-2.5-flash:countTokens")
    assert counting == proxy_keys.PathRule(None, proxy_keys.FREE)
    embedding = proxy_keys.passthrough_rule("POST", "/v1beta/models/x:embedContent")
    assert embedding.meter == proxy_keys.UNMETERED
