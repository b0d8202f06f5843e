"""Compaction in transit, end to end: the anthropic SDK -> the proxy -> the strict stand-in.

A scripted agent (proxy/testing/agent.py) runs a long tool-using conversation with large
results against a small window. Every upstream request must be accepted by the stand-in
and fit the window; the rewritten prefix must stay byte-identical between crossings, so
the stand-in's prompt cache keeps reading it; summaries must stay few; read_result round
trips must be invisible to the SDK.
"""

from __future__ import annotations

import asyncio
import math
import uuid
from collections.abc import Awaitable, Callable
from typing import Any

import anthropic
import orjson
import pytest

from proxy.core.identity import tenant_of
from proxy.core.offload import stub_text, unknown_ref
from proxy.core.tokens import default_counter
from proxy.server.app import RunningProxy
from proxy.server.calibration import store_name
from proxy.server.compactor import calibrated_as
from proxy.server.state import COMPACTOR
from proxy.testing.agent import run_agent, tool_output
from proxy.testing.standin import RecordedRequest, StandInOptions
from proxy.wire import ANTHROPIC
from tests.server.compaction_checks import (
    assert_prefix_stable_between_crossings,
    assert_stubs_frozen_between_folds,
    folds,
    text_of,
)
from tests.server.conftest import SMALL_WINDOW, SMALL_WINDOW_POLICY, MakeProxy

TURNS = 60
RESULT_CHARS = 8_000
PURPOSE = "x-compaction-proxy-purpose"

MakeStandIn = Callable[[StandInOptions], Awaitable[Any]]


def client_for(proxy: RunningProxy) -> anthropic.AsyncAnthropic:
    return anthropic.AsyncAnthropic(base_url=proxy.url, api_key="sk-test-e2e", max_retries=0)


def turn_requests(recorded: list[RecordedRequest]) -> list[dict[str, Any]]:
    """The upstream requests that began a client turn: no summaries, no read rounds."""
    out = []
    for r in recorded:
        if r.path_qs.split("?")[0] != "/v1/messages" or r.headers.get(PURPOSE):
            continue
        body = orjson.loads(r.body)
        last = body["messages"][-1]["content"]
        reads = {
            b["id"]
            for m in body["messages"]
            if m["role"] == "assistant"
            for b in m["content"]
            if b.get("type") == "tool_use" and b["name"] == "read_result"
        }
        if isinstance(last, list) and any(b.get("tool_use_id") in reads for b in last):
            continue  # a read_result round, asked by the proxy itself
        out.append(body)
    return out


@pytest.mark.parametrize("stream", [False, True], ids=["whole", "stream"])
async def test_a_long_conversation_stays_valid_cached_and_cheap(
    make_standin: MakeStandIn,
    make_compacting_proxy: MakeProxy,
    stream: bool,
) -> None:
    standin = await make_standin(StandInOptions(windows={"*": SMALL_WINDOW}, max_recorded=None))
    proxy = await make_compacting_proxy(standin.url)
    turns = await run_agent(
        client_for(proxy),
        turns=TURNS,
        result_chars=RESULT_CHARS,
        stream=stream,
        read_every=5,
        conversation=f"e2e-{uuid.uuid4().hex}",
    )
    assert len(turns) == TURNS

    # Every upstream request was accepted and fits the window.
    assert {r.outcome for r in standin.recorded} == {"complete"}
    counter = default_counter()
    for r in standin.recorded:
        assert counter.count_request(orjson.loads(r.body)) <= SMALL_WINDOW

    # read_result rounds happened, and the SDK never saw one.
    for t in turns:
        assert all(b.type != "tool_use" or b.name != "read_result" for b in t.message.content)
        assert t.message.stop_reason == "tool_use"
    read_rounds = [
        r for r in standin.recorded if b'"tool_use_id"' in r.body and b"characters 0 to" in r.body
    ]
    assert len(read_rounds) >= TURNS // 5 - 2, "the stand-in's read_result calls were answered"

    # Hysteresis: a fold brings the history to the target and each turn adds about
    # `growth` tokens, so folds are at least (trigger - target) / growth turns apart.
    strategies = [t.headers.get("x-compaction-strategy") for t in turns]
    folded = folds(strategies)
    # Once offloaded, a turn adds a stub and its call: that is what brings the next fold.
    stub = stub_text(tool_output(1, RESULT_CHARS), "r_" + "0" * 16, "read_result",
                     SMALL_WINDOW_POLICY["stub_head_chars"], 8_000)  # fmt: skip
    growth = counter.count_text(stub) + 60
    gap = SMALL_WINDOW_POLICY["trigger"] - SMALL_WINDOW_POLICY["target"]
    bound = math.ceil(TURNS * growth / gap) + 1
    assert len(folded) <= bound
    await proxy.app[COMPACTOR].settled()
    summaries = [r for r in standin.recorded if r.headers.get(PURPOSE) == "summary"]
    # Each summary is asked for once: at a fold, or ahead of it (the last one may be
    # made ahead for a fold the session did not reach). A fold that came while its
    # summary was still being made ahead waited for it ("waited": under load).
    said = [t.headers.get("x-compaction-summary") for t in turns]
    used = said.count("made") + said.count("ahead") + said.count("waited")
    assert 1 <= used <= len(summaries) <= used + 1, said

    # Between crossings the rewritten prefix is byte-identical (cache_control aside).
    requests = turn_requests(standin.recorded)
    assert len(requests) == TURNS
    assert_prefix_stable_between_crossings(requests, strategies)
    assert_stubs_frozen_between_folds(requests, strategies)

    # ...so the stand-in reads it from its prompt cache.
    # (but the first rewrite: it adds read_result to the tools, the cached prefix's first
    # block, once per conversation).
    first = next(n for n, s in enumerate(strategies) if s)
    steady = [t for t, s in zip(turns[first + 1 :], strategies[first + 1 :], strict=True)
              if s in ("checkpoint", "offload")]  # fmt: skip
    assert steady and all(t.message.usage.cache_read_input_tokens > 0 for t in steady)
    reads = sum(t.message.usage.cache_read_input_tokens for t in turns)
    total = sum(
        t.message.usage.input_tokens
        + t.message.usage.cache_read_input_tokens
        + t.message.usage.cache_creation_input_tokens
        for t in turns
    )
    assert reads / total >= 0.6


async def test_nothing_fits_is_refused_in_the_api_shape(
    make_standin: MakeStandIn, make_compacting_proxy: MakeProxy
) -> None:
    standin = await make_standin(StandInOptions(windows={"*": SMALL_WINDOW}))
    proxy = await make_compacting_proxy(standin.url)
    huge = tool_output(0, 200_000)
    with pytest.raises(anthropic.BadRequestError) as caught:
        await client_for(proxy).messages.create(
            model="claude-test-1", max_tokens=100, messages=[{"role": "user", "content": huge}]
        )
    assert caught.value.status_code == 400
    error = caught.value.body["error"]  # type: ignore[index]
    assert error["type"] == "invalid_request_error"
    assert "prompt is too long even after compaction" in error["message"]
    assert standin.recorded == [], "nothing was sent upstream"


async def test_redis_stopped_mid_run_falls_back_to_packing(
    make_standin: MakeStandIn,
    make_compacting_proxy: MakeProxy,
    embedded_redis: Callable[[], Any],
) -> None:
    redis = embedded_redis()
    standin = await make_standin(StandInOptions(windows={"*": SMALL_WINDOW}, max_recorded=None))
    proxy = await make_compacting_proxy(standin.url, redis=redis.url)
    client = client_for(proxy)
    conversation = f"down-{uuid.uuid4().hex}"
    first = await run_agent(client, turns=10, result_chars=RESULT_CHARS, conversation=conversation)
    assert any(t.headers.get("x-compaction-strategy") for t in first)
    redis.stop_sync()
    later = await run_agent(client, turns=14, result_chars=RESULT_CHARS, conversation=conversation)
    assert {r.outcome for r in standin.recorded} == {"complete"}
    assert {t.headers.get("x-compaction-strategy") for t in later[7:]} <= {"pack", None}
    assert "pack" in {t.headers.get("x-compaction-strategy") for t in later}


async def test_two_replicas_agree_byte_for_byte_and_share_refs(
    make_standin: MakeStandIn, make_compacting_proxy: MakeProxy
) -> None:
    standin = await make_standin(StandInOptions(windows={"*": SMALL_WINDOW}, max_recorded=None))
    a = await make_compacting_proxy(standin.url)
    b = await make_compacting_proxy(standin.url)
    conversation = f"fleet-{uuid.uuid4().hex}"

    # Turns alternate between the replicas, as behind a load balancer.
    clients = [client_for(a), client_for(b)]
    calls = 0

    class Alternating:
        @property
        def messages(self) -> Any:
            nonlocal calls
            calls += 1
            return clients[calls % 2].messages

    turns = await run_agent(
        Alternating(),  # type: ignore[arg-type]
        turns=16,
        result_chars=RESULT_CHARS,
        read_every=3,
        conversation=conversation,
    )
    assert {r.outcome for r in standin.recorded} == {"complete"}
    assert "offload" in {t.headers.get("x-compaction-strategy") for t in turns}
    # A ref stubbed by one replica was read through the other: every read answered.
    answered = [r for r in standin.recorded if b"characters 0 to" in r.body]
    assert answered and not [r for r in standin.recorded if b"No offloaded result" in r.body]

    # The same request through either replica reaches the upstream as the same bytes,
    # with a fresh conversation (each plans it) and with a shared one (checkpoint reused).
    history = synthetic_history(12)
    for conversation_id in (None, f"same-{uuid.uuid4().hex}"):
        sent = []
        for client in clients:
            before = len(standin.recorded)
            headers = {"x-stand-in": '{"text": "ok"}'}
            headers["x-conversation-id"] = conversation_id or f"fresh-{uuid.uuid4().hex}"
            await client.messages.create(
                model="claude-test-1", max_tokens=64, messages=history, extra_headers=headers
            )
            (request,) = standin.recorded[before:]
            sent.append(request.body)
        assert sent[0] == sent[1]
        assert b"compaction-proxy offloaded this result" in sent[0]


def synthetic_history(turns: int) -> list[dict[str, Any]]:
    messages: list[dict[str, Any]] = [{"role": "user", "content": "Fix the build."}]
    for t in range(turns):
        call = {"type": "tool_use", "id": f"toolu_s{t}", "name": "Bash", "input": {"n": t}}
        result = {
            "type": "tool_result",
            "tool_use_id": f"toolu_s{t}",
            "content": tool_output(t, RESULT_CHARS),
        }
        messages += [
            {"role": "assistant", "content": [call]},
            {"role": "user", "content": [result]},
        ]
    return messages


async def test_a_client_tool_named_read_result_is_respected(
    make_standin: MakeStandIn, make_compacting_proxy: MakeProxy
) -> None:
    standin = await make_standin(StandInOptions(windows={"*": SMALL_WINDOW}))
    proxy = await make_compacting_proxy(standin.url)
    own = {
        "name": "read_result",
        "description": "The client's own tool.",
        "input_schema": {"type": "object", "properties": {}},
    }
    raw = await client_for(proxy).messages.with_raw_response.create(
        model="claude-test-1",
        max_tokens=64,
        tools=[own],
        messages=synthetic_history(12),
        extra_headers={"x-stand-in": '{"text": "ok"}'},
    )
    assert raw.headers["x-compaction-strategy"].startswith("offload")
    (request,) = standin.recorded
    sent = orjson.loads(request.body)
    assert [t["name"] for t in sent["tools"]] == ["read_result", "compaction_proxy_read_result"]
    assert sent["tools"][0] == own
    assert b'compaction_proxy_read_result(ref=\\"r_' in request.body


async def test_calibration_learns_the_upstream_tokenizer(
    make_standin: MakeStandIn,
    make_compacting_proxy: MakeProxy,
    make_store: Callable[..., Any],
    redis_key_prefix: str,
) -> None:
    """The stand-in counts 1.3x what we estimate; the fleet-wide factor learns it, and
    rewrites then start earlier (counts compared with the policy are calibrated)."""
    first_crossing = {}
    for scale in (1.0, 1.3):
        standin = await make_standin(
            StandInOptions(windows={"*": SMALL_WINDOW}, token_scale=scale, max_recorded=None)
        )
        proxy = await make_compacting_proxy(standin.url)
        # Results under the offload threshold: the first rewrite is the fold, late
        # enough in the session for the factor to have been learned.
        turns = await run_agent(
            client_for(proxy),
            turns=32,
            result_chars=1_600,
            model=f"claude-scale-{scale}",
            conversation=f"cal-{uuid.uuid4().hex}",
        )
        assert {r.outcome for r in standin.recorded} == {"complete"}
        strategies = [t.headers.get("x-compaction-strategy") for t in turns]
        first_crossing[scale] = next(n for n, s in enumerate(strategies) if s)
        await asyncio.sleep(0.2)  # the last sample is written in the background
        store = make_store(prefix=redis_key_prefix)
        name = store_name(
            calibrated_as(ANTHROPIC, f"claude-scale-{scale}"),
            tenant_of({"x-api-key": "sk-test-e2e"}),
        )
        factor, samples = await store.get_global_mean("calibration", name)
        assert samples >= 10
        assert factor == pytest.approx(scale, abs=0.03)
    assert first_crossing[1.3] < first_crossing[1.0]


async def test_refs_resolve_only_for_their_tenant(
    make_standin: MakeStandIn, make_compacting_proxy: MakeProxy
) -> None:
    """A stub copied into another tenant's history reads as missing, in the same words
    as a ref that never existed (docs/design.md#tenants-are-isolated)."""
    standin = await make_standin(StandInOptions(windows={"*": SMALL_WINDOW}, max_recorded=None))
    proxy = await make_compacting_proxy(standin.url)
    history = synthetic_history(12)
    headers = {"x-stand-in": '{"text": "ok"}', "x-conversation-id": "shared-name"}
    owner = anthropic.AsyncAnthropic(base_url=proxy.url, api_key="sk-tenant-a", max_retries=0)
    await owner.messages.create(
        model="claude-test-1", max_tokens=64, messages=history, extra_headers=headers
    )
    stolen = text_of(
        orjson.loads(standin.agent_calls[-1].body)["messages"][2]["content"][0]["content"]
    )
    assert "read_result(ref=" in stolen

    # Tenant B pastes A's stub ahead of its own long history, in the same conversation id.
    other = anthropic.AsyncAnthropic(base_url=proxy.url, api_key="sk-tenant-b", max_retries=0)
    theirs = synthetic_history(12)
    for message in theirs[2::2]:  # other results than A's, so other refs
        message["content"][0]["content"] = "B " + message["content"][0]["content"]
    theirs[0] = {"role": "user", "content": [{"type": "text", "text": f"See: {stolen}"}]}
    answer = await other.messages.create(
        model="claude-test-1",
        max_tokens=64,
        messages=theirs,
        extra_headers={**headers, "x-stand-in": '{"read_result": true, "text": "ok"}'},
    )
    assert all(b.type != "tool_use" for b in answer.content)
    round_two = orjson.loads(standin.agent_calls[-1].body)["messages"][-1]["content"][0]
    assert round_two["is_error"] is True
    assert round_two["content"] == unknown_ref(stolen.split('ref="')[1].split('"')[0])


async def test_refs_resolve_only_in_the_conversation_that_names_them(
    make_standin: MakeStandIn, make_compacting_proxy: MakeProxy
) -> None:
    """Blobs are stored once per tenant, but a conversation reads only the refs its own
    history names (docs/design.md#tenants-are-isolated):
    the same key in another conversation, with the
    stub pasted as text, reads it as missing."""
    standin = await make_standin(StandInOptions(windows={"*": SMALL_WINDOW}, max_recorded=None))
    proxy = await make_compacting_proxy(standin.url)
    client = anthropic.AsyncAnthropic(base_url=proxy.url, api_key="sk-one-tenant", max_retries=0)
    history = synthetic_history(12)
    first = {"x-stand-in": '{"text": "ok"}', "x-conversation-id": "first"}
    await client.messages.create(
        model="claude-test-1", max_tokens=64, messages=history, extra_headers=first
    )
    stub = text_of(
        orjson.loads(standin.agent_calls[-1].body)["messages"][2]["content"][0]["content"]
    )
    ref = stub.split('ref="')[1].split('"')[0]

    theirs = synthetic_history(12)
    for message in theirs[2::2]:
        message["content"][0]["content"] = "B " + message["content"][0]["content"]
    theirs[0] = {"role": "user", "content": [{"type": "text", "text": f"See: {stub}"}]}
    other = {"x-stand-in": '{"read_result": true, "text": "ok"}', "x-conversation-id": "other"}
    await client.messages.create(
        model="claude-test-1", max_tokens=64, messages=theirs, extra_headers=other
    )
    answered = orjson.loads(standin.agent_calls[-1].body)["messages"][-1]["content"][0]
    assert answered["is_error"] is True
    assert answered["content"] == unknown_ref(ref)
    await client.close()


async def test_sub_agents_sharing_a_session_keep_their_own_checkpoints(
    make_standin: MakeStandIn, make_compacting_proxy: MakeProxy
) -> None:
    """Claude Code gives its sub-agents the parent's session id: interleaved requests of
    two histories in one conversation must not overwrite each other's frozen prefix."""
    standin = await make_standin(StandInOptions(windows={"*": SMALL_WINDOW}, max_recorded=None))
    proxy = await make_compacting_proxy(standin.url)
    client = client_for(proxy)
    session = {"x-claude-code-session-id": f"s-{uuid.uuid4().hex}", "x-stand-in": '{"text": "ok"}'}
    histories = [synthetic_history(12), synthetic_history(12)]
    histories[1][0] = {"role": "user", "content": "A sub-agent's own task."}
    seen: list[list[str]] = [[], []]
    for step in range(3):
        for n, history in enumerate(histories):
            grown = [
                *history,
                {"role": "assistant", "content": f"step {step}"},
                {"role": "user", "content": f"go on {step}"},
            ]
            raw = await client.messages.with_raw_response.create(
                model="claude-test-1", max_tokens=64, messages=grown, extra_headers=session
            )
            seen[n].append(raw.headers["x-compaction-strategy"])
            histories[n] = grown
    for strategies in seen:
        assert strategies[0].startswith("offload")
        assert strategies[1:] == ["checkpoint", "checkpoint"]
