"""Facts a summary must keep: the identifier extractor, the ranking, the appended line."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from proxy.core.facts import (
    CONVERSATION,
    EARLIER_SUMMARY,
    LINE_HEAD,
    TOOL_RESULT,
    Source,
    identifiers,
    keep_facts,
    missing,
    rank,
    shape,
)
from proxy.core.tokens import TokenCounter

COUNT = TokenCounter().count_text


@pytest.mark.parametrize(
    "found",
    [
        "src/auth/token_store.py",
        "/etc/nginx/nginx.conf",
        "token_store.py:42",
        "README.md",
        "https://ci.example.com/builds/8812?tab=log",
        "LedgerSyncWorker",
        "reconcileEntries",
        "reconcile_ledger_entries",
        "ERR_CONN_RESET",
        "E4521",
        "3f9a2c1d7e04",
        "123e4567-e89b-12d3-a456-426614174000",
        "#4521",
        "1.14.2",
        "512 MiB",
        "35 ms",
        "s3://acme-ledger-exports/nightly/",
        "postgres://ledger@db:5432/ledger",
        "ledger.strict_mode",
        "os.path.join",
        "PLEDGR7",
        "SHA256",
        "ledger-pg-eu-3",
        "us-east-1",
        "port 6391",
        "HTTP 409",
        "pid 4242",
    ],
)
def test_each_kind_of_identifier_is_found_verbatim(found: str) -> None:
    assert found in identifiers(f"Before that: {found}, and then something else.")


@pytest.mark.parametrize(
    "word",
    ["the", "Error", "INFO", "42", "2026", "hello world", "follow-up", "up-to-date"],
)
def test_plain_words_and_bare_numbers_are_not_identifiers(word: str) -> None:
    assert identifiers(f"so {word} then") == []


def test_template_values_share_a_shape() -> None:
    assert shape("cache_key=k00300012") == shape("cache_key=k00300099") == "cache_key=k#"


def test_ranking_puts_earlier_summaries_then_rare_shapes_first() -> None:
    log = "\n".join(f"src/build/module_{i}.py:{i * 7} done" for i in range(50))
    sources = [
        Source(TOOL_RESULT, log + "\nfailed at services/billing/ledger_sync.py"),
        Source(CONVERSATION, "Fix reconcile_ledger_entries please"),
        Source(EARLIER_SUMMARY, "Earlier: ERR_LEDGER_SKEW seen"),
    ]
    ranked = rank(sources)
    assert ranked[:2] == ["ERR_LEDGER_SKEW", "reconcile_ledger_entries"]
    # The one-off path beats the fifty lines a template printed.
    assert ranked.index("services/billing/ledger_sync.py") < ranked.index("src/build/module_0.py:0")


def test_the_identifiers_a_summary_left_out_are_appended() -> None:
    ranked = ["services/billing/ledger_sync.py", "ERR_LEDGER_SKEW", "E4521"]
    summary = "The ledger sync fails with ERR_LEDGER_SKEW."
    kept = keep_facts(summary, ranked, 200, COUNT)
    assert kept.startswith(summary)
    line = kept.splitlines()[-1]
    assert line.startswith(LINE_HEAD)
    assert "services/billing/ledger_sync.py" in line and "E4521" in line
    assert "ERR_LEDGER_SKEW" not in line  # the summary kept it
    assert missing(ranked, kept) == []


def test_nothing_missing_leaves_the_summary_as_it_is() -> None:
    assert keep_facts("E4521 in a.py", ["E4521", "a.py"], 100, COUNT) == "E4521 in a.py"


IDENT = st.from_regex(
    r"[a-z]{2,6}_[a-z0-9]{2,8}|[A-Z]{2,4}_[A-Z0-9]{2,5}|E[0-9]{3,5}", fullmatch=True
)


@given(st.lists(IDENT, min_size=1, max_size=60, unique=True), st.integers(0, 400))
def test_the_line_keeps_to_its_budget_and_adds_only_what_was_missing(
    names: list[str], budget: int
) -> None:
    summary = "Notes: " + " ".join(names[::3])
    kept = keep_facts(summary, names, budget, COUNT)
    assert kept.startswith(summary.rstrip())
    added = kept[len(summary.rstrip()) :]
    if added:
        assert COUNT(added.strip()) <= budget + 4  # the budget, give or take the joins
        listed = added.strip()[len(LINE_HEAD) : -1].split(", ")
        assert all(name in names and name not in summary for name in map(str.strip, listed))
    # Checking again adds nothing: every identifier the line names is now present.
    assert keep_facts(kept, [n for n in names if n in kept], budget, COUNT) == kept


def test_file_names_with_a_line_and_plain_dotted_files_stay_as_they_were() -> None:
    assert identifiers("see token_store.py:42 and README.md, then config.yaml") == [
        "token_store.py:42",
        "README.md",
        "config.yaml",
    ]
