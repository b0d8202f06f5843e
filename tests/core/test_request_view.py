"""The request's view (`RequestView`), made once per count from the format's answers:
the fixed parts' tokens, read_result's name and what its tool adds, as the format's own
methods give them one by one; the driver plans with the view counting carried."""

from __future__ import annotations

import dataclasses
from typing import Any

import pytest

from proxy.core.counting import count_request, count_tokens
from proxy.core.driver import CompactionRequest, _read_result
from proxy.core.exact_json import ClientJSON
from proxy.core.policy import Policy
from proxy.core.request_view import request_view
from proxy.core.reuse import Seen
from proxy.core.tokens import TOOLS_PREAMBLE, TokenCounter
from proxy.core.wire_format import WireFormat
from proxy.wire import ANTHROPIC
from proxy.wire.chat import CHAT
from proxy.wire.gemini import GEMINI
from proxy.wire.responses import RESPONSES

BASE = TokenCounter()
BASH = {"name": "Bash", "description": "run", "input_schema": {"type": "object"}}
SEARCH = {"type": "tool_search_tool_regex_20251119", "name": "tool_search_tool_regex"}
DEFERRED = {**BASH, "name": "Fetch", "defer_loading": True}
USER = {"role": "user", "content": "Find the failing test."}
CHAT_TOOL = {"type": "function", "function": {"name": "Bash", "parameters": {}}}
RESPONSES_TOOL = {"type": "function", "name": "Bash", "parameters": {}}
GEMINI_TOOLS = [{"functionDeclarations": [{"name": "Bash", "parameters": {}}]}]

BODIES: list[tuple[WireFormat, dict[str, Any]]] = [
    (ANTHROPIC, {"system": "You code.", "tools": [BASH], "messages": [USER]}),
    (ANTHROPIC, {"messages": [USER]}),  # no tools: no preamble saved
    (ANTHROPIC, {"tools": [BASH, SEARCH, DEFERRED], "messages": [USER]}),  # deferred
    (ANTHROPIC, {"tools": [{**BASH, "name": n} for n in ("read_result",)], "messages": [USER]}),
    (CHAT, {"tools": [CHAT_TOOL], "messages": [USER]}),
    (CHAT, {"tools": [CHAT_TOOL], "n": 2, "messages": [USER]}),  # several choices: no name
    (RESPONSES, {"instructions": "You code.", "tools": [RESPONSES_TOOL], "input": "hi"}),
    (RESPONSES, {"previous_response_id": "resp_1", "input": "hi"}),  # lives upstream
    (GEMINI, {"tools": GEMINI_TOOLS, "contents": [{"role": "user", "parts": [{"text": "x"}]}]}),
]


def _one_by_one(
    wire: WireFormat, body: dict[str, Any], tool_search: bool = False
) -> tuple[int, str | None, int]:
    """What the driver worked out before the view: each fact asked of the format."""
    counter = wire.counter(BASE)
    fixed = wire.fixed_tokens(counter, body)
    name = wire.tool_name(body)
    if not name:
        return fixed, name, 0
    tools = body.get("tools")
    preamble = TOOLS_PREAMBLE if isinstance(tools, list) and tools else 0
    added = counter.count_tools([wire.read_result_tool(name)]) - preamble
    return fixed, name, added + wire.loading_tokens(counter, name, tools, tool_search)


@pytest.mark.parametrize("tool_search", [False, True])
@pytest.mark.parametrize(("wire", "body"), BODIES)
def test_the_view_says_what_the_format_says_one_fact_at_a_time(
    wire: WireFormat, body: dict[str, Any], tool_search: bool
) -> None:
    view = request_view(wire, wire.counter(BASE), body, tool_search=tool_search)
    facts = _one_by_one(wire, body, tool_search)
    assert (view.fixed_tokens, view.tool, view.tool_tokens) == facts
    assert view.tool_search == tool_search
    messages = wire.messages(body)
    seen = Seen(b"", body, wire.history_field)
    for counted in (
        count_request(wire, BASE, body, messages, tool_search=tool_search),
        count_request(wire, BASE, body, messages, seen, tool_search),
        count_request(wire, BASE, body, messages, seen, tool_search),  # the fixed tokens kept
    ):
        assert counted.view == view
        assert counted.fixed == view.fixed_tokens
    assert count_tokens(wire, BASE, body, messages).fixed == view.fixed_tokens


def test_tool_search_loads_read_result_where_the_client_defers_nothing() -> None:
    """With tool search on (the betas say so) read_result joins deferred, its first stub
    loading it: the view counts the loading; the driver reads a view made for another
    setting afresh (a count the shell made without the betas)."""
    body = BODIES[0][1]
    listed, searching = (request_view(ANTHROPIC, BASE, body, tool_search=t) for t in (False, True))
    assert searching.tool == listed.tool == "read_result"
    assert searching.tool_tokens > listed.tool_tokens
    messages = ANTHROPIC.messages(body)
    counted = count_request(ANTHROPIC, BASE, body, messages)
    asked = CompactionRequest(
        ANTHROPIC, body, messages, counted, BASE, Policy(), 1.0, ClientJSON(b"", body),
        tool_search=True,
    )  # fmt: skip
    assert _read_result(asked) == ("read_result", searching.tool_tokens)
    assert _read_result(dataclasses.replace(asked, tool_search=False)) == (
        "read_result",
        listed.tool_tokens,
    )


def test_names_and_deferral_are_the_formats() -> None:
    deferred = BODIES[2][1]
    view = request_view(ANTHROPIC, BASE, deferred)
    listed = request_view(ANTHROPIC, BASE, {**deferred, "tools": [BASH, SEARCH]})
    assert view.tool == listed.tool == "read_result"
    assert view.tool_tokens > listed.tool_tokens  # the stub's tool_reference loads it
    assert request_view(ANTHROPIC, BASE, BODIES[3][1]).tool == "compaction_proxy_read_result"
    assert request_view(CHAT, CHAT.counter(BASE), BODIES[5][1]).tool is None
    assert request_view(RESPONSES, RESPONSES.counter(BASE), BODIES[7][1]).tool_tokens == 0
