"""read_result deferred for every Messages-family client whose model takes tool search,
and what happens where the upstream does not take it (issue 35).

The proxy defers read_result (`defer_loading`, loaded by a `tool_reference` in the first
stub) for the models Anthropic documents tool search for, with or without the client's
tool-search beta. An API or a model that refuses that (the strict stand-in's
`refuses_deferral`: a 400 in the API's own shape naming the field) costs one refused
request: the proxy sends the same plan once more with read_result listed, the client
sees a normal answer, and later requests of that model there go listed at once. A
refusal of the listed form too is the client's answer. Through a real serve on a
loopback port, the anthropic SDK as client (Messages whole and streamed, Bedrock
streamed, Vertex whole).
"""

from __future__ import annotations

import uuid
from collections.abc import Awaitable, Callable
from dataclasses import replace
from pathlib import Path
from typing import Any

import anthropic
import orjson
import pytest

from proxy.config import UpstreamSettings
from proxy.core.commands import GetSummary
from proxy.server.app import RunningProxy
from proxy.server.state import COMPACTOR
from proxy.server.summariser import SummariserFailed, post_summary
from proxy.server.upstream import Upstream
from proxy.testing.agent import run_agent
from proxy.testing.google_oauth import TOKEN_PATH, write_service_account
from proxy.testing.standin import RecordedRequest, StandInOptions
from proxy.wire import ANTHROPIC
from tests.server.conftest import SMALL_WINDOW, MakeProxy
from tests.server.test_bedrock_vertex_e2e import (
    BEDROCK_MODEL,
    VERTEX_MODEL,
    bedrock_client,
    vertex_client,
)
from tests.server.test_tool_search import BASH, history

MODEL = "claude-sonnet-4-6"
PURPOSE = "x-compaction-proxy-purpose"
TURNS = 10
RESULT_CHARS = 8_000
MakeStandIn = Callable[[StandInOptions], Awaitable[Any]]


async def _serve(
    make_standin: MakeStandIn,
    make_compacting_proxy: MakeProxy,
    key: Path,
    refuses: tuple[str, ...],
    windows: dict[str, int] | None = None,
) -> tuple[Any, RunningProxy]:
    options = StandInOptions(
        windows=windows or {"*": SMALL_WINDOW}, max_recorded=None, refuses_deferral=refuses
    )
    standin = await make_standin(options)
    write_service_account(key, standin.url + TOKEN_PATH)
    proxy = await make_compacting_proxy(
        standin.url, **{"upstream.bedrock_url": standin.url, "upstream.vertex_url": standin.url}
    )
    return standin, proxy


async def _session(proxy: RunningProxy, client: Any, model: str, stream: bool) -> list[Any]:
    turns = await run_agent(
        client,
        turns=TURNS,
        result_chars=RESULT_CHARS,
        model=model,
        stream=stream,
        read_every=3,
        conversation=uuid.uuid4().hex,
    )
    await proxy.app[COMPACTOR].settled()
    return turns


def _calls(standin: Any) -> list[RecordedRequest]:
    """The conversation's requests upstream (read rounds among them), in order."""
    return [r for r in standin.recorded if r.path_qs != TOKEN_PATH and not r.headers.get(PURPOSE)]


def _texts(body: dict[str, Any]) -> list[str]:
    """Every text of the messages, in order (what a plan wrote, whatever the form)."""
    out: list[str] = []

    def walk(value: Any) -> None:
        if isinstance(value, str):
            out.append(value)
        elif isinstance(value, list):
            for v in value:
                walk(v)
        elif isinstance(value, dict):
            if value.get("type") == "tool_reference":
                return
            for k in ("text", "content"):
                walk(value.get(k))

    for message in body["messages"]:
        walk(message.get("content"))
    return out


def _read_result(body: dict[str, Any]) -> dict[str, Any] | None:
    return next((t for t in body.get("tools", []) if t.get("name") == "read_result"), None)


def _assert_fell_back_once(standin: Any, turns: list[Any]) -> None:
    """One request went with read_result deferred and was refused (400, naming the
    field); the very next is the same plan listed, answered; every later one went
    listed at once; the client saw normal answers only."""
    calls = _calls(standin)
    deferred = [r for r in calls if b'"defer_loading"' in r.body]
    assert len(deferred) == 1, [r.status for r in deferred]
    refused = deferred[0]
    assert refused.status == 400 and "defer_loading" in refused.error, refused.error
    assert b"tool_reference" in refused.body
    at = calls.index(refused)
    again, later = calls[at + 1], calls[at + 2 :]
    first, listed = orjson.loads(refused.body), orjson.loads(again.body)
    assert again.status == 200, again.error
    assert b"tool_reference" not in again.body
    tool = _read_result(listed)
    assert tool is not None and "defer_loading" not in tool
    assert _texts(listed) == _texts(first)  # the same plan, listed
    assert later and all(r.status == 200 for r in later), [r.error for r in later]
    assert all(b"defer_loading" not in r.body for r in later)
    assert any(_read_result(orjson.loads(r.body)) for r in later), "no later request offloaded"
    assert [r.status for r in calls[:at]] == [200] * at
    # Read rounds were answered by the proxy, after the fallback too.
    assert any(b"characters 0 to" in r.body for r in calls[at + 1 :])
    for t in turns:
        assert t.message.stop_reason == "tool_use"
        assert all(b.type != "tool_use" or b.name != "read_result" for b in t.message.content)
    assert any(t.headers.get("x-compaction-strategy") == "offload" for t in turns)


@pytest.mark.parametrize("stream", [False, True], ids=["whole", "stream"])
async def test_messages_deferral_refused_goes_listed_then_listed_first(
    make_standin: MakeStandIn,
    make_compacting_proxy: MakeProxy,
    cloud_credentials: Path,
    stream: bool,
) -> None:
    standin, proxy = await _serve(make_standin, make_compacting_proxy, cloud_credentials, (MODEL,))
    client = anthropic.AsyncAnthropic(base_url=proxy.url, api_key="sk-defer", max_retries=0)
    turns = await _session(proxy, client, MODEL, stream)
    await client.close()
    _assert_fell_back_once(standin, turns)
    compactor = proxy.app[COMPACTOR]
    assert not compactor.may_defer(standin.url, MODEL)
    assert compactor.may_defer(standin.url, "claude-opus-4-6")  # per model


async def test_messages_deferral_without_a_beta_where_the_model_takes_it(
    make_standin: MakeStandIn, make_compacting_proxy: MakeProxy, cloud_credentials: Path
) -> None:
    """No beta, no deferred tool of the client's: read_result joins deferred, loaded by
    one tool_reference, for a model tool search is documented for; taken as it is."""
    standin, proxy = await _serve(
        make_standin, make_compacting_proxy, cloud_credentials, ("claude-opus-*",)
    )
    client = anthropic.AsyncAnthropic(base_url=proxy.url, api_key="sk-defer", max_retries=0)
    turns = await _session(proxy, client, MODEL, stream=False)
    await client.close()
    calls = _calls(standin)
    assert all(r.status == 200 for r in calls), [r.error for r in calls]
    assert all("anthropic-beta" not in {k.lower() for k in r.headers} for r in calls)
    joined = [orjson.loads(r.body) for r in calls if b'"read_result"' in r.body]
    assert joined and all(r.get("messages") for r in joined)
    for body in joined:
        tool = _read_result(body)
        if tool is not None:  # (a read round's body carries it as round 1 did)
            assert tool["defer_loading"] is True
            assert orjson.dumps(body["messages"]).count(b'"tool_reference"') == 1
    assert any(t.headers.get("x-compaction-strategy") == "offload" for t in turns)


async def test_the_listed_form_refused_too_is_the_clients_answer(
    make_standin: MakeStandIn, make_compacting_proxy: MakeProxy, cloud_credentials: Path
) -> None:
    """The upstream refuses the listed form as well (here: its window is smaller than
    the proxy thinks): that 400 is what the client gets, and the deferral is not
    remembered as refused (the refusal was about something else)."""
    standin, proxy = await _serve(
        make_standin, make_compacting_proxy, cloud_credentials, (MODEL,), windows={"*": 2_000}
    )
    client = anthropic.AsyncAnthropic(base_url=proxy.url, api_key="sk-defer", max_retries=0)
    messages = [m for n, m in enumerate(history(16)) if n not in (1, 2)]  # no ToolSearch
    with pytest.raises(anthropic.BadRequestError) as refused:
        await client.messages.create(
            model=MODEL,
            max_tokens=512,
            tools=[BASH],  # type: ignore[list-item]
            messages=messages,  # type: ignore[arg-type]
        )
    await client.close()
    assert "prompt is too long" in str(refused.value)
    calls = _calls(standin)
    assert len(calls) == 2, [r.error for r in calls]
    deferred, listed = calls
    assert deferred.status == 400 and "defer_loading" in deferred.error
    assert listed.status == 400 and "prompt is too long" in listed.error
    assert b"defer_loading" not in listed.body and b'"read_result"' in listed.body
    assert proxy.app[COMPACTOR].may_defer(standin.url, MODEL)


async def test_bedrock_stream_deferral_refused_goes_listed(
    make_standin: MakeStandIn, make_compacting_proxy: MakeProxy, cloud_credentials: Path
) -> None:
    standin, proxy = await _serve(
        make_standin, make_compacting_proxy, cloud_credentials, ("claude-sonnet-4-5*",)
    )
    client = bedrock_client(proxy)
    turns = await _session(proxy, client, BEDROCK_MODEL, stream=True)
    _assert_fell_back_once(standin, turns)
    refused = next(r for r in _calls(standin) if r.status == 400)
    assert "/invoke-with-response-stream" in refused.path_qs
    assert not proxy.app[COMPACTOR].may_defer(standin.url, BEDROCK_MODEL)


async def test_vertex_whole_deferral_refused_goes_listed(
    make_standin: MakeStandIn, make_compacting_proxy: MakeProxy, cloud_credentials: Path
) -> None:
    standin, proxy = await _serve(
        make_standin, make_compacting_proxy, cloud_credentials, ("claude-sonnet-4-5*",)
    )
    turns = await _session(proxy, vertex_client(proxy), VERTEX_MODEL, stream=False)
    _assert_fell_back_once(standin, turns)
    refused = next(r for r in _calls(standin) if r.status == 400)
    assert ":rawPredict" in refused.path_qs


async def test_a_summary_made_in_place_refused_deferred_goes_once_more_listed(
    make_standin: MakeStandIn,
) -> None:
    """The in-place summary sends the conversation's request (read_result deferred in
    it, as the conversation's): refused, it goes once more listed, and the compactor is
    told; without a listed form the refusal is the summariser's failure, as before."""
    standin = await make_standin(StandInOptions(max_recorded=None, refuses_deferral=(MODEL,)))
    messages = [m for n, m in enumerate(history(4)) if n not in (1, 2)]
    stub = "log head\n[compaction-proxy offloaded this result: 4,000 characters; read_result"
    stub += '(ref="r_0123456789abcdef", start=8, length=8000) reads on]'
    messages[2] = ANTHROPIC.with_results(messages[2], {0: stub})
    body = {"model": MODEL, "max_tokens": 300, "tools": [BASH], "messages": messages}
    sent = {**body, **ANTHROPIC.with_history(body, messages, "read_result", True)}
    listed = {**body, **ANTHROPIC.with_history(body, messages, "read_result", False)}
    assert b"tool_reference" in orjson.dumps(sent)
    assert b"tool_reference" not in orjson.dumps(listed)
    ask = {"role": "user", "content": [{"type": "text", "text": "Summarise the work so far."}]}
    need = GetSummary(
        "k",
        {**sent, "messages": [*sent["messages"], ask]},
        300,
        MODEL,
        fallback={"model": MODEL, "max_tokens": 300, "messages": [ask]},
        relist="read_result",
    )
    upstream = Upstream(UpstreamSettings(url=standin.url))
    told: list[bool] = []
    headers = [("x-api-key", "sk-defer"), ("anthropic-version", "2023-06-01")]
    try:
        text, usage = await post_summary(
            need, upstream=upstream, path="/v1/messages", headers=headers, wire=ANTHROPIC,
            seconds=30, relisted=lambda: told.append(True),
        )  # fmt: skip
        assert text.strip() and usage is not None and told == [True]
        refused, answered = standin.recorded
        assert refused.status == 400 and "defer_loading" in refused.error
        assert answered.status == 200 and b"defer_loading" not in answered.body
        relisted = orjson.loads(answered.body)
        assert relisted["tools"] == listed["tools"] and b"tool_reference" not in answered.body
        assert _texts(relisted) == _texts({"messages": [*listed["messages"], ask]})
        with pytest.raises(SummariserFailed):
            await post_summary(
                replace(need, relist=None), upstream=upstream, path="/v1/messages",
                headers=headers, wire=ANTHROPIC, seconds=30,
            )  # fmt: skip
    finally:
        await upstream.close()
