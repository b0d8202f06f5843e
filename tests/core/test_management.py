"""What the admin API accepts for keys and budgets, checked field by field."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from proxy.core import proxy_keys
from proxy.core.budget import METRICS, PERIODS, POLICY_FIELDS
from proxy.core.management import (
    KeyRequest,
    budget_changes,
    budget_report,
    changes_body,
    check_policy,
    check_scope,
    merged,
    parse_key_request,
)


def test_a_key_request_takes_its_defaults_from_the_provider() -> None:
    assert parse_key_request({"team": "infra"}) == KeyRequest(
        team="infra", upstream_env="ANTHROPIC_API_KEY", upstream_scheme="x-api-key"
    )
    openai = parse_key_request(
        {"team": "web", "provider": "openai", "scopes": ["batches", "files"], "tenant": "lab"}
    )
    assert (openai.upstream_env, openai.upstream_scheme) == ("OPENAI_API_KEY", "bearer")
    assert openai.scopes == ("files", "batches") and openai.tenant == "lab"
    with pytest.raises(ValueError, match="scope"):
        parse_key_request({"team": "web", "scopes": ["passthrough"]})  # a family, or all
    policy = parse_key_request({"team": "a", "policy": {"window": 9000, "trigger": None}})
    assert policy.policy == (("policy:window", 9000),)


def test_a_key_reaches_the_metered_routes_and_its_scopes_only() -> None:
    """Without a scope a key reaches only the calls that cost tokens (reserved against its
    budgets); every other path names the scope it needs (proxy/core/proxy_keys.py)."""
    rule = proxy_keys.passthrough_rule
    for path in ("/v1/complete", "/v1/completions", "/v1/embeddings", "/v1/responses"):
        assert rule("POST", path) == proxy_keys.PathRule(None, proxy_keys.ESTIMATE)
    assert rule("POST", "/v1/responses/input_tokens").meter == proxy_keys.FREE
    assert rule("GET", "/v1/responses") == proxy_keys.PathRule(None, proxy_keys.FREE)
    needed = {
        ("GET", "/v1/models"): ("models", proxy_keys.FREE),
        ("GET", "/v1/files/file_1/content"): ("files", proxy_keys.FREE),
        ("POST", "/v1/files"): ("files", proxy_keys.FREE),
        ("GET", "/v1/messages/batches/b/results"): ("batches", proxy_keys.FREE),
        ("POST", "/v1/messages/batches"): ("batches", proxy_keys.BATCH),
        ("POST", "/v1/messages/batches/b/cancel"): ("batches", proxy_keys.FREE),
        ("POST", "/v1/batches"): ("batches", proxy_keys.UNMETERED),
        ("GET", "/v1/responses/resp_1"): ("stored", proxy_keys.FREE),
        ("GET", "/v1/chat/completions"): ("stored", proxy_keys.FREE),
        ("POST", "/v1/images/generations"): ("images", proxy_keys.UNMETERED),
        ("GET", "/v1/organizations/users"): ("all", proxy_keys.FREE),
        ("GET", "/v1/messages"): ("all", proxy_keys.FREE),
        ("POST", "/v2/anything"): ("all", proxy_keys.UNMETERED),
    }
    for (method, path), (scope, meter) in needed.items():
        found = rule(method, path)
        assert (found.scope, found.meter) == (scope, meter), (method, path)
        assert not proxy_keys.may_reach(found, ())
        assert proxy_keys.may_reach(found, (scope,)) and proxy_keys.may_reach(found, ("all",))
    # Records made before: the provider read from the scheme, old scope names mapped.
    assert proxy_keys.provider_of({"upstream_scheme": "bearer"}) == "openai"
    assert proxy_keys.provider_of({"upstream_scheme": "x-api-key"}) == "anthropic"
    assert proxy_keys.provider_of({"provider": "openai", "upstream_scheme": "x-api-key"}) == (
        "openai"
    )
    assert proxy_keys.scopes_of({"scopes": "messages,passthrough"}) == ("all",)
    assert proxy_keys.scopes_of({}) == ()
    assert proxy_keys.tenant_for("0123456789ab") == "k0123456789ab"
    assert proxy_keys.tenant_for("0123456789ab", "lab") == "nlab"


def test_budget_changes_and_policy_checks() -> None:
    body = {"limits": {"minute": {"input": 5, "output": None}}, "policy": {"target": 0}}
    changes = budget_changes(body)
    assert changes == {"minute:input": 5, "minute:output": None, "policy:target": None}
    conf = merged({"minute:output": "9", "policy:window": "100"}, changes)
    assert conf == {"minute:input": "5", "policy:window": "100"}
    with pytest.raises(ValueError, match="exceeds the window"):
        check_policy({"policy:window": "100", "policy:trigger": "200"})
    with pytest.raises(ValueError, match="below trigger"):
        check_policy({"policy:trigger": "100", "policy:target": "100"})
    for bad, named in (
        ({"limits": {"day": {"input": True}}}, "limits.day.input"),
        ({"limits": {"day": 5}}, "limits.day"),
        ({"limits": {"day": {"tokens": 5}}}, "tokens"),
        ({"budget": {}}, "budget"),
        ("x", "JSON object"),
    ):
        with pytest.raises(ValueError, match=named):
            budget_changes(bad)
    assert check_scope("key", "0123456789ab") == ("key", "0123456789ab")
    for kind, name in (("key", "0123456789AB"), ("key", "../x"), ("org", "x"), ("team", "a b")):
        with pytest.raises(ValueError):
            check_scope(kind, name)


def test_a_budget_report_lists_every_period() -> None:
    report = budget_report(
        "team", "infra", {"day:input": "10", "policy:window": "9"}, {"day": {"input": 4}}
    )
    assert report["limits"] == {"minute": {}, "day": {"input": 10}, "month": {}}
    assert report["used"]["day"] == {"input": 4, "output": 0, "weighted": 0}
    assert report["policy"] == {"window": 9} and report["scope"] == "team infra"


conf_changes = st.dictionaries(
    st.sampled_from(
        [f"{p}:{m}" for p in PERIODS for m in METRICS] + [f"policy:{f}" for f in POLICY_FIELDS]
    ),
    st.none() | st.integers(1, 10**9),
    min_size=1,
)


@given(conf_changes)
def test_the_cli_body_reads_back_as_the_same_changes(changes: dict[str, int | None]) -> None:
    assert budget_changes(changes_body(changes)) == changes
