"""A whole answer goes to the client as soon as the proxy has it, before its bookkeeping
of the request (the usage read from it, the calibration sample, the record, the metrics,
the log line): that work is off the answer's path (proxy/server/relay.py)."""

from __future__ import annotations

import asyncio
import http.client
import time
from typing import Any
from urllib.parse import urlsplit

import orjson
import pytest

from proxy.server.metrics import METRICS, Metrics
from proxy.testing.standin import StandInOptions
from tests.server.conftest import MakeProxy

HELD = 0.8  # seconds the bookkeeping holds the proxy's loop


async def test_a_whole_answer_reaches_the_client_before_the_bookkeeping(
    make_standin: Any, make_proxy: MakeProxy, monkeypatch: pytest.MonkeyPatch
) -> None:
    standin = await make_standin(StandInOptions())
    proxy = await make_proxy(standin.url)
    record = Metrics.record

    def slow(self: Metrics, rec: Any, status: int, ended: float) -> None:
        if rec.route == "/v1/messages":
            time.sleep(HELD)  # holds the proxy's loop: nothing after it is sent meanwhile
        record(self, rec, status, ended)

    monkeypatch.setattr(Metrics, "record", slow)
    body = orjson.dumps(
        {
            "model": "claude-haiku-4-5",
            "max_tokens": 16,
            "messages": [{"role": "user", "content": "Say hello."}],
        }
    )
    target = urlsplit(proxy.url)
    headers = {"content-type": "application/json", "x-api-key": "sk-first"}
    headers["anthropic-version"] = "2023-06-01"

    def post() -> tuple[int, bytes, float]:
        # In a thread of its own: the proxy's loop (this one) is held by the bookkeeping.
        connection = http.client.HTTPConnection(target.hostname, target.port, timeout=30)
        try:
            began = time.perf_counter()
            connection.request("POST", "/v1/messages", body, headers)
            response = connection.getresponse()
            answer = response.read()
            return response.status, answer, time.perf_counter() - began
        finally:
            connection.close()

    status, answer, took = await asyncio.to_thread(post)
    assert status == 200
    assert orjson.loads(answer)["usage"]["output_tokens"] > 0
    assert took < HELD / 2, f"the answer waited for the bookkeeping ({took:.2f} s)"
    await asyncio.sleep(HELD)
    samples = {
        (s.name, s.labels.get("status")): s.value
        for family in proxy.app[METRICS].registry.collect()
        for s in family.samples
        if s.labels.get("route") == "/v1/messages"
    }
    assert samples[("compaction_proxy_requests_total", "200")] == 1  # counted all the same
