"""What the driver sends is a request the API takes, or nothing of its own (issue 36,
findings 2 and 3): a history the API would refuse is neither rewritten nor summarised,
and a rewrite the API would refuse (here a faulty format that empties the history, as a
packing that dropped the pinned last user message did) is never sent."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

import orjson

from proxy.core.driver import CompactionRequest, commands_of, compaction
from proxy.core.exact_json import ClientJSON
from proxy.core.outcome import Refuse, Rewrite, Untouched
from proxy.core.wire_format import JSON
from proxy.wire.anthropic import AnthropicMessages
from tests.core.test_driver import NO_OFFLOAD, Store, history_between, kinds, request
from tests.core.test_planner import conversation, policy


class EmptyingRewrites(AnthropicMessages):
    """Messages, except that every rewrite loses its history."""

    def with_history(
        self,
        body: Mapping[str, Any],
        messages: list[JSON],
        tool: str | None,
        tool_search: bool = False,
    ) -> JSON:
        return super().with_history(body, [], tool, tool_search)


def faulty(req: CompactionRequest) -> CompactionRequest:
    return dataclasses.replace(req, wire=EmptyingRewrites())


def test_the_control_is_an_offload_crossing() -> None:
    commands, decision = commands_of(compaction(request(conversation(12))), Store())
    assert kinds(commands) == ["LoadConversation", "SaveCrossing"]
    assert isinstance(decision.outcome, Rewrite)


def test_a_rewrite_with_no_messages_is_never_sent_nor_saved() -> None:
    req = faulty(request(conversation(12)))
    commands, decision = commands_of(compaction(req), Store())
    assert kinds(commands) == ["LoadConversation"], "no checkpoint of a rewrite never sent"
    assert isinstance(decision.outcome, Untouched)
    assert decision.outcome.reason == "invalid_rewrite"
    assert decision.body is None and decision.sent is None, "the client's bytes go up"
    assert decision.declined.startswith("invalid_rewrite: messages: at least one message")


def test_a_rewrite_with_no_messages_over_the_window_is_refused_as_the_api_would() -> None:
    req = faulty(request(conversation(12), policy(window=19_000)))
    commands, decision = commands_of(compaction(req), Store())
    assert "SaveCrossing" not in kinds(commands)
    assert isinstance(decision.outcome, Refuse)
    assert decision.outcome.reason == "invalid_rewrite"
    assert decision.outcome.message.startswith("prompt is too long")


def test_an_invalid_history_over_the_fold_trigger_asks_for_no_summary() -> None:
    messages = conversation(12)
    messages[-1]["content"][0]["tool_use_id"] = "toolu_NOPE"  # answers no call
    commands, decision = commands_of(compaction(request(messages)), Store())
    assert kinds(commands) == ["LoadConversation"]
    assert isinstance(decision.outcome, Untouched)
    assert decision.outcome.reason == "invalid_request"
    assert "toolu_0011" in decision.declined, "its call, now unanswered"


def test_a_field_given_twice_is_never_rewritten() -> None:
    """orjson reads the last of two `model` keys, an upstream may obey the first, and a
    rewrite would send only the last: such a body goes up as it came."""
    req = request(conversation(12))
    raw = orjson.dumps(req.body).replace(b'{"model":', b'{"model":"other","model":', 1)
    req = dataclasses.replace(req, source=ClientJSON(raw, req.body))
    commands, decision = commands_of(compaction(req), Store())
    assert kinds(commands) == ["LoadConversation"]
    assert isinstance(decision.outcome, Untouched)
    assert decision.outcome.reason == "invalid_request"
    assert decision.declined == "the key 'model' appears more than once in one object"


def test_an_invalid_history_that_would_fold_is_checked_before_any_summary() -> None:
    """A fold asks for a summary before its rewrite is built: the client's request is
    checked first there (an offload rewrite's is checked with the rewrite, `_checked`)."""
    messages = history_between(11_000, 13_000)
    control, _ = commands_of(compaction(request(messages, NO_OFFLOAD)), Store())
    assert kinds(control) == ["LoadConversation", "GetSummary", "SaveCrossing"]
    messages[-1]["content"][0]["tool_use_id"] = "toolu_NOPE"  # answers no call
    commands, decision = commands_of(compaction(request(messages, NO_OFFLOAD)), Store())
    assert kinds(commands) == ["LoadConversation"]
    assert isinstance(decision.outcome, Untouched)
    assert decision.outcome.reason == "invalid_request"
    assert decision.body is None and decision.sent is None
