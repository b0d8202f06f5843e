"""The stand-in's prompt-cache model, driven with a clock the test moves."""

from __future__ import annotations

from typing import Any

from proxy.core.tokens import TokenCounter
from proxy.testing.cache import CacheUsage, PromptCache, prompt_units

COUNTER = TokenCounter()
EPHEMERAL = {"type": "ephemeral"}
LONG = " ".join(f"word{i}" for i in range(1500))  # well over the 1,024-token minimum


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def body(*turns: str, system: str = LONG, marked: bool = True, **extra: Any) -> dict[str, Any]:
    messages: list[dict[str, Any]] = []
    for i, turn in enumerate(turns):
        block: dict[str, Any] = {"type": "text", "text": turn}
        if marked and i == len(turns) - 1:
            block["cache_control"] = EPHEMERAL
        messages.append({"role": "user" if i % 2 == 0 else "assistant", "content": [block]})
    return {
        "model": "claude-sonnet-4-5",
        "max_tokens": 100,
        "system": [{"type": "text", "text": system, "cache_control": EPHEMERAL}],
        "messages": messages,
        **extra,
    }


def account(cache: PromptCache, request: dict[str, Any], tenant: str = "t") -> CacheUsage:
    usage = cache.account(tenant, prompt_units(request, COUNTER), COUNTER.count_request(request))
    total = usage.input_tokens + usage.cache_read_input_tokens + usage.cache_creation_input_tokens
    assert total == COUNTER.count_request(request)
    return usage


def test_units_end_at_the_request_count() -> None:
    request = body("first question", "an answer", "second question")
    request["tools"] = [{"name": "Bash", "input_schema": {"type": "object"}}]
    units = prompt_units(request, COUNTER)
    assert len(units) == 1 + 1 + 3
    assert units[-1].cumulative_tokens == COUNTER.count_request(request)
    assert [u.breakpoint for u in units] == [False, True, False, False, True]
    counts = [u.cumulative_tokens for u in units]
    assert counts == sorted(counts)


def test_first_request_writes_second_reads() -> None:
    cache = PromptCache(clock=Clock())
    request = body("What does app.py do?")
    first = account(cache, request)
    assert first.cache_read_input_tokens == 0
    assert first.cache_creation_input_tokens == COUNTER.count_request(request)
    assert first.input_tokens == 0
    second = account(cache, request)
    assert second.cache_read_input_tokens == COUNTER.count_request(request)
    assert second.cache_creation_input_tokens == 0


def test_growing_conversation_reads_the_old_prefix_and_writes_the_new_turns() -> None:
    cache = PromptCache(clock=Clock())
    first = body("What does app.py do?")
    account(cache, first)
    grown = body("What does app.py do?", "It serves HTTP.", "And tests.py?")
    usage = account(cache, grown)
    # The old breakpoint was on the first user block: within the lookback of the new one.
    assert usage.cache_read_input_tokens == COUNTER.count_request(first)
    expected_write = COUNTER.count_request(grown) - COUNTER.count_request(first)
    assert usage.cache_creation_input_tokens == expected_write


def test_a_changed_prefix_misses_and_writes_again() -> None:
    cache = PromptCache(clock=Clock())
    account(cache, body("question"))
    changed = body("question", system=LONG + " (edited)")
    usage = account(cache, changed)
    assert usage.cache_read_input_tokens == 0
    assert usage.cache_creation_input_tokens == COUNTER.count_request(changed)


def test_a_changed_late_block_still_reads_the_system_breakpoint() -> None:
    cache = PromptCache(clock=Clock())
    account(cache, body("question one"))
    usage = account(cache, body("question two"))
    system_tokens = prompt_units(body("question two"), COUNTER)[0].cumulative_tokens
    assert usage.cache_read_input_tokens == system_tokens
    assert usage.cache_creation_input_tokens > 0


def test_a_deferred_tool_is_not_in_the_prefix_and_counts_where_it_is_referenced() -> None:
    """Tool search's `defer_loading`: adding a deferred tool changes no unit before the
    block that loads it, and its tokens count at that block ("Tool use with prompt
    caching": the prefix is untouched)."""
    bash = {"name": "Bash", "input_schema": {"type": "object"}}
    deferred = {"name": "read_result", "description": "Reads a result. " * 40,
                "input_schema": {"type": "object"}, "defer_loading": True}  # fmt: skip
    cache = PromptCache(clock=Clock())
    first = body("question", "answer", "more", tools=[bash])
    account(cache, first)
    loading = body("question", "answer", "more", tools=[bash, deferred])
    loading["messages"][1]["content"].insert(0, {"type": "text", "text": "see below"})
    loaded = [
        {"type": "text", "text": "a stub"},
        {"type": "tool_reference", "tool_name": "read_result"},
    ]
    loading["messages"][2]["content"].insert(
        0, {"type": "tool_result", "tool_use_id": "t", "content": loaded}
    )
    units = prompt_units(loading, COUNTER)
    before = prompt_units(first, COUNTER)
    # Tools and system: the same units as without the deferred tool (its own unit repeats
    # the one before it); the first message's block too.
    assert [u.prefix_hash for u in units[:4]] == [before[0].prefix_hash] * 2 + [
        u.prefix_hash for u in before[1:3]
    ]
    assert units[1].cumulative_tokens == units[0].cumulative_tokens
    tool_tokens = COUNTER.count_tools([bash, deferred]) - COUNTER.count_tools([bash])
    result = units[6]  # the third message's first block, the tool_result that loads it
    unlisted = prompt_units({**loading, "tools": [bash]}, COUNTER)  # the reference loads none
    stub_tokens = unlisted[5].cumulative_tokens - unlisted[4].cumulative_tokens
    assert result.cumulative_tokens - units[5].cumulative_tokens == stub_tokens + tool_tokens
    assert units[7].cumulative_tokens == COUNTER.count_request(loading)
    usage = account(cache, loading)  # reads the system breakpoint the first request wrote
    assert usage.cache_read_input_tokens == before[1].cumulative_tokens
    # Unreferenced, it adds no token and no unit of its own.
    unloaded = body("question", "answer", "more", tools=[bash, deferred])
    assert prompt_units(unloaded, COUNTER)[-1].prefix_hash == before[-1].prefix_hash
    assert COUNTER.count_request(unloaded) == COUNTER.count_request(first)


def test_moving_a_breakpoint_does_not_change_the_prefix() -> None:
    cache = PromptCache(clock=Clock())
    marked_late = body("a", "b", "c")
    account(cache, marked_late)
    units = prompt_units(marked_late, COUNTER)
    unmarked = body("a", "b", "c", marked=False)
    unmarked["messages"][-1]["content"][0]["cache_control"] = {"type": "ephemeral", "ttl": "5m"}
    assert prompt_units(unmarked, COUNTER)[-1].prefix_hash == units[-1].prefix_hash


def test_entries_expire_after_the_ttl() -> None:
    clock = Clock()
    cache = PromptCache(ttl_seconds=300, clock=clock)
    request = body("question")
    account(cache, request)
    clock.now += 299
    assert account(cache, request).cache_read_input_tokens > 0  # and refreshed
    clock.now += 299
    assert account(cache, request).cache_read_input_tokens > 0
    clock.now += 301
    assert account(cache, request).cache_read_input_tokens == 0


def test_one_hour_ttl_outlives_the_default() -> None:
    clock = Clock()
    cache = PromptCache(ttl_seconds=300, clock=clock)
    request = body("question")
    request["system"][0]["cache_control"] = {"type": "ephemeral", "ttl": "1h"}
    request["messages"][0]["content"][0]["cache_control"] = {"type": "ephemeral", "ttl": "1h"}
    first = account(cache, request)
    assert first.creation_1h
    assert first.as_usage()["cache_creation"]["ephemeral_1h_input_tokens"] > 0
    clock.now += 3000
    assert account(cache, request).cache_read_input_tokens > 0


def test_prefixes_under_the_minimum_are_not_cached() -> None:
    cache = PromptCache(clock=Clock())
    small = body("question", system="You are terse.")
    assert account(cache, small).cache_creation_input_tokens == 0
    assert account(cache, small).cache_read_input_tokens == 0
    low = PromptCache(min_tokens=1, clock=Clock())
    account(low, small)
    assert account(low, small).cache_read_input_tokens == COUNTER.count_request(small)


def test_tenants_do_not_share_entries() -> None:
    cache = PromptCache(clock=Clock())
    request = body("question")
    account(cache, request, tenant="alice")
    assert account(cache, request, tenant="bob").cache_read_input_tokens == 0


def test_other_model_does_not_read() -> None:
    cache = PromptCache(clock=Clock())
    account(cache, body("question"))
    other = body("question")
    other["model"] = "claude-opus-4-5"
    assert account(cache, other).cache_read_input_tokens == 0


def test_no_breakpoint_no_cache() -> None:
    cache = PromptCache(clock=Clock())
    request = body("question", marked=False)
    request["system"] = LONG
    account(cache, request)
    usage = account(cache, request)
    assert usage.cache_read_input_tokens == usage.cache_creation_input_tokens == 0


def test_top_level_cache_control_marks_the_last_block() -> None:
    cache = PromptCache(clock=Clock())
    request = body("question", marked=False, cache_control=EPHEMERAL)
    request["system"] = LONG
    account(cache, request)
    assert account(cache, request).cache_read_input_tokens == COUNTER.count_request(request)


def test_lookback_is_bounded_to_twenty_blocks() -> None:
    def conversation(blocks: int) -> dict[str, Any]:
        turns = ["q0"] + [f"turn {i}" for i in range(1, blocks)]
        request = body(*turns)  # the breakpoint is on the last block
        request["system"] = "tiny system"
        return request

    for blocks, hits in ((15, True), (21, True), (22, False), (30, False)):
        cache = PromptCache(min_tokens=1, clock=Clock())
        account(cache, conversation(1))  # stores the prefix ending at "q0" (unit 1)
        usage = account(cache, conversation(blocks))
        assert (usage.cache_read_input_tokens > 0) is hits, blocks
