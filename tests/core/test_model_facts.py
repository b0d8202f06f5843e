"""Model facts from the vendored model table (issue 23, finding 3): windows, output limits
and prices per model, the context-1m beta, overrides by [[policy]] and [[price]], and a
stated default for a model the table lacks."""

from __future__ import annotations

import pytest

from proxy.core.model_facts import (
    BUILTIN,
    TOOL_SEARCH_MODELS,
    UNKNOWN_SOURCE,
    candidates,
    takes_tool_search,
    wants_1m,
    window_for,
)
from proxy.core.model_names import anthropic_name, model_matches
from proxy.core.policy import DEFAULT_POLICIES, parse_policies, policy_for
from proxy.core.pricing import PER_MILLION, PriceTable, parse_price_table


@pytest.mark.parametrize(
    ("model", "window"),
    [
        ("claude-opus-5-5", 1_000_000),
        ("claude-sonnet-4-6", 1_000_000),
        ("claude-sonnet-5", 1_000_000),
        ("claude-haiku-4-5", 200_000),
        ("claude-haiku-4-5-20251001", 200_000),
        ("claude-sonnet-4-5-20250929", 200_000),
        ("gpt-5", 272_000),
        ("gpt-5-codex", 272_000),
        ("gpt-5-2025-08-07", 272_000),
        ("gpt-4.1", 1_000_000),  # 1,047,576 in LiteLLM's table: the smaller is taken
        ("gpt-4o", 128_000),
        ("openai/gpt-4o", 128_000),
        ("gemini-2.5-pro", 1_048_576),
        ("models/gemini-2.5-pro", 1_048_576),  # the Gemini API's resource name
        ("gemini-3.8-flash", 1_000_000),  # 1,048,576 in LiteLLM's table, 1M in genai-prices'
        ("gemini-3.1-pro-preview", 1_048_576),
    ],
)
def test_the_window_is_the_model_tables_max_input(model: str, window: int) -> None:
    policy = policy_for(model, DEFAULT_POLICIES)
    assert policy.window == window
    assert policy.window_source.startswith("model table (")


def test_where_the_tables_disagree_the_smaller_window_is_taken() -> None:
    # gpt-5.5: 1,050,000 in LiteLLM's table, 1,000,000 in genai-prices'.
    assert window_for("gpt-5.5").tokens == 1_000_000


def test_the_context_1m_beta_gives_its_window_only_to_models_that_have_it() -> None:
    beta = "interleaved-thinking-2025-05-14, context-1m-2025-08-07"
    assert wants_1m(beta) and not wants_1m("interleaved-thinking-2025-05-14")
    plain = policy_for("claude-sonnet-4-5-20250929", DEFAULT_POLICIES)
    wide = policy_for("claude-sonnet-4-5-20250929", DEFAULT_POLICIES, betas=beta)
    assert (plain.window, wide.window) == (200_000, 1_000_000)
    assert "context-1m" in wide.window_source
    # A model without the beta keeps its window whatever the header says.
    assert policy_for("claude-haiku-4-5", DEFAULT_POLICIES, betas=beta).window == 200_000


def test_a_model_not_in_the_table_gets_the_stated_default() -> None:
    assert BUILTIN.lookup("claude-test-1") is None
    claude = policy_for("claude-test-1", DEFAULT_POLICIES)
    other = policy_for("mystery-model", DEFAULT_POLICIES)
    assert (claude.window, other.window) == (200_000, 128_000)
    assert claude.window_source == other.window_source == UNKNOWN_SOURCE


def test_a_policy_window_overrides_the_table_and_one_without_takes_it() -> None:
    own = parse_policies([{"match": "gpt-4o*", "window": 64_000}, {"match": "claude-*"}])
    assert policy_for("gpt-4o", [*own, *DEFAULT_POLICIES]).window == 64_000
    assert policy_for("gpt-4o", [*own, *DEFAULT_POLICIES]).window_source == "policy 'gpt-4o*'"
    assert policy_for("claude-opus-5-5", [*own, *DEFAULT_POLICIES]).window == 1_000_000


def test_the_fold_points_are_tokens_capped_by_the_window_not_shares_of_it() -> None:
    wide = policy_for("claude-opus-5-5", DEFAULT_POLICIES)
    assert (wide.trigger_tokens, wide.target_tokens) == (60_000, 30_000)  # not 500k / 400k
    small = policy_for("gpt-4o", DEFAULT_POLICIES)
    assert small.trigger_tokens <= small.window // 2 and small.target_tokens < small.trigger_tokens


def test_thresholds_that_exceed_the_models_window_fall_back_to_the_defaults() -> None:
    own = parse_policies([{"match": "*", "trigger": 300_000, "target": 200_000}])
    policy = policy_for("gpt-4o", own)
    assert policy.window == 128_000
    assert policy.trigger_tokens <= policy.window and "defaults apply" in policy.window_source
    assert policy_for("claude-opus-5-5", own).trigger_tokens == 300_000


def test_names_are_looked_up_without_prefix_date_or_latest() -> None:
    assert candidates("anthropic/claude-opus-4-5-20251101") == [
        "claude-opus-4-5-20251101",
        "claude-opus-4-5",
    ]
    assert "gpt-4o" in candidates("gpt-4o-latest")


def test_prices_come_from_the_table_unless_a_price_table_fits() -> None:
    usage = {"input_tokens": 1_000_000, "output_tokens": 100_000, "cache_read_input_tokens": 0}
    cost, unit = PriceTable().cost("claude-opus-5-5", usage)
    assert unit == "USD" and cost == pytest.approx(4.0 + 2.0)  # 4 and 20 USD/MTok
    rates = PriceTable().rates_for("gpt-5")
    assert rates is not None and rates.cache_read * PER_MILLION == pytest.approx(0.125)
    own = parse_price_table([{"match": "claude-*", "currency": "EUR", "input": 1, "output": 2}])
    assert own.cost("claude-opus-5-5", usage) == (pytest.approx(1.2), "EUR")
    assert PriceTable().rates_for("claude-test-1") is None
    assert PriceTable(from_model_table=False).rates_for("claude-opus-5-5") is None


def test_every_row_of_the_snapshot_is_sane() -> None:
    assert BUILTIN.source and BUILTIN.made and len(BUILTIN.models) > 50
    for name, row in BUILTIN.models.items():
        max_input, max_output, beta = row[:3]
        assert name == name.lower() and max_input > 0 and max_output >= 0, name
        assert beta in (0, 1_000_000) and (beta == 0 or beta > max_input), name


def test_a_summary_made_in_place_never_asks_for_more_than_the_models_max_output() -> None:
    from proxy.wire import ANTHROPIC

    body = {
        "model": "claude-haiku-4-5",
        "max_tokens": 64_000,
        "thinking": {"type": "enabled", "budget_tokens": 60_000},
        "messages": [{"role": "user", "content": "Hi"}],
    }
    history = body["messages"]
    asked = ANTHROPIC.summary_request(
        body, model="claude-haiku-4-5", summary_tokens=8_000, prompt="notes", history=history
    )
    assert asked is not None and asked["max_tokens"] == 64_000  # not 68,000
    small = ANTHROPIC.summary_request(
        {**body, "thinking": {"type": "enabled", "budget_tokens": 2_000}},
        model="claude-haiku-4-5",
        summary_tokens=8_000,
        prompt="notes",
        history=history,
    )
    assert small is not None and small["max_tokens"] == 10_000


@pytest.mark.parametrize(
    ("model", "name"),
    [
        ("anthropic.claude-sonnet-4-5-20250929-v1:0", "claude-sonnet-4-5-20250929"),
        ("us.anthropic.claude-sonnet-4-5-20250929-v1:0", "claude-sonnet-4-5-20250929"),
        ("eu.anthropic.claude-haiku-4-5-20251001-v1:0", "claude-haiku-4-5-20251001"),
        ("apac.anthropic.claude-sonnet-4-5-20250929-v1:0", "claude-sonnet-4-5-20250929"),
        ("us-gov.anthropic.claude-sonnet-4-5-20250929-v1:0", "claude-sonnet-4-5-20250929"),
        ("global.anthropic.claude-opus-4-6-v1", "claude-opus-4-6"),
        ("anthropic.claude-3-5-sonnet-20241022-v2:0", "claude-3-5-sonnet-20241022"),
        (
            "arn:aws:bedrock:us-east-1::foundation-model/anthropic.claude-opus-4-5-20251101-v1:0",
            "claude-opus-4-5-20251101",
        ),
        ("claude-sonnet-4-5@20250929", "claude-sonnet-4-5-20250929"),
        ("claude-haiku-4-5@20251001", "claude-haiku-4-5-20251001"),
        ("claude-opus-4-6", "claude-opus-4-6"),
        ("gpt-4o", "gpt-4o"),
        ("anthropic/claude-sonnet-4-6", "anthropic/claude-sonnet-4-6"),
        ("my-app-profile-abc123", "my-app-profile-abc123"),
    ],
)
def test_bedrock_and_vertex_ids_have_their_anthropic_names(model: str, name: str) -> None:
    assert anthropic_name(model) == name


@pytest.mark.parametrize(
    "model",
    [
        "us.anthropic.claude-sonnet-4-5-20250929-v1:0",
        "global.anthropic.claude-sonnet-4-5-20250929-v1:0",
        "claude-sonnet-4-5@20250929",
    ],
)
def test_bedrock_and_vertex_ids_get_the_same_facts_as_their_anthropic_names(model: str) -> None:
    anthropic = "claude-sonnet-4-5-20250929"
    assert BUILTIN.lookup(model) == BUILTIN.lookup(anthropic) is not None
    beta = "context-1m-2025-08-07"
    assert window_for(model, beta) == window_for(anthropic, beta)
    assert policy_for(model, DEFAULT_POLICIES) == policy_for(anthropic, DEFAULT_POLICIES)
    assert PriceTable().rates_for(model) == PriceTable().rates_for(anthropic)


def test_an_unknown_claude_on_bedrock_gets_claudes_default_window() -> None:
    assert window_for("us.anthropic.claude-test-9-v1:0").tokens == 200_000
    assert window_for("claude-test-9@20990101").tokens == 200_000


def test_policy_and_price_globs_cover_bedrock_and_vertex_ids_by_either_name() -> None:
    own = parse_policies([{"match": "claude-sonnet-4-5*", "window": 150_000}])
    assert policy_for("us.anthropic.claude-sonnet-4-5-20250929-v1:0", own).window == 150_000
    assert policy_for("claude-sonnet-4-5@20250929", own).window == 150_000
    only_bedrock = parse_policies([{"match": "us.anthropic.*", "window": 120_000}])
    assert (
        policy_for("us.anthropic.claude-sonnet-4-5-20250929-v1:0", only_bedrock).window == 120_000
    )
    assert policy_for("claude-sonnet-4-5-20250929", only_bedrock).window != 120_000
    prices = parse_price_table([{"match": "claude-haiku-4-5*", "input": 1, "output": 2}])
    assert prices.rates_for("eu.anthropic.claude-haiku-4-5-20251001-v1:0") == prices.rates_for(
        "claude-haiku-4-5"
    )
    assert model_matches("claude-haiku-4-5@20251001", "claude-haiku-*")
    assert not model_matches("gpt-4o", "claude-*")


@pytest.mark.parametrize(
    "model",
    [
        "claude-opus-5-5",
        "claude-sonnet-4-5-20250929",
        "us.anthropic.claude-sonnet-4-5-20250929-v1:0",  # Bedrock
        "claude-haiku-4-5@20251001",  # Vertex
        "anthropic/claude-opus-4-6",
    ],
)
def test_models_tool_search_is_documented_for_take_it_by_any_name(model: str) -> None:
    assert takes_tool_search(model)


@pytest.mark.parametrize("model", ["claude-3-5-haiku-20241022", "claude-test-1", "gpt-5", ""])
def test_other_models_are_not_known_to_take_tool_search(model: str) -> None:
    assert not takes_tool_search(model)


def test_every_model_said_to_take_tool_search_is_a_claude_model_of_the_table() -> None:
    """(A name mistyped in TOOL_SEARCH_MODELS would defer nothing, silently.)"""
    for name in TOOL_SEARCH_MODELS:
        assert BUILTIN.lookup(name) is not None, name
