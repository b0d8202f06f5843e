"""The simulator behind `plan` and `replay` takes the Compactor's pure steps
(proxy/core/intake.py): the request's own wire format, and one checkpoint per first
message, as the server keeps them."""

from __future__ import annotations

from typing import Any

from proxy.core.policy import Policy
from proxy.core.tokens import TokenCounter
from proxy.ops.simulate import Simulator
from proxy.testing.chat_validate import validate_chat_request
from proxy.wire import openai as chat
from proxy.wire.formats import CHAT_FORMAT

POLICY = Policy(
    window=20_000,
    trigger=8_000,
    target=4_000,
    keep_last=2,
    keep_results=1,
    offload_threshold=300,
    stub_head_chars=200,
    note_cost=60,
).validate()


def words(n: int, seed: str) -> str:
    return " ".join(f"{seed}{i % 97}" for i in range(n))


def chat_request(turns: int) -> dict[str, Any]:
    messages: list[dict[str, Any]] = [
        {"role": "system", "content": "You are a coding agent."},
        {"role": "user", "content": "Fix the failing test in src/app.py"},
    ]
    for t in range(turns):
        call = {"id": f"c{t}", "type": "function", "function": {"name": "Read", "arguments": "{}"}}
        messages.append({"role": "assistant", "content": f"Step {t}", "tool_calls": [call]})
        messages.append({"role": "tool", "tool_call_id": f"c{t}", "content": words(400, f"w{t}")})
    tools = [{"type": "function", "function": {"name": "Read", "parameters": {"type": "object"}}}]
    return {"model": "gpt-test", "tools": tools, "messages": messages}


def anthropic_request(task: str, turns: int) -> dict[str, Any]:
    messages: list[dict[str, Any]] = [{"role": "user", "content": task}]
    for t in range(turns):
        use = {"type": "tool_use", "id": f"t{t}", "name": "Read", "input": {}}
        messages.append({"role": "assistant", "content": [{"type": "text", "text": "ok"}, use]})
        result = {"type": "tool_result", "tool_use_id": f"t{t}", "content": words(400, task[:3])}
        messages.append({"role": "user", "content": [result]})
    tools = [{"name": "Read", "input_schema": {"type": "object"}}]
    return {"model": "claude-test", "tools": tools, "messages": messages}


def test_a_chat_request_is_planned_and_sent_in_its_own_format() -> None:
    counter = TokenCounter()
    body = chat_request(turns=30)
    step = Simulator([POLICY], counter, fmt=CHAT_FORMAT).step(body)

    assert step.kind == "rewrite"
    assert step.offloaded and step.tokens_after < step.tokens_before
    name = CHAT_FORMAT.tool_name(body)
    assert name is not None
    assert step.body["tools"] == [*body["tools"], chat.read_result_tool(name)]
    assert step.fixed_tokens == chat.ChatCounter(counter).count_tools(step.body["tools"])
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
