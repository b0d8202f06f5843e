"""The simulator behind `plan` and `replay` takes the Compactor's pure steps
(proxy/core/intake.py): the request's own wire format, and one checkpoint per first
message, as the server keeps them."""

from __future__ import annotations

from typing import Any

from proxy.core.tokens import TokenCounter
from proxy.ops.simulate import Simulator
from proxy.wire import CHAT, chat
from proxy.wire.chat import ChatCounter
from proxy.wire.chat_validation import validate_chat_request
from tests.core.test_planner_chat import conversation, policy, words

POLICY = policy()


def chat_request(turns: int) -> dict[str, Any]:
    tools = [{"type": "function", "function": {"name": "Read", "parameters": {"type": "object"}}}]
    return {"model": "gpt-test", "tools": tools, "messages": conversation(turns)}


def anthropic_request(task: str, turns: int) -> dict[str, Any]:
    messages: list[dict[str, Any]] = [{"role": "user", "content": task}]
    for t in range(turns):
        use = {"type": "tool_use", "id": f"t{t}", "name": "Read", "input": {}}
        messages.append({"role": "assistant", "content": [{"type": "text", "text": "ok"}, use]})
        result = {"type": "tool_result", "tool_use_id": f"t{t}", "content": words(400, task[:3])}
        messages.append({"role": "user", "content": [result]})
    tools = [{"name": "Read", "input_schema": {"type": "object"}}]
    # max_tokens: Messages requires it, and an invalid request is forwarded untouched.
    return {"model": "claude-test", "max_tokens": 1024, "tools": tools, "messages": messages}


def test_a_chat_request_is_planned_and_sent_in_its_own_format() -> None:
    counter = TokenCounter()
    body = chat_request(turns=30)
    step = Simulator([POLICY], counter, fmt=CHAT).step(body)

    assert step.kind == "rewrite"
    assert step.offloaded and step.tokens_after < step.tokens_before
    name = CHAT.tool_name(body)
    assert name is not None
    assert step.body["tools"] == [*body["tools"], chat.read_result_tool(name)]
    assert step.fixed_tokens == ChatCounter(counter).count_tools(step.body["tools"])
    assert validate_chat_request(step.body) is None


def test_each_first_message_keeps_its_own_checkpoint() -> None:
    simulator = Simulator([POLICY], TokenCounter())
    first = simulator.step(anthropic_request("Fix the parser", turns=30))
    other = simulator.step(anthropic_request("Write the docs", turns=30))
    again = simulator.step(anthropic_request("Fix the parser", turns=31))

    assert first.kind == other.kind == "rewrite"
    assert first.strategy != "checkpoint" and other.strategy != "checkpoint"
    # The sub-agent in between did not replace the first conversation's frozen prefix.
    assert again.strategy == "checkpoint"
    assert len(simulator.checkpoints) == 2
