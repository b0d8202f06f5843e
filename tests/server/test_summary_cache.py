"""A summary made in place reads the conversation's cached prefix (issue 23, finding 1).

The summariser call made in the conversation's own request must send what precedes the
conversation's last cache breakpoint byte for byte (tools with `read_result`, system,
tool_choice, thinking, messages), and ask for the notes after it: the stand-in's prompt
cache (proxy/testing/cache.py) then reads nearly all of its prompt.
"""

from __future__ import annotations

import uuid
from collections.abc import Awaitable, Callable
from typing import Any

import anthropic
import orjson

from proxy.core.tokens import default_counter
from proxy.server.state import COMPACTOR
from proxy.testing.agent import run_agent
from proxy.testing.standin import StandInOptions
from tests.server.conftest import SMALL_WINDOW, MakeProxy

PURPOSE = "x-compaction-proxy-purpose"
COUNTER = default_counter()
MakeStandIn = Callable[[StandInOptions], Awaitable[Any]]


def read_share(usage: dict[str, Any]) -> float:
    read = int(usage.get("cache_read_input_tokens", 0))
    total = read + int(usage.get("input_tokens", 0))
    total += int(usage.get("cache_creation_input_tokens", 0))
    return read / max(total, 1)


async def test_a_summary_made_in_place_reads_its_prefix_from_the_cache(
    make_standin: MakeStandIn, make_compacting_proxy: MakeProxy
) -> None:
    standin = await make_standin(StandInOptions(windows={"*": SMALL_WINDOW}, max_recorded=None))
    proxy = await make_compacting_proxy(standin.url)
    client = anthropic.AsyncAnthropic(base_url=proxy.url, api_key="sk-test-cache", max_retries=0)
    await run_agent(client, turns=40, result_chars=3_000, conversation=f"cache-{uuid.uuid4().hex}")
    await proxy.app[COMPACTOR].settled()
    turns = [r for r in standin.recorded if not r.headers.get(PURPOSE)]
    calls = [r for r in standin.recorded if r.headers.get(PURPOSE) == "summary"]
    in_place = [r for r in calls if len(orjson.loads(r.body)["messages"]) > 1]
    assert in_place, "the summaries were made in place"
    assert all(r.outcome == "complete" for r in calls)
    # The tools of the summariser call are the conversation's own (read_result too).
    tools = {orjson.dumps(orjson.loads(r.body)["tools"]) for r in turns[-5:]}
    for r in in_place:
        assert orjson.dumps(orjson.loads(r.body)["tools"]) in tools
    # Everything before the proxy's ask (the conversation as it went upstream) is read
    # from the cache; the ask, with the originals of the folded span's offloaded results
    # shown whole (issue 35), is what the call pays in full.
    for r in in_place:
        body = orjson.loads(r.body)
        prefix = COUNTER.count_request({**body, "messages": body["messages"][:-1]})
        ask = COUNTER.count_request(body) - prefix
        read = int(r.usage.get("cache_read_input_tokens", 0))
        assert read >= prefix - 50, (read, prefix)
        assert int(r.usage.get("input_tokens", 0)) <= ask + 50, (r.usage, ask)


async def test_a_summary_made_in_place_that_calls_a_tool_is_made_again_from_a_transcript(
    make_standin: MakeStandIn, make_compacting_proxy: MakeProxy
) -> None:
    options = StandInOptions(
        windows={"*": SMALL_WINDOW}, max_recorded=None, script={"summary_tool": True}
    )
    standin = await make_standin(options)
    proxy = await make_compacting_proxy(standin.url)
    client = anthropic.AsyncAnthropic(base_url=proxy.url, api_key="sk-test-tool", max_retries=0)
    turns = await run_agent(
        client, turns=30, result_chars=3_000, conversation=f"tool-{uuid.uuid4().hex}"
    )
    await proxy.app[COMPACTOR].settled()
    calls = [r for r in standin.recorded if r.headers.get(PURPOSE) == "summary"]
    in_place = [r for r in calls if len(orjson.loads(r.body)["messages"]) > 1]
    transcripts = [r for r in calls if len(orjson.loads(r.body)["messages"]) == 1]
    assert in_place and all(any(b["type"] == "tool_use" for b in r.content) for r in in_place)
    # Each in-place call that called a tool was followed by one with the transcript...
    assert len(transcripts) == len(in_place)
    assert all(r.content and r.content[0]["type"] == "text" for r in transcripts)
    # ...whose notes are the summary the folds use.
    said = [t.headers.get("x-compaction-summary") for t in turns]
    assert said.count("made") + said.count("ahead") >= 1
    folded = [
        texts(orjson.loads(r.body))
        for r in standin.recorded
        if not r.headers.get(PURPOSE) and b"folded to save context" in r.body
    ]
    notes = {r.content[0]["text"].split("\n")[0] for r in transcripts}
    assert folded and all(any(n in text for n in notes) for text in folded)


def texts(body: dict[str, Any]) -> str:
    """The text blocks of a request's messages, joined."""
    out = []
    for m in body["messages"]:
        content = m["content"]
        blocks = [{"text": content}] if isinstance(content, str) else content
        out += [b["text"] for b in blocks if isinstance(b.get("text"), str)]
    return "\n".join(out)
