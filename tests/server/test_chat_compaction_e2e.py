"""Compaction of OpenAI Chat traffic end to end: the openai SDK -> the proxy -> the stand-in.

The same 60-turn scenario as test_compaction_e2e.py, in Chat format
(proxy/testing/agent_openai.py): every upstream request must pass the stand-in's strict
Chat validation and fit the window, read_result rounds must be invisible to the SDK
(streamed too: one completion id, one finish_reason, one usage chunk, one [DONE]), the
rewritten prefix must stay byte-identical between crossings so cached_tokens keep
coming, and summaries must stay few.
"""

from __future__ import annotations

import math
import uuid
from collections.abc import Awaitable, Callable
from typing import Any

import openai
import orjson
import pytest

from proxy.core.offload import stub_text
from proxy.core.tokens import default_counter
from proxy.server.app import RunningProxy
from proxy.server.state import COMPACTOR
from proxy.testing.agent import tool_output
from proxy.testing.agent_openai import run_openai_agent
from proxy.testing.standin import RecordedRequest, StandInOptions
from proxy.wire.chat import ChatCounter
from proxy.wire.chat_validation import validate_chat_request
from tests.server.compaction_checks import (
    assert_prefix_stable_between_crossings,
    assert_stubs_frozen_between_folds,
    folds,
)
from tests.server.conftest import SMALL_WINDOW, SMALL_WINDOW_POLICY, MakeProxy

TURNS = 60
RESULT_CHARS = 8_000
PURPOSE = "x-compaction-proxy-purpose"
CHAT = "/v1/chat/completions"

MakeStandIn = Callable[[StandInOptions], Awaitable[Any]]


async def chat_proxy(make_compacting_proxy: MakeProxy, upstream_url: str) -> RunningProxy:
    """A compacting proxy whose OpenAI upstream is the stand-in (the Anthropic one unused)."""
    return await make_compacting_proxy(
        "http://127.0.0.1:9", **{"upstream.openai_url": upstream_url}
    )


def client_for(proxy: RunningProxy) -> openai.AsyncOpenAI:
    return openai.AsyncOpenAI(base_url=proxy.url + "/v1", api_key="sk-test-e2e", max_retries=0)


def _answers_a_read(body: dict[str, Any]) -> bool:
    reads = {
        c["id"]
        for m in body["messages"]
        for c in m.get("tool_calls") or ()
        if c["function"]["name"] == "read_result"
    }
    last = body["messages"][-1]
    return last["role"] == "tool" and last["tool_call_id"] in reads


def turn_requests(recorded: list[RecordedRequest]) -> list[dict[str, Any]]:
    """The upstream requests that began a client turn: no summaries, no read rounds."""
    bodies = [
        orjson.loads(r.body) for r in recorded if r.path_qs == CHAT and not r.headers.get(PURPOSE)
    ]
    return [b for b in bodies if not _answers_a_read(b)]


@pytest.mark.parametrize("stream", [False, True], ids=["whole", "stream"])
async def test_a_long_chat_conversation_stays_valid_cached_and_cheap(
    make_standin: MakeStandIn,
    make_compacting_proxy: MakeProxy,
    stream: bool,
) -> None:
    standin = await make_standin(StandInOptions(windows={"*": SMALL_WINDOW}, max_recorded=None))
    proxy = await chat_proxy(make_compacting_proxy, standin.url)
    async with client_for(proxy) as client:
        turns = await run_openai_agent(
            client,
            turns=TURNS,
            result_chars=RESULT_CHARS,
            stream=stream,
            read_every=5,
            conversation=f"chat-e2e-{uuid.uuid4().hex}",
        )
    assert len(turns) == TURNS

    # Every upstream request passes OpenAI's rules and fits the window.
    assert {r.outcome for r in standin.recorded} == {"complete"}
    counter = ChatCounter(default_counter())
    for r in standin.recorded:
        body = orjson.loads(r.body)
        assert validate_chat_request(body) is None
        assert counter.count_request(body) <= SMALL_WINDOW

    # read_result rounds happened, and the SDK never saw one.
    for t in turns:
        choice = t.completion.choices[0]
        assert [c.function.name for c in choice.message.tool_calls or []] == ["Bash"]
        assert choice.finish_reason == "tool_calls"
    read_rounds = [b for r in standin.recorded if _answers_a_read(b := orjson.loads(r.body))]
    assert len(read_rounds) >= TURNS // 5 - 2, "the stand-in's read_result calls were answered"
    rounds = [int(t.headers.get("x-compaction-read-rounds", 0)) for t in turns]
    if not stream:
        assert sum(rounds) == len(read_rounds)
    if stream:
        for t in turns:
            ids = {c.id for c in t.chunks}
            finishes = [ch.finish_reason for c in t.chunks for ch in c.choices if ch.finish_reason]
            usage = [c.usage for c in t.chunks if c.usage is not None]
            calls = [tc for c in t.chunks for ch in c.choices for tc in ch.delta.tool_calls or []]
            assert len(ids) == 1 and finishes == ["tool_calls"] and len(usage) == 1
            assert {tc.index for tc in calls} == {0}
            assert all(tc.function is None or tc.function.name in (None, "Bash") for tc in calls)

    # Hysteresis: a crossing brings the history to the target and each turn adds about
    # `growth` tokens (one result and its call), so crossings are at least
    # (trigger - target) / growth turns apart; each makes at most one summary.
    strategies = [t.headers.get("x-compaction-strategy") for t in turns]
    crossings = [s for s in strategies if s and s != "checkpoint"]
    folded = folds(strategies)
    # Once offloaded, a turn adds a stub and its call: that is what brings the next fold.
    stub = stub_text(tool_output(1, RESULT_CHARS), "r_" + "0" * 16, "read_result",
                     SMALL_WINDOW_POLICY["stub_head_chars"], 8_000)  # fmt: skip
    growth = default_counter().count_text(stub) + 60
    gap = SMALL_WINDOW_POLICY["trigger"] - SMALL_WINDOW_POLICY["target"]
    bound = math.ceil(TURNS * growth / gap) + 1
    assert len(folded) <= bound
    await proxy.app[COMPACTOR].settled()
    summaries = [r for r in standin.recorded if r.headers.get(PURPOSE) == "summary"]
    # Each summary is asked for once: at a fold, or ahead of it (the last one may be
    # made ahead for a fold the session did not reach; a fold that came while its summary
    # was still being made ahead waited for it: "waited", under load).
    said = [t.headers.get("x-compaction-summary") for t in turns]
    used = said.count("made") + said.count("ahead") + said.count("waited")
    assert 1 <= used <= len(summaries) <= used + 1, said
    for r in summaries:  # the summariser spoke Chat to the same upstream
        assert r.path_qs == CHAT and orjson.loads(r.body)["messages"][0]["role"] == "system"

    # Between crossings the rewritten prefix is byte-identical...
    requests = turn_requests(standin.recorded)
    assert len(requests) == TURNS
    assert_prefix_stable_between_crossings(requests, strategies)
    assert_stubs_frozen_between_folds(requests, strategies)

    # ...so the stand-in reads it from its prompt cache.
    # (but the first rewrite: it adds read_result to the tools, once per conversation).
    first = next(n for n, s in enumerate(strategies) if s)
    steady = [t for t, s in zip(turns[first + 1 :], strategies[first + 1 :], strict=True)
              if s in ("checkpoint", "offload")]  # fmt: skip
    assert steady
    assert all(t.completion.usage.prompt_tokens_details.cached_tokens > 0 for t in steady)
    cached = sum(t.completion.usage.prompt_tokens_details.cached_tokens for t in turns)
    prompt = sum(t.completion.usage.prompt_tokens for t in turns)
    assert cached / prompt >= 0.6
    print(
        f"\n{'stream' if stream else 'whole'}: {len(summaries)} summaries (bound {bound}),"
        f" {len(crossings)} crossings, {len(read_rounds)} read rounds, cached {cached / prompt:.2f}"
    )


async def test_nothing_fits_is_refused_in_openai_shape(
    make_standin: MakeStandIn, make_compacting_proxy: MakeProxy
) -> None:
    standin = await make_standin(StandInOptions(windows={"*": SMALL_WINDOW}))
    proxy = await chat_proxy(make_compacting_proxy, standin.url)
    huge = tool_output(0, 200_000)
    async with client_for(proxy) as client:
        with pytest.raises(openai.BadRequestError) as caught:
            await client.chat.completions.create(
                model="gpt-test-1", messages=[{"role": "user", "content": huge}]
            )
    assert caught.value.status_code == 400
    assert caught.value.code == "context_length_exceeded"
    assert caught.value.type == "invalid_request_error"
    assert "prompt is too long even after compaction" in caught.value.message
    assert standin.recorded == [], "nothing was sent upstream"
