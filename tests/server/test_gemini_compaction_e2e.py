"""Compaction of Gemini traffic end to end: google-genai -> the proxy -> the stand-in.

A 40-turn tool-using session (tests/gemini_agent.py) on a Gemini 3 model, whole
and streamed, in a window small enough that offload, folds and read_result rounds all
happen: every upstream request must pass the stand-in's strict rules (thought
signatures included) and fit the window, read_result must never reach the SDK, the usage
it is told must be the last round's and within the window, and summaries go through the
Gemini API itself, made in place so that its implicit cache reads all of their prompt but
the ask.
"""

from __future__ import annotations

import uuid
from collections.abc import Awaitable, Callable
from typing import Any

import orjson
import pytest
from google import genai
from google.genai import types

from proxy.core.tokens import default_counter
from proxy.server.state import COMPACTOR
from proxy.testing import agent_loop
from proxy.testing.standin import StandInOptions
from proxy.wire.gemini_parts import GeminiCounter, function_calls
from proxy.wire.gemini_validation import check_request
from tests.gemini_agent import TOOL, GeminiAgent
from tests.server.compaction_checks import folds
from tests.server.conftest import SMALL_WINDOW, MakeProxy

TURNS = 40
RESULT_CHARS = 8_000
MODEL = "gemini-3-flash-preview"
PURPOSE = "x-compaction-proxy-purpose"

MakeStandIn = Callable[[StandInOptions], Awaitable[Any]]


def _answers_a_read(body: dict[str, Any]) -> bool:
    """The request continues a read_result round (its last model turn called it)."""
    model_turns = [c for c in body["contents"] if c.get("role") == "model"]
    if not model_turns or body["contents"][-1].get("role") != "user":
        return False
    calls = function_calls(model_turns[-1])
    return any(p["functionCall"]["name"] == "read_result" for p in calls)


@pytest.mark.parametrize("stream", [False, True], ids=["whole", "stream"])
async def test_a_long_gemini_session_stays_valid_and_within_the_window(
    make_standin: MakeStandIn, make_compacting_proxy: MakeProxy, stream: bool
) -> None:
    standin = await make_standin(StandInOptions(windows={"*": SMALL_WINDOW}, max_recorded=None))
    proxy = await make_compacting_proxy(
        "http://127.0.0.1:9", **{"upstream.gemini_url": standin.url}
    )
    options = types.HttpOptions(
        base_url=proxy.url, retry_options=types.HttpRetryOptions(attempts=1)
    )
    client = genai.Client(api_key="gemini-e2e-key", http_options=options)
    conversation = f"gemini-e2e-{uuid.uuid4().hex}"
    agent = GeminiAgent(client, MODEL, stream, 5, conversation, 1024, RESULT_CHARS)
    turns = await agent_loop.run(agent, TURNS)
    assert len(turns) == TURNS

    # Every upstream request passes the API's rules and fits the window.
    assert {(r.outcome, r.status) for r in standin.recorded} == {("complete", 200)}
    counter = GeminiCounter(default_counter())
    for r in standin.recorded:
        body = orjson.loads(r.body)
        assert check_request(body, MODEL) is None
        assert counter.count_request(body) <= SMALL_WINDOW

    # read_result rounds happened, and the SDK never saw one; the usage it was told is
    # the last round's, within the window.
    for t in turns:
        assert [c.name for c in t.calls] == [TOOL]
        assert t.content.parts is not None and t.content.parts[0].thought_signature
        usage = t.response.usage_metadata
        assert usage is not None and usage.prompt_token_count is not None
        assert 0 < usage.prompt_token_count <= SMALL_WINDOW
    turn_bodies = [orjson.loads(r.body) for r in standin.recorded if not r.headers.get(PURPOSE)]
    read_rounds = [b for b in turn_bodies if _answers_a_read(b)]
    assert len(read_rounds) >= TURNS // 5 - 2, "the stand-in's read_result calls were answered"
    if stream:
        for t in turns:
            finishes = [
                c.finish_reason
                for chunk in t.chunks
                for c in chunk.candidates or ()
                if c.finish_reason
            ]
            assert finishes == ["STOP"]
            assert not any(
                p.function_call and p.function_call.name == "read_result"
                for chunk in t.chunks
                for c in chunk.candidates or ()
                for p in (c.content.parts if c.content else None) or ()
            )

    # Offload and folds both happened; summaries were asked of the Gemini API itself.
    strategies = [t.headers.get("x-compaction-strategy") for t in turns]
    assert "offload" in strategies and folds(strategies)
    await proxy.app[COMPACTOR].settled()
    summaries = [r for r in standin.recorded if r.headers.get(PURPOSE) == "summary"]
    assert summaries
    for r in summaries:
        assert r.path_qs == f"/v1/models/{MODEL}:generateContent"
        assert r.headers["x-goog-api-key"] == "gemini-e2e-key"
    # Made in place: all of it but the ask is the conversation's request as it went
    # upstream, read whole from the implicit cache: a summary made ahead goes up once the
    # answer of the request it is made from has started, so that prefix is cached by then.
    for r in summaries:
        body = orjson.loads(r.body)
        prefix = counter.count_request({**body, "contents": body["contents"][:-1]})
        assert r.usage.get("cachedContentTokenCount") == prefix
    print(
        f"\n{'stream' if stream else 'whole'}: {len(summaries)} summaries,"
        f" {len([s for s in strategies if s and s != 'checkpoint'])} crossings,"
        f" {len(read_rounds)} read rounds"
    )
