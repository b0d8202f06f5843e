"""Claude Code's deferred tool loading through the proxy (issue 23, finding 4).

With `ENABLE_TOOL_SEARCH=true` (needed since Claude Code 2.1.70 when ANTHROPIC_BASE_URL is
not Anthropic's), Claude Code 2.1.197 sends its rarely used tools only once loaded: a
`ToolSearch` call is answered with a tool_result of `tool_reference` blocks, and the tool
it loaded comes in `tools` with `defer_loading: true`, under the beta
`advanced-tool-use-2025-11-20` (recorded from the pinned CLI against the stand-in). The
proxy must forward all of it unchanged, under the trigger and in a rewrite, never offload
a result that is a tool reference, and the stand-in must accept it.
"""

from __future__ import annotations

import uuid
from collections.abc import Awaitable, Callable
from typing import Any

import anthropic
import orjson

from proxy.testing.agent import tool_output
from proxy.testing.standin import StandInOptions
from tests.server.conftest import SMALL_WINDOW, MakeProxy

BETA = "claude-code-20250219,advanced-tool-use-2025-11-20"
PURPOSE = "x-compaction-proxy-purpose"
BASH = {
    "name": "Bash",
    "description": "Run a shell command.",
    "input_schema": {"type": "object", "properties": {"command": {"type": "string"}}},
}
SEARCH = {
    "name": "ToolSearch",
    "description": "Load deferred tools by name.",
    "input_schema": {"type": "object", "properties": {"query": {"type": "string"}}},
}
FETCH = {
    "name": "WebFetch",
    "description": "Fetch a URL.",
    "input_schema": {"type": "object", "properties": {"url": {"type": "string"}}},
    "defer_loading": True,
}
REFERENCE = {"type": "tool_reference", "tool_name": "WebFetch"}
UNDOCUMENTED = "claude-3-5-haiku-20241022"  # a model tool search is not documented for
MakeStandIn = Callable[[StandInOptions], Awaitable[Any]]


def history(turns: int) -> list[dict[str, Any]]:
    messages: list[dict[str, Any]] = [
        {"role": "user", "content": "Fetch the build status page, then read the build logs."},
        {
            "role": "assistant",
            "content": [
                {
                    "type": "tool_use",
                    "id": "toolu_s",
                    "name": "ToolSearch",
                    "input": {"query": "select:WebFetch"},
                },
            ],
        },
        {
            "role": "user",
            "content": [
                {"type": "tool_result", "tool_use_id": "toolu_s", "content": [REFERENCE]},
                {"type": "text", "text": "Tool loaded."},
            ],
        },
    ]
    for t in range(turns):
        call = {"type": "tool_use", "id": f"toolu_{t}", "name": "Bash",
                "input": {"command": f"make step-{t}"}}  # fmt: skip
        result = {"type": "tool_result", "tool_use_id": f"toolu_{t}",
                  "content": tool_output(t, 4_000)}  # fmt: skip
        messages += [
            {"role": "assistant", "content": [call]},
            {"role": "user", "content": [result]},
        ]
    return messages


async def test_deferred_tools_and_tool_references_pass_through_and_are_kept(
    make_standin: MakeStandIn, make_compacting_proxy: MakeProxy
) -> None:
    standin = await make_standin(StandInOptions(windows={"*": SMALL_WINDOW}, max_recorded=None))
    proxy = await make_compacting_proxy(standin.url)
    client = anthropic.AsyncAnthropic(base_url=proxy.url, api_key="sk-tools", max_retries=0)
    conversation = uuid.uuid4().hex
    strategies = []
    for turns in (1, 8, 16, 24, 32):
        raw = await client.messages.with_raw_response.create(
            model="claude-sonnet-4-6",
            max_tokens=512,
            tools=[BASH, SEARCH, FETCH],  # type: ignore[list-item]
            messages=history(turns),  # type: ignore[arg-type]
            extra_headers={"anthropic-beta": BETA, "x-conversation-id": conversation},
        )
        await raw.parse()
        strategies.append(raw.headers.get("x-compaction-strategy") or "untouched")
    await client.close()
    assert strategies[0] == "untouched" and any(s != "untouched" for s in strategies), strategies
    sent = [r for r in standin.recorded if not r.headers.get(PURPOSE)]
    assert len(sent) == 5 and all(r.status == 200 for r in sent), [r.error for r in sent]
    for r in sent:
        body = orjson.loads(r.body)
        assert r.headers.get("anthropic-beta") == BETA
        # The deferred tool goes as the client defined it (read_result only added after).
        assert body["tools"][:3] == [BASH, SEARCH, FETCH]
        # The tool reference is never offloaded: where the history keeps it, unchanged.
        results = [
            b
            for m in body["messages"]
            if isinstance(m["content"], list)
            for b in m["content"]
            if b.get("tool_use_id") == "toolu_s"
        ]
        assert all(b["content"] == [REFERENCE] for b in results)
    first = orjson.loads(sent[0].body)
    assert first["messages"] == history(1)


def test_a_deferred_tool_counts_only_once_a_tool_reference_loads_it() -> None:
    """The API leaves a `defer_loading` tool out of the prompt until a tool_reference
    names it: the proxy's count and the stand-in's prompt-cache model agree."""
    from proxy.core.tokens import default_counter
    from proxy.testing.cache import prompt_units
    from proxy.wire import ANTHROPIC

    counter = default_counter()
    unused = {**FETCH, "name": "Unused", "description": "A rarely used tool. " * 200}
    before = {"model": "m", "max_tokens": 10, "tools": [BASH, SEARCH], "messages": history(2)}
    after = {**before, "tools": [BASH, SEARCH, FETCH, unused]}
    # FETCH is referenced (loaded), `unused` is not: only FETCH adds to the count.
    grown = counter.count_request(after) - counter.count_request(before)
    assert grown == counter.count_tools([BASH, SEARCH, FETCH]) - counter.count_tools([BASH, SEARCH])
    assert ANTHROPIC.fixed_tokens(counter, after) == counter.count_tools([BASH, SEARCH, FETCH])
    marked = history(2)
    marked[-1]["content"][-1]["cache_control"] = {"type": "ephemeral"}
    units = prompt_units({**after, "messages": marked}, counter)
    assert units[-1].cumulative_tokens == counter.count_request({**after, "messages": marked})
    assert units[2].cumulative_tokens == units[3].cumulative_tokens  # `unused` adds nothing


async def test_read_result_joins_deferred_where_the_beta_turns_tool_search_on(
    make_standin: MakeStandIn, make_compacting_proxy: MakeProxy
) -> None:
    """Before any ToolSearch call Claude Code defers no tool in `tools` (it does not send
    them), but its requests carry the tool-search beta: read_result joins deferred, the
    first stub loads it with a tool_reference; the same requests without the beta, for a
    model tool search is not documented for (model_facts.TOOL_SEARCH_MODELS: one that is
    gets it deferred without the beta, tests/server/test_deferral_fallback.py), get it
    listed, as the client may reach an API that takes no deferred tool."""
    standin = await make_standin(StandInOptions(windows={"*": SMALL_WINDOW}, max_recorded=None))
    proxy = await make_compacting_proxy(standin.url)
    client = anthropic.AsyncAnthropic(base_url=proxy.url, api_key="sk-tools", max_retries=0)
    messages = [m for n, m in enumerate(history(16)) if n not in (1, 2)]  # no ToolSearch yet
    for beta, model in ((BETA, "claude-sonnet-4-6"), ("claude-code-20250219", UNDOCUMENTED)):
        raw = await client.messages.with_raw_response.create(
            model=model,
            max_tokens=512,
            tools=[BASH, SEARCH],  # type: ignore[list-item]
            messages=messages,  # type: ignore[arg-type]
            extra_headers={"anthropic-beta": beta, "x-conversation-id": uuid.uuid4().hex},
        )
        await raw.parse()
        assert raw.headers.get("x-compaction-strategy") == "offload", raw.headers
    await client.close()
    sent = [r for r in standin.recorded if not r.headers.get(PURPOSE)]
    assert len(sent) == 2 and all(r.status == 200 for r in sent), [r.error for r in sent]
    searching, plain = (orjson.loads(r.body) for r in sent)
    for body in (searching, plain):
        assert body["tools"][:2] == [BASH, SEARCH]
        assert body["tools"][2]["name"] == "read_result"
    assert searching["tools"][2]["defer_loading"] is True
    assert "defer_loading" not in plain["tools"][2]
    loads = [
        b
        for m in searching["messages"]
        if isinstance(m["content"], list)
        for r in m["content"]
        if r.get("type") == "tool_result" and isinstance(r["content"], list)
        for b in r["content"]
        if b.get("type") == "tool_reference"
    ]
    assert loads == [{"type": "tool_reference", "tool_name": "read_result"}]
    assert b"tool_reference" not in orjson.dumps(plain["messages"])
