"""read_result joins a Messages request deferred (tool search's `defer_loading`), loaded
by a `tool_reference` in its first stub, where the client defers tools already (Claude
Code's tool search): the request that adds it reads the client's tools, system and history
before its first stub from the prompt cache (the stand-in's model, proxy/testing/cache.py,
as the API's docs say) instead of writing them again. A client that defers none gets it
listed, as before."""

from __future__ import annotations

from typing import Any

import pytest

from proxy.core.offload import stub_text
from proxy.core.policy import Policy
from proxy.core.strategy import Strategy
from proxy.core.tokens import TokenCounter
from proxy.ops.replay import Turn, replay
from proxy.wire import ANTHROPIC, anthropic

COUNTER = TokenCounter()
EPHEMERAL = {"type": "ephemeral"}
SYSTEM = [{"type": "text", "text": " ".join(f"rule{i}" for i in range(3_000)),
           "cache_control": EPHEMERAL}]  # fmt: skip
READ = {"name": "Read", "description": "Reads a file. " * 50,
        "input_schema": {"type": "object", "properties": {"path": {"type": "string"}}}}  # fmt: skip
# What Claude Code defers (tool search): the API takes `defer_loading` from this client.
MCP = {"name": "mcp__docs__search", "description": "Searches the docs.", "defer_loading": True,
       "input_schema": {"type": "object", "properties": {"q": {"type": "string"}}}}  # fmt: skip


def session(turns: int, tools: tuple[dict[str, Any], ...] = (READ, MCP)) -> list[dict[str, Any]]:
    """A Claude Code-like conversation, one request per turn: each turn a Read whose
    result is about 2,500 tokens, the client's breakpoint on its newest block."""
    bodies, messages = [], [{"role": "user", "content": [{"type": "text", "text": "Read on."}]}]
    for t in range(turns):
        text = "\n".join(f"line {t}.{i}: value_{t}_{i} = {i * 7 + t}" for i in range(250))
        call = {"type": "tool_use", "id": f"toolu_{t}", "name": "Read", "input": {"path": f"f{t}"}}
        result = {"type": "tool_result", "tool_use_id": f"toolu_{t}", "content": text}
        messages = [*messages, {"role": "assistant", "content": [call]},
                    {"role": "user", "content": [result]}]  # fmt: skip
        marked = [
            *messages[:-1],
            {"role": "user", "content": [{**result, "cache_control": EPHEMERAL}]},
        ]
        bodies.append({"model": "claude-test-1", "max_tokens": 1_000, "system": SYSTEM,
                       "tools": list(tools), "messages": marked})  # fmt: skip
    return bodies


def first_offload(tools: tuple[dict[str, Any], ...] = (READ, MCP)) -> Turn:
    policy = Policy(match="claude-test-1", window=1_000_000, offload_trigger=8_000)
    result = replay(session(8, tools), [policy], COUNTER)
    return next(t for t in result.turns if t.strategy is not None)


def test_the_first_offload_reads_tools_system_and_history_from_the_cache(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    fixed = COUNTER.count_tools([READ]) + COUNTER.count_system(SYSTEM)
    deferred = first_offload()
    assert deferred.strategy == Strategy.OFFLOAD
    assert deferred.proxied.cache_read_input_tokens >= fixed  # up to the system breakpoint

    # The same tool not deferred: it is in the tools' prefix, so that request reads nothing.
    shipped = anthropic.read_result_tool

    def undeferred(name: str, deferred: bool = False) -> dict[str, Any]:
        return shipped(name)

    monkeypatch.setattr(anthropic, "read_result_tool", undeferred)
    listed = first_offload()
    assert listed.n == deferred.n and listed.proxied.cache_read_input_tokens == 0
    assert listed.proxy_cost > deferred.proxy_cost


def test_the_tool_is_deferred_and_the_first_stub_loads_it() -> None:
    body = session(3)[-1]
    messages = body["messages"]
    stub = stub_text(
        messages[2]["content"][0]["content"], "r_0123456789abcdef", "read_result", 100, 8_000
    )
    second = stub_text(
        messages[4]["content"][0]["content"], "r_1123456789abcdef", "read_result", 100, 8_000
    )
    stubbed = [dict(m) for m in messages]
    stubbed[2] = ANTHROPIC.with_results(messages[2], {0: stub})
    stubbed[4] = ANTHROPIC.with_results(messages[4], {0: second})
    fields = ANTHROPIC.with_history(body, stubbed, "read_result")
    assert fields["tools"][:2] == [READ, MCP]
    assert fields["tools"][2]["name"] == "read_result"
    assert fields["tools"][2]["defer_loading"] is True
    sent = fields["messages"]
    assert sent[2]["content"][0]["content"] == [
        {"type": "text", "text": stub},
        {"type": "tool_reference", "tool_name": "read_result"},
    ]
    assert sent[:2] == stubbed[:2] and sent[3:] == stubbed[3:]  # one reference a request
    tokens = COUNTER.count_message(sent[2]) - COUNTER.count_message(stubbed[2])
    assert tokens == ANTHROPIC.loading_tokens(COUNTER, "read_result", body["tools"])
    # No stub of this tool (a client's result that merely looks alike, another tool's
    # name): nothing loads it, so it is listed (a deferred tool no reference loads could
    # not be called).
    for history, name in ((stubbed, "compaction_proxy_read_result"), (messages, "read_result")):
        fields = ANTHROPIC.with_history(body, history, name)
        assert fields["messages"] == history
        assert "defer_loading" not in fields["tools"][2]


def test_a_client_that_defers_no_tool_gets_read_result_listed() -> None:
    """Its requests may reach an API or a platform that does not take `defer_loading`:
    the tool is listed as the client's are, and no stub carries a reference."""
    body = session(3, tools=(READ,))[-1]
    messages = body["messages"]
    stub = stub_text(
        messages[2]["content"][0]["content"], "r_0123456789abcdef", "read_result", 100, 8_000
    )
    stubbed = [*messages[:2], ANTHROPIC.with_results(messages[2], {0: stub}), *messages[3:]]
    fields = ANTHROPIC.with_history(body, stubbed, "read_result")
    assert fields["messages"] == stubbed
    assert fields["tools"] == [READ, anthropic.read_result_tool("read_result")]
    assert "defer_loading" not in fields["tools"][1]
    assert ANTHROPIC.loading_tokens(COUNTER, "read_result", body["tools"]) == 0
    listed = first_offload(tools=(READ,))
    assert listed.strategy == Strategy.OFFLOAD and listed.proxied.cache_read_input_tokens == 0


# Claude Code with ENABLE_TOOL_SEARCH=true (2.1.197, recorded): its rarely used tools go
# unsent until a ToolSearch call loads one, so its requests defer none, but every one
# carries this beta.
TOOL_SEARCH_BETAS = "claude-code-20250219,context-1m-2025-08-07,advanced-tool-use-2025-11-20"


def test_the_tool_search_beta_says_tool_search_is_on() -> None:
    assert anthropic.searches_tools(TOOL_SEARCH_BETAS)
    assert anthropic.searches_tools("tool-search-tool-2025-10-19")
    assert anthropic.searches_tools(" Advanced-Tool-Use-2025-11-20 ")
    assert not anthropic.searches_tools("claude-code-20250219,context-1m-2025-08-07")
    assert not anthropic.searches_tools("")


def test_a_client_with_tool_search_on_gets_read_result_deferred_though_it_defers_none() -> None:
    """Tool search on (its betas) and no tool deferred yet: read_result joins deferred,
    loaded by the first stub, and the request that adds it reads the client's tools and
    system from the cache; without the beta the same bodies get it listed."""
    body = session(3, tools=(READ,))[-1]
    messages = body["messages"]
    stub = stub_text(
        messages[2]["content"][0]["content"], "r_0123456789abcdef", "read_result", 100, 8_000
    )
    stubbed = [*messages[:2], ANTHROPIC.with_results(messages[2], {0: stub}), *messages[3:]]
    fields = ANTHROPIC.with_history(body, stubbed, "read_result", tool_search=True)
    assert fields["tools"] == [READ, anthropic.read_result_tool("read_result", deferred=True)]
    assert fields["messages"][2]["content"][0]["content"] == [
        {"type": "text", "text": stub},
        {"type": "tool_reference", "tool_name": "read_result"},
    ]
    tokens = COUNTER.count_message(fields["messages"][2]) - COUNTER.count_message(stubbed[2])
    assert tokens == ANTHROPIC.loading_tokens(COUNTER, "read_result", [READ], tool_search=True)
    assert tokens > 0

    policy = Policy(match="claude-test-1", window=1_000_000, offload_trigger=8_000)
    bodies = session(8, tools=(READ,))
    searching = replay(bodies, [policy], COUNTER, betas=TOOL_SEARCH_BETAS)
    plain = replay(bodies, [policy], COUNTER, betas="claude-code-20250219")
    first = next(t for t in searching.turns if t.strategy is not None)
    listed = next(t for t in plain.turns if t.strategy is not None)
    fixed = COUNTER.count_tools([READ]) + COUNTER.count_system(SYSTEM)
    assert first.n == listed.n and first.strategy == Strategy.OFFLOAD
    assert first.proxied.cache_read_input_tokens >= fixed
    assert listed.proxied.cache_read_input_tokens == 0
    assert searching.proxy_cost < plain.proxy_cost


def test_a_model_tool_search_is_documented_for_gets_it_deferred_without_a_beta() -> None:
    """No beta and no deferred tool of the client's (Claude Code as users run it behind a
    base URL): for a model Anthropic documents tool search for, read_result joins
    deferred all the same, and costs what it costs with the beta; a model not known to
    take it keeps it listed unless the client turns tool search on."""
    documented = [{**b, "model": "claude-sonnet-4-6"} for b in session(8, tools=(READ,))]
    policy = Policy(match="claude-sonnet-4-6", window=1_000_000, offload_trigger=8_000)
    plain = replay(documented, [policy], COUNTER, betas="claude-code-20250219")
    searching = replay(documented, [policy], COUNTER, betas=TOOL_SEARCH_BETAS)
    first = next(t for t in plain.turns if t.strategy is not None)
    fixed = COUNTER.count_tools([READ]) + COUNTER.count_system(SYSTEM)
    assert first.strategy == Strategy.OFFLOAD
    assert first.proxied.cache_read_input_tokens >= fixed
    assert plain.proxy_cost == searching.proxy_cost
    unknown = Policy(match="claude-test-1", window=1_000_000, offload_trigger=8_000)
    other = replay(session(8, tools=(READ,)), [unknown], COUNTER, betas="claude-code-20250219")
    listed = next(t for t in other.turns if t.strategy is not None)
    assert listed.proxied.cache_read_input_tokens == 0


def test_a_deferred_body_listed_is_the_same_plan_with_the_tool_listed() -> None:
    """What a refusal of the deferral is answered with (Request.listed): the client's
    tools, read_result listed last, the reference taken out of the stub that held it,
    every other message the very object it was."""
    body = session(3, tools=(READ,))[-1]
    messages = body["messages"]
    stub = stub_text(
        messages[2]["content"][0]["content"], "r_0123456789abcdef", "read_result", 100, 8_000
    )
    stubbed = [*messages[:2], ANTHROPIC.with_results(messages[2], {0: stub}), *messages[3:]]
    sent = {**body, **ANTHROPIC.with_history(body, stubbed, "read_result", tool_search=True)}
    plain = {**body, **ANTHROPIC.with_history(body, stubbed, "read_result")}
    assert ANTHROPIC.deferred(sent, "read_result") and not ANTHROPIC.deferred(plain, "read_result")
    listed = ANTHROPIC.listed(sent, "read_result")
    assert listed["tools"] == plain["tools"]
    assert not ANTHROPIC.deferred(listed, "read_result")
    assert listed["messages"][2]["content"][0]["content"] == [{"type": "text", "text": stub}]
    pairs = enumerate(zip(listed["messages"], sent["messages"], strict=True))
    assert all(a is b for n, (a, b) in pairs if n != 2)
    assert {k: v for k, v in listed.items() if k not in ("tools", "messages")} == {
        k: v for k, v in body.items() if k not in ("tools", "messages")
    }
