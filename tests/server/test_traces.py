"""OpenTelemetry traces (issue 24): a real `serve` process configured by the standard
OTEL_* variables only exports to a real OTLP/HTTP receiver in the test process, which
decodes the protobuf payloads. Checked: one SERVER span per request continuing the
client's trace, the GenAI and compaction attributes, a CLIENT span per upstream call
(the request, each read round, the summariser) whose context reaches the upstream as its
`traceparent`, Redis spans, a fold's and a pack's events, a summary made ahead in a trace
of its own linked to its request, exemplars on the latency metrics, no prompt text or
credential anywhere in what is exported, the last spans flushed on shutdown. Set-up and
edges (tracing off, the WebSocket frame API) are in test_traces_setup.py."""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import threading
import uuid
from collections.abc import Awaitable, Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import aiohttp
import anthropic
import openai
import orjson
import pytest

from proxy.testing.agent import Turn, run_agent
from proxy.testing.standin import StandInOptions
from tests.plugins.standin import RunningStandIn
from tests.server.conftest import SMALL_WINDOW, SMALL_WINDOW_POLICY
from tests.server.otlp_receiver import (
    INTERNAL,
    ReceivedSpan,
    Receiver,
    client_context,
    contexts,
    receiver,
    server_spans,
    traceparent_of,
    upstream_calls,
)
from tests.server.test_metrics import long_history

MakeStandIn = Callable[[StandInOptions], Awaitable[RunningStandIn]]
__all__ = ["receiver"]  # the fixture
PURPOSE = "x-compaction-proxy-purpose"


def _policy_toml() -> str:
    lines = ["[[policy]]"]
    for key, value in SMALL_WINDOW_POLICY.items():
        lines.append(f"{key} = {orjson.dumps(value).decode()}")
    return "\n".join(lines) + "\n"


class Serve:
    """`compaction-proxy serve` as a child process, its stderr drained into `lines`."""

    def __init__(self, env: dict[str, str], config: Path) -> None:
        child_env = {
            k: v
            for k, v in os.environ.items()
            if not k.startswith(("COMPACTION_PROXY_", "OTEL_")) and k != "REDIS_URL"
        }
        child_env.update(env)
        self.child = subprocess.Popen(
            [sys.executable, "-m", "proxy", "serve", "--config", str(config)],
            env=child_env,
            stderr=subprocess.PIPE,
            text=True,
        )
        self.lines: list[str] = []
        self.url = ""
        assert self.child.stderr is not None
        for line in self.child.stderr:
            self.lines.append(line)
            if "listening on " in line:
                self.url = line.split("listening on ")[1].split(",")[0]
                break
        assert self.url.startswith("http://127.0.0.1:"), "".join(self.lines)
        self._drain = threading.Thread(target=self._read, daemon=True)
        self._drain.start()

    def _read(self) -> None:
        assert self.child.stderr is not None
        for line in self.child.stderr:
            self.lines.append(line)

    async def stopped(self) -> int:
        """SIGTERM, then wait for the exit without blocking the test's loop (its OTLP
        receiver must go on answering the last exports)."""
        self.child.send_signal(signal.SIGTERM)
        for _ in range(600):
            if (code := self.child.poll()) is not None:
                return code
            await asyncio.sleep(0.05)
        return self.stop()

    def stop(self) -> int:
        if self.child.poll() is None:
            self.child.send_signal(signal.SIGTERM)
        try:
            return self.child.wait(timeout=30)
        except subprocess.TimeoutExpired:
            self.child.kill()
            return self.child.wait()


@contextmanager
def serve(tmp_path: Path, standin: str, redis_url: str, prefix: str, **env: str) -> Iterator[Serve]:
    config = tmp_path / "proxy.toml"
    config.write_text(_policy_toml())
    settings = {
        "COMPACTION_PROXY_SERVER_PORT": "0",
        "COMPACTION_PROXY_SERVER_DRAIN_TIMEOUT": "1",
        "COMPACTION_PROXY_UPSTREAM_URL": standin,
        "COMPACTION_PROXY_UPSTREAM_OPENAI_URL": standin,
        "COMPACTION_PROXY_STORE_KEY_PREFIX": prefix,
        "REDIS_URL": redis_url,
        **env,
    }
    running = Serve(settings, config)
    try:
        yield running
    finally:
        running.stop()


def otel(receiver: Receiver, **more: str) -> dict[str, str]:
    return {
        "OTEL_TRACES_EXPORTER": "otlp",
        "OTEL_EXPORTER_OTLP_ENDPOINT": receiver.url,
        "OTEL_EXPORTER_OTLP_PROTOCOL": "http/protobuf",
        "OTEL_SERVICE_NAME": "proxy-under-test",
        "OTEL_BSP_SCHEDULE_DELAY": "50",
        **more,
    }


def check_propagated(standin: RunningStandIn, calls: list[ReceivedSpan], sent: str) -> None:
    """Each upstream call got its own CLIENT span's context as its traceparent, never the
    client's own."""
    arrived = contexts(standin.recorded)
    assert sent[:52] not in arrived
    for call in calls:
        assert traceparent_of(call) in arrived, call.name


# -- Messages: a read round and a summary in one request --------------------------------


@pytest.mark.parametrize("stream", [False, True], ids=["whole", "stream"])
async def test_a_messages_request_with_a_read_round_and_a_summary(
    tmp_path: Path,
    make_standin: MakeStandIn,
    receiver: Receiver,
    redis_url: str,
    redis_key_prefix: str,
    stream: bool,
) -> None:
    standin = await make_standin(StandInOptions(windows={"*": SMALL_WINDOW}, max_recorded=None))
    trace_id, span_id, traceparent = client_context()
    with serve(tmp_path, standin.url, redis_url, redis_key_prefix, **otel(receiver)) as proxy:
        client = anthropic.AsyncAnthropic(
            base_url=proxy.url,
            api_key="sk-traces",
            max_retries=0,
            default_headers={"traceparent": traceparent, "tracestate": "vendor=client-state"},
        )
        request: dict[str, Any] = {
            "model": "claude-test-1",
            "max_tokens": 64,
            "messages": long_history(turns=10, chars=6_000, chat_chars=600),
            "extra_headers": {"x-stand-in": orjson.dumps({"read_result": True}).decode()},
        }
        async with client:
            if stream:
                async with client.messages.stream(**request) as s:
                    await s.get_final_message()
                    headers = s.response.headers
            else:
                raw = await client.messages.with_raw_response.create(**request)
                headers = raw.headers
        assert headers["x-compaction-strategy"] == "offload+summary"
        assert headers["x-compaction-summary"] == "made"

        def complete(spans: list[ReceivedSpan]) -> bool:
            found = server_spans(spans, trace_id)
            return bool(found) and len(upstream_calls(spans, found[0])) >= 3

        spans = await receiver.wait_for(complete)

    (server,) = server_spans(spans, trace_id)
    # The client's span is the server span's parent; its tracestate is carried on.
    assert server.parent_span_id == span_id
    assert server.trace_state == "vendor=client-state"
    assert server.resource["service.name"] == "proxy-under-test"
    assert server.name == "chat claude-test-1"
    a = server.attributes
    assert a["gen_ai.operation.name"] == "chat"
    assert a["gen_ai.provider.name"] == a["gen_ai.system"] == "anthropic"
    assert a["gen_ai.request.model"] == "claude-test-1"
    assert a["gen_ai.response.model"]
    assert a["http.response.status_code"] == 200 and a["http.route"] == "/v1/messages"
    assert a["compaction.strategy"] == "offload+summary"
    assert a["compaction.summary"] == "made"
    assert a["compaction.offloaded"] > 0
    assert a["compaction.tokens_before"] > a["compaction.tokens_after"] > 0
    assert a["compaction.read_rounds"] >= 1
    assert a["compaction.tenant"].startswith("t") and a["compaction.conversation"]
    # Usage: every round the stand-in answered for the client (not the summariser),
    # input normalised to include cached input.
    rounds = [r.usage for r in standin.agent_calls]
    total_in = sum(
        u["input_tokens"] + u["cache_read_input_tokens"] + u["cache_creation_input_tokens"]
        for u in rounds
    )
    assert a["gen_ai.usage.input_tokens"] == total_in
    assert a["gen_ai.usage.output_tokens"] == sum(u["output_tokens"] for u in rounds)
    assert a["gen_ai.usage.cache_read.input_tokens"] == sum(
        u["cache_read_input_tokens"] for u in rounds
    )
    assert a["gen_ai.usage.cache_creation.input_tokens"] == sum(
        u["cache_creation_input_tokens"] for u in rounds
    )
    # The summariser's call, apart (it is the proxy's spending, not the answer's).
    (summarised,) = [r.usage for r in standin.recorded if r.headers.get(PURPOSE)]
    assert a["compaction.summariser.output_tokens"] == summarised["output_tokens"]
    assert a["compaction.summariser.input_tokens"] == sum(
        summarised[k]
        for k in ("input_tokens", "cache_read_input_tokens", "cache_creation_input_tokens")
    )
    # A fold's event, with what it did.
    (fold,) = [attrs for name, attrs in server.events if name == "compaction.fold"]
    assert fold["compaction.strategy"] == "offload+summary"
    assert fold["compaction.tokens_before"] == a["compaction.tokens_before"]

    # One CLIENT span per upstream call: the request, each read round, the summariser.
    calls = upstream_calls(spans, server)
    assert {c.attr("gen_ai.provider.name") for c in calls} == {"anthropic"}
    purposes = sorted(c.attr("compaction.purpose") for c in calls)
    assert purposes.count("request") == 1 and purposes.count("summary") == 1
    assert purposes.count("read_round") == a["compaction.read_rounds"]
    assert len(calls) == len(standin.recorded)
    for call in calls:
        assert call.attr("http.response.status_code") == 200
        assert call.attr("gen_ai.request.model") == "claude-test-1"
        assert call.name == "chat claude-test-1"
        assert call.end_ns >= call.start_ns > 0
    check_propagated(standin, calls, traceparent)
    # Redis round trips of the request, under its span.
    redis_spans = [s for s in spans if s.attr("db.system.name") == "redis"]
    assert any(s.parent_span_id == server.span_id for s in redis_spans)
    # Named by what the store does: the load, the summary's lookup and lock, the save.
    assert {s.attr("db.operation.name") for s in redis_spans} >= {
        "Store.load_conversation",
        "Store.get_json",
        "Store.acquire_lock",
        "Store.save_crossing",
    }
    assert all(s.name == f"redis {s.attr('db.operation.name')}" for s in redis_spans)


async def test_a_pack_when_the_summariser_fails(
    tmp_path: Path,
    make_standin: MakeStandIn,
    receiver: Receiver,
    redis_url: str,
    redis_key_prefix: str,
) -> None:
    standin = await make_standin(
        StandInOptions(
            windows={"*": SMALL_WINDOW}, script={"summary_fault": "500"}, max_recorded=None
        )
    )
    trace_id, _, traceparent = client_context()
    with serve(tmp_path, standin.url, redis_url, redis_key_prefix, **otel(receiver)) as proxy:
        client = anthropic.AsyncAnthropic(
            base_url=proxy.url,
            api_key="sk-pack",
            max_retries=0,
            default_headers={"traceparent": traceparent},
        )
        async with client:
            raw = await client.messages.with_raw_response.create(
                model="claude-test-1",
                max_tokens=64,
                messages=long_history(turns=12, chars=4_000, chat_chars=600),  # type: ignore[arg-type]
            )
        assert raw.headers["x-compaction-strategy"] in ("pack", "offload+pack")
        spans = await receiver.wait_for(
            lambda spans: any(
                len(upstream_calls(spans, s)) >= 2 for s in server_spans(spans, trace_id)
            )
        )
    (server,) = server_spans(spans, trace_id)
    assert server.attr("compaction.reason") == "summary_unavailable"
    assert server.attr("compaction.summariser_failures") == 1
    (pack,) = [attrs for name, attrs in server.events if name == "compaction.pack"]
    assert pack["compaction.strategy"] == raw.headers["x-compaction-strategy"]
    assert pack["compaction.reason"] == "summary_unavailable"
    assert not [name for name, _ in server.events if name == "compaction.fold"]
    (summary,) = [
        c for c in upstream_calls(spans, server) if c.attr("compaction.purpose") == "summary"
    ]
    assert summary.attr("http.response.status_code") == 500
    assert summary.attr("error.type") == "500" and summary.status_code == 2  # ERROR
    assert server.status_code != 2  # the proxy degraded: the client's request succeeded


# -- Chat Completions and Responses ------------------------------------------------------


async def test_chat_completions_and_responses(
    tmp_path: Path,
    make_standin: MakeStandIn,
    receiver: Receiver,
    redis_url: str,
    redis_key_prefix: str,
) -> None:
    standin = await make_standin(StandInOptions())
    chat_trace, chat_span, chat_parent = client_context()
    responses_trace, responses_span, responses_parent = client_context()
    other_trace, other_span, other_parent = client_context()
    with serve(tmp_path, standin.url, redis_url, redis_key_prefix, **otel(receiver)) as proxy:
        client = openai.AsyncOpenAI(base_url=f"{proxy.url}/v1", api_key="sk-openai", max_retries=0)
        async with client:
            chat = await client.chat.completions.create(
                model="gpt-test-1",
                messages=[{"role": "user", "content": "Say hello."}],
                extra_headers={"traceparent": chat_parent},
            )
            stream = await client.responses.create(
                model="gpt-test-1",
                input="Say hello.",
                stream=True,
                extra_headers={"traceparent": responses_parent},
            )
            async for _event in stream:
                pass
        # The latency histograms carry the traced requests' trace ids as exemplars, in
        # the OpenMetrics format Prometheus asks for (a data link from a metric to traces).
        openmetrics = "application/openmetrics-text; version=1.0.0; charset=utf-8"
        async with aiohttp.ClientSession() as session:
            async with session.get(f"{proxy.url}/metrics", headers={"Accept": openmetrics}) as r:
                assert r.headers["Content-Type"].startswith("application/openmetrics-text")
                exposed = await r.text()
            async with session.get(f"{proxy.url}/metrics") as r:
                plain = await r.text()
            # A route the proxy passes through is traced and propagated the same way.
            passed = {
                "x-api-key": "sk-models",
                "anthropic-version": "2023-06-01",
                "traceparent": other_parent,
            }
            async with session.get(f"{proxy.url}/v1/models", headers=passed) as r:
                assert r.status == 200
        for trace_id in (chat_trace, responses_trace):
            assert f'# {{trace_id="{trace_id}"}}' in exposed
            assert trace_id not in plain

        def both(spans: list[ReceivedSpan]) -> bool:
            return all(
                server_spans(spans, t) and upstream_calls(spans, server_spans(spans, t)[0])
                for t in (chat_trace, responses_trace, other_trace)
            )

        spans = await receiver.wait_for(both)

    assert chat.usage is not None
    for trace_id, span_id, sent, route in (
        (chat_trace, chat_span, chat_parent, "/v1/chat/completions"),
        (responses_trace, responses_span, responses_parent, "/v1/responses"),
    ):
        (server,) = server_spans(spans, trace_id)
        assert server.parent_span_id == span_id
        a = server.attributes
        assert a["http.route"] == route and a["http.response.status_code"] == 200
        assert a["gen_ai.operation.name"] == "chat"
        assert a["gen_ai.provider.name"] == a["gen_ai.system"] == "openai"
        assert a["gen_ai.request.model"] == "gpt-test-1"
        assert a["gen_ai.response.model"]
        assert a["gen_ai.usage.input_tokens"] > 0 and a["gen_ai.usage.output_tokens"] > 0
        assert a["compaction.strategy"] == "none"
        assert not {"compaction.offloaded", "compaction.read_rounds"} & set(a)  # nothing done
        (call,) = upstream_calls(spans, server)
        assert call.attr("url.path") == route and call.attr("compaction.purpose") == "request"
        assert call.attr("gen_ai.provider.name") == "openai"
        recorded = [r for r in standin.recorded if r.path_qs.startswith(route)]
        assert contexts(recorded) == {traceparent_of(call)}
        assert sent[:52] not in contexts(standin.recorded)
    (other,) = server_spans(spans, other_trace)
    assert other.parent_span_id == other_span and other.name == "GET other"
    assert "gen_ai.operation.name" not in other.attributes
    (call,) = upstream_calls(spans, other)
    (models,) = [r for r in standin.recorded if r.path_qs == "/v1/models"]
    assert contexts([models]) == {traceparent_of(call)}
    (chat_server,) = server_spans(spans, chat_trace)
    assert chat_server.attr("gen_ai.usage.input_tokens") == chat.usage.prompt_tokens
    assert chat_server.attr("gen_ai.usage.output_tokens") == chat.usage.completion_tokens


# -- a summary made ahead: a trace of its own, linked to its request ---------------------


class Enough(Exception):
    """The agent has gone far enough."""


async def test_a_summary_made_ahead_is_linked_to_the_request_that_asked_for_it(
    tmp_path: Path,
    make_standin: MakeStandIn,
    receiver: Receiver,
    redis_url: str,
    redis_key_prefix: str,
) -> None:
    standin = await make_standin(StandInOptions(windows={"*": SMALL_WINDOW}, max_recorded=None))
    trace_id, _, traceparent = client_context()
    with serve(tmp_path, standin.url, redis_url, redis_key_prefix, **otel(receiver)) as proxy:
        client = anthropic.AsyncAnthropic(
            base_url=proxy.url,
            api_key="sk-ahead",
            max_retries=0,
            default_headers={"traceparent": traceparent},
        )
        async with client:

            async def enough_once_a_summary_is_asked(t: int, turn: Turn) -> None:
                if any(r.headers.get(PURPOSE) for r in standin.recorded):
                    raise Enough

            with pytest.raises(Enough):  # within 40 turns
                await run_agent(
                    client,
                    turns=40,
                    result_chars=3_000,
                    conversation=uuid.uuid4().hex,
                    on_turn=enough_once_a_summary_is_asked,
                )

        def ahead_done(spans: list[ReceivedSpan]) -> bool:
            """A summary made ahead, its call, and the request that asked for it."""
            asked = {s.span_id for s in server_spans(spans, trace_id)}
            return any(
                s.name == "compaction.summary_ahead"
                and upstream_calls(spans, s)
                and all(link[1] in asked for link in s.links)
                for s in spans
            )

        spans = await receiver.wait_for(ahead_done)

    servers = {s.span_id: s for s in server_spans(spans, trace_id)}
    ahead = [s for s in spans if s.name == "compaction.summary_ahead"]
    assert ahead
    for made in ahead:
        assert made.kind == INTERNAL and made.parent_span_id == ""  # a trace of its own
        assert made.trace_id != trace_id
        ((linked_trace, linked_span),) = made.links
        assert linked_trace == trace_id
        if upstream_calls(spans, made):  # (one that found another at work says "busy")
            assert made.attr("compaction.summary") == "made"
        asker = servers.get(linked_span)  # (a later one's may not be exported yet)
        if asker is not None:
            assert asker.name == "chat claude-test-1"
            assert made.attr("compaction.tenant") == asker.attr("compaction.tenant")
            assert made.attr("compaction.conversation") == asker.attr("compaction.conversation")
    assert any(made.links[0][1] in servers for made in ahead)
    calls = [c for made in ahead for c in upstream_calls(spans, made)]
    assert calls and {c.attr("compaction.purpose") for c in calls} == {"summary"}
    summaries = [r for r in standin.recorded if r.headers.get(PURPOSE)]
    arrived = contexts(summaries)
    for call in calls:
        assert traceparent_of(call) in arrived


# -- nothing of the prompt or a credential in any span ------------------------------------


async def test_no_prompt_text_tool_output_or_credential_in_any_span(
    tmp_path: Path,
    make_standin: MakeStandIn,
    receiver: Receiver,
    redis_url: str,
    redis_key_prefix: str,
) -> None:
    canaries = {
        "prompt": f"CANARY-PROMPT-{uuid.uuid4().hex}",
        "key": f"sk-CANARY-KEY-{uuid.uuid4().hex}",
        "bearer": f"CANARY-BEARER-{uuid.uuid4().hex}",
    }
    standin = await make_standin(StandInOptions(windows={"*": SMALL_WINDOW}, max_recorded=None))
    trace_id, _, traceparent = client_context()
    with serve(tmp_path, standin.url, redis_url, redis_key_prefix, **otel(receiver)) as proxy:
        client = anthropic.AsyncAnthropic(
            base_url=proxy.url,
            api_key=canaries["key"],
            max_retries=0,
            default_headers={
                "Authorization": f"Bearer {canaries['bearer']}",
                "traceparent": traceparent,
            },
        )
        history = long_history(turns=10, chars=6_000, chat_chars=600, marker=canaries["prompt"])
        async with (
            client,
            client.messages.stream(
                model="claude-test-1",
                max_tokens=64,
                messages=history,  # type: ignore[arg-type]
                extra_headers={"x-stand-in": orjson.dumps({"read_result": True}).decode()},
            ) as s,
        ):
            await s.get_final_message()
            assert s.response.headers["x-compaction-strategy"] == "offload+summary"
        spans = await receiver.wait_for(
            lambda spans: any(
                len(upstream_calls(spans, s)) >= 3 for s in server_spans(spans, trace_id)
            )
        )
    # The request went through every part that handles the canaries.
    assert any(canaries["prompt"].encode() in r.body for r in standin.recorded)
    assert any(b"characters 0 to" in r.body for r in standin.recorded)
    assert len(spans) >= 5
    everything = b"".join(receiver.bodies)
    for name, canary in canaries.items():
        assert canary.encode() not in everything, f"the {name} canary is in an exported span"
        for span in spans:
            assert canary not in repr(span), f"the {name} canary is in span {span.name}"


# -- shutdown flushes; off means off -----------------------------------------------------


async def test_the_last_spans_are_exported_on_shutdown(
    tmp_path: Path,
    make_standin: MakeStandIn,
    receiver: Receiver,
    redis_url: str,
    redis_key_prefix: str,
) -> None:
    standin = await make_standin(StandInOptions())
    trace_id, _, traceparent = client_context()
    # A schedule delay far longer than the test: only the shutdown's flush exports them.
    # Configured the other way: no OTEL_TRACES_EXPORTER, a traces endpoint of its own.
    env = {
        "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": f"{receiver.url}/v1/traces",
        "OTEL_BSP_SCHEDULE_DELAY": "600000",
    }
    with serve(tmp_path, standin.url, redis_url, redis_key_prefix, **env) as proxy:
        client = anthropic.AsyncAnthropic(
            base_url=proxy.url, api_key="sk-flush", max_retries=0,
            default_headers={"traceparent": traceparent},
        )  # fmt: skip
        async with client:
            await client.messages.create(
                model="claude-test-1",
                max_tokens=16,
                messages=[{"role": "user", "content": "Hello."}],
            )
        assert not server_spans(receiver.spans, trace_id)
        code = await proxy.stopped()
        assert code == 0, "".join(proxy.lines)
    spans = await receiver.wait_for(lambda spans: bool(server_spans(spans, trace_id)), 5.0)
    (server,) = server_spans(spans, trace_id)
    assert upstream_calls(spans, server)
    assert server.resource["service.name"] == "compaction-proxy"  # the default name


# -- the WebSocket transport: a SERVER span per response.create ---------------------------


async def test_every_websocket_frame_has_its_own_server_span(
    tmp_path: Path,
    make_responses_standin: Any,
    receiver: Receiver,
    redis_url: str,
    redis_key_prefix: str,
) -> None:
    from proxy.testing.api_responses import ResponsesOptions

    standin = await make_responses_standin(StandInOptions(), ResponsesOptions(websocket_status=101))
    trace_id, span_id, parent = client_context()
    headers = {
        "Authorization": "Bearer sk-openai",
        "OpenAI-Beta": "responses_websockets=2026-02-06",
        "traceparent": parent,
    }
    with serve(tmp_path, standin.url, redis_url, redis_key_prefix, **otel(receiver)) as proxy:
        async with (
            aiohttp.ClientSession() as session,
            session.ws_connect(f"{proxy.url}/v1/responses", headers=headers) as ws,
        ):
            previous = None
            for text in ("Say hello.", "Again."):
                frame: dict[str, Any] = {
                    "type": "response.create",
                    "model": "gpt-test-1",
                    "input": [{"role": "user", "content": text}],
                    "store": False,
                }
                if previous:
                    frame["previous_response_id"] = previous
                await ws.send_str(orjson.dumps(frame).decode())
                while True:
                    event = orjson.loads((await ws.receive(timeout=20)).data)
                    if event["type"] == "response.completed":
                        previous = event["response"]["id"]
                        break
                    assert event["type"] != "error", event
        spans = await receiver.wait_for(lambda s: len(server_spans(s, trace_id)) >= 3)

    # The upgrade is a request of its own (its span lasts the socket's life), and each
    # response.create its own span beside it.
    everything = server_spans(spans, trace_id)
    frames = [s for s in everything if s.attr("network.protocol.name") == "websocket"]
    (upgrade,) = [s for s in everything if s not in frames]
    assert upgrade.parent_span_id == span_id and upgrade.attr("http.request.method") == "GET"
    assert len(frames) == 2
    for server in frames:
        assert server.parent_span_id == span_id  # each a child of the upgrade's context
        a = server.attributes
        assert a["network.protocol.name"] == "websocket"
        assert a["http.route"] == "/v1/responses" and a["http.response.status_code"] == 200
        assert a["gen_ai.operation.name"] == "chat" and a["gen_ai.request.model"] == "gpt-test-1"
        assert a["gen_ai.usage.input_tokens"] > 0 and a["gen_ai.usage.output_tokens"] > 0
    assert len({s.span_id for s in frames}) == 2
