"""OpenTelemetry traces (issue 24), set-up and edges: which OTEL_* environment turns
them on; off means nothing of the SDK imported, no middleware, and the client's trace
headers passed through as they came; asked for with the SDK gone from the install,
start-up says what to do; the span API a transport of its own uses (one SERVER span per
WebSocket frame); the Grafana dashboard's exemplar link. The serve-process tests are in
test_traces.py."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import aiohttp
import anthropic
import orjson
import pytest

from proxy.testing.standin import StandInOptions
from proxy.tracing import wanted
from tests.server.conftest import MakeProxy
from tests.server.otlp_receiver import Receiver, client_context, receiver, server_spans
from tests.server.test_traces import MakeStandIn

__all__ = ["receiver"]  # the fixture


@pytest.mark.parametrize(
    ("environ", "on"),
    [
        ({}, False),
        ({"OTEL_SERVICE_NAME": "x", "OTEL_BSP_SCHEDULE_DELAY": "5"}, False),
        ({"OTEL_TRACES_EXPORTER": "otlp"}, True),
        ({"OTEL_TRACES_EXPORTER": "none", "OTEL_EXPORTER_OTLP_ENDPOINT": "http://h:4318"}, False),
        ({"OTEL_EXPORTER_OTLP_ENDPOINT": "http://h:4318"}, True),
        ({"OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": "http://h:4318/v1/traces"}, True),
        ({"OTEL_TRACES_EXPORTER": "otlp", "OTEL_SDK_DISABLED": "true"}, False),
        ({"OTEL_TRACES_EXPORTER": "console"}, True),
    ],
)
def test_which_environment_turns_traces_on(environ: dict[str, str], on: bool) -> None:
    assert wanted(environ) is on


OFF_PROBE = """
import sys
import redis.asyncio, redis.asyncio.cluster  # redis-py imports parts of the API itself
before = {m for m in sys.modules if m.startswith("opentelemetry")}
from proxy import tracing
from proxy.config import load_settings
from proxy.server.app import create_app
app = create_app(load_settings(None, environ={}, overrides={"server.port": 0}))
added = {m for m in sys.modules if m.startswith("opentelemetry")} - before
print(sorted(added), tracing.ACTIVE, len(app.middlewares))
"""


def test_with_tracing_off_nothing_of_opentelemetry_is_imported() -> None:
    """No SDK, no exporter, no tracer, no middleware: the proxy adds nothing to what
    redis-py itself imports (parts of the API, for its own optional metrics)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("OTEL_")}
    out = subprocess.run(
        [sys.executable, "-c", OFF_PROBE], env=env, capture_output=True, text=True, check=True
    )
    added, active, middlewares = out.stdout.split()
    assert (added, active) == ("[]", "None"), out.stderr
    on = subprocess.run(
        [sys.executable, "-c", OFF_PROBE],
        env={**env, "OTEL_TRACES_EXPORTER": "console"},
        capture_output=True,
        text=True,
        check=True,
    )
    # The probe itself tells: with traces asked for, the SDK and one more middleware.
    assert "opentelemetry.sdk.trace" in on.stdout
    assert int(on.stdout.split()[-1]) == int(middlewares) + 1


async def test_with_tracing_off_the_clients_traceparent_passes_through_unchanged(
    make_standin: MakeStandIn, make_compacting_proxy: MakeProxy
) -> None:
    standin = await make_standin(StandInOptions())
    proxy = await make_compacting_proxy(standin.url)
    _, _, traceparent = client_context()
    client = anthropic.AsyncAnthropic(
        base_url=proxy.url,
        api_key="sk-off",
        max_retries=0,
        default_headers={"traceparent": traceparent, "tracestate": "a=b"},
    )
    async with client:
        await client.messages.create(
            model="claude-test-1", max_tokens=16, messages=[{"role": "user", "content": "Hi."}]
        )
    (recorded,) = standin.recorded
    assert recorded.headers.get("traceparent") == traceparent
    assert recorded.headers.get("tracestate") == "a=b"


def test_asking_for_traces_without_the_sdk_stops_start_up(tmp_path: Path) -> None:
    """With OpenTelemetry's SDK unimportable (removed from the install),
    OTEL_TRACES_EXPORTER=otlp is a start-up error that says what to do (not a silent
    proxy without traces)."""
    from tests.server.cli_process import HIDE_EXTRAS

    env = {k: v for k, v in os.environ.items() if not k.startswith(("OTEL_", "COMPACTION_"))}
    env.update(
        OTEL_TRACES_EXPORTER="otlp",
        COMPACTION_PROXY_SERVER_PORT="0",
        COMPACTION_PROXY_STORE_STATE_DIR=str(tmp_path / "state"),
        HOME=str(tmp_path),
    )
    out = subprocess.run(
        [sys.executable, "-c", HIDE_EXTRAS, "opentelemetry.sdk,opentelemetry.exporter", "serve"],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert out.returncode != 0
    assert "reinstall compaction-proxy" in out.stderr, out.stderr


# -- the API a transport of its own uses (a WebSocket frame) -----------------------------


async def test_each_websocket_frame_can_have_its_own_server_span(
    receiver: Receiver, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`request_span` around each frame of one socket: a SERVER span per frame, each
    continuing the upgrade request's trace and described from the frame's own record."""
    from aiohttp import web

    from proxy import tracing
    from proxy.server.record import RequestRecord
    from proxy.server.traces import flush, request_span

    monkeypatch.setenv("OTEL_EXPORTER_OTLP_ENDPOINT", receiver.url)
    monkeypatch.setenv("OTEL_BSP_SCHEDULE_DELAY", "50")
    active = tracing.from_environment({"OTEL_TRACES_EXPORTER": "otlp"})
    assert active is not None
    trace_id, span_id, traceparent = client_context()

    async def socket(request: web.Request) -> web.WebSocketResponse:
        ws = web.WebSocketResponse()
        await ws.prepare(request)
        async for message in ws:
            frame = orjson.loads(message.data)
            record = RequestRecord(f"frame-{frame['n']}", "/v1/responses", "GET")
            record.model = frame["model"]
            with request_span(request, record, transport="websocket") as outcome:
                await ws.send_str('{"type": "response.completed"}')
                outcome.status = 200
        return ws

    app = web.Application()
    app.router.add_get("/v1/responses", socket)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = runner.addresses[0][1]
    tracing.install(active)
    try:
        async with (
            aiohttp.ClientSession() as session,
            session.ws_connect(
                f"http://127.0.0.1:{port}/v1/responses", headers={"traceparent": traceparent}
            ) as ws,
        ):
            for n in range(2):
                await ws.send_str(orjson.dumps({"n": n, "model": "gpt-test-1"}).decode())
                await ws.receive()
    finally:
        tracing.install(None)
        await flush(active, 5.0)
        await runner.cleanup()
    spans = await receiver.wait_for(lambda spans: len(server_spans(spans, trace_id)) == 2)
    frames = server_spans(spans, trace_id)
    assert {s.parent_span_id for s in frames} == {span_id}
    assert len({s.span_id for s in frames}) == 2
    assert sorted(s.attr("compaction.request_id") for s in frames) == ["frame-0", "frame-1"]
    for frame in frames:
        assert frame.name == "chat gpt-test-1"
        assert frame.attr("network.protocol.name") == "websocket"
        assert frame.attr("gen_ai.provider.name") == "openai"
        assert frame.attr("http.response.status_code") == 200


def test_the_dashboard_links_latency_to_traces_through_the_exemplar_label() -> None:
    """The latency panels ask for exemplars of the histograms that carry them, and the
    provisioned Prometheus data source links the label the proxy uses to a trace store
    that is provisioned too."""
    import yaml

    from proxy.server.metrics import EXEMPLAR_LABEL

    root = Path(__file__).resolve().parents[2] / "deploy" / "grafana"
    dashboard = orjson.loads((root / "compaction-proxy.json").read_bytes())
    histograms = ("request_duration", "upstream_latency", "proxy_overhead")
    targets = [
        t
        for p in dashboard["panels"]
        for t in p.get("targets", [])
        if any(f"compaction_proxy_{h}_seconds_bucket" in t["expr"] for h in histograms)
    ]
    assert len(targets) == 9 and all(t.get("exemplar") is True for t in targets)
    sources = yaml.safe_load((root / "datasources.yaml").read_text())["datasources"]
    uids = {s["uid"]: s for s in sources}
    (prometheus,) = [s for s in sources if s["type"] == "prometheus"]
    (link,) = prometheus["jsonData"]["exemplarTraceIdDestinations"]
    assert link["name"] == EXEMPLAR_LABEL
    assert uids[link["datasourceUid"]]["type"] in ("jaeger", "tempo")


@pytest.mark.parametrize(
    ("environ", "says"),
    [
        ({"OTEL_EXPORTER_OTLP_PROTOCOL": "http/json"}, "http/json is not supported"),
        ({"OTEL_TRACES_EXPORTER": "zipkin"}, "OTEL_TRACES_EXPORTER=zipkin is not supported"),
    ],
)
def test_what_the_proxy_cannot_export_with_is_said(environ: dict[str, str], says: str) -> None:
    from proxy.tracing import TracingUnavailable, from_environment

    environ = {"OTEL_EXPORTER_OTLP_ENDPOINT": "http://127.0.0.1:4318", **environ}
    with pytest.raises(TracingUnavailable, match=says):
        from_environment(environ)


def test_grpc_needs_its_exporter() -> None:
    """grpc works when its exporter is installed; else start-up says what to install."""
    import importlib.util

    from proxy.tracing import TracingUnavailable, from_environment

    environ = {
        "OTEL_EXPORTER_OTLP_ENDPOINT": "http://127.0.0.1:4317",
        "OTEL_EXPORTER_OTLP_TRACES_PROTOCOL": "grpc",
    }
    if importlib.util.find_spec("opentelemetry.exporter.otlp.proto.grpc") is None:
        with pytest.raises(TracingUnavailable, match="opentelemetry-exporter-otlp-proto-grpc"):
            from_environment(environ)
    else:
        made = from_environment(environ)
        assert made is not None
        made.shutdown(100)
