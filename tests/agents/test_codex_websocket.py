"""The real Codex CLI through the proxy over the Responses WebSocket (issue 26).

Codex's built-in provider prefers the WebSocket: it opens one socket, prewarms it, and
sends each turn as a `response.create` with previous_response_id and only its new items.
Against a stand-in that serves the WebSocket (and the ShellChunks scenario in a 40k
window, Codex not told the window), the proxy relays the socket and compacts on it: every
agent request reaches the upstream over the socket, no upgrade fails, every upstream frame
fits the window, and read_result, answered on the socket, never reaches Codex.
(Against an upstream with no WebSocket, Codex's fallback to HTTP after one attempt is
tests/agents/test_codex_standin.py's `test_through_the_proxy_codex_finishes_in_a_small_window`.)
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import orjson
import pytest

from proxy.core.tokens import default_counter
from proxy.server.metrics import METRICS
from proxy.testing.api_responses import ResponsesOptions
from proxy.testing.responses_items import ItemCounter
from proxy.testing.standin import RecordedRequest
from proxy.wire.responses_units import input_items
from tests.agents.test_codex_standin import (
    COMPACT_AT,
    LATE_POLICY,
    WINDOW,
    assert_task_done,
    codex_items,
    codex_task,
    gets,
    posts,
    proxy_in_front,
    responses_statuses,
    start_standin,
)
from tests.plugins.responses import MakeResponsesStandIn

pytestmark = pytest.mark.usefixtures("codex_bin")


def frames(standin: Any) -> list[RecordedRequest]:
    return [r for r in standin.recorded if r.transport == "websocket"]


def resolved(record: RecordedRequest) -> dict[str, Any]:
    return dict(orjson.loads(record.resolved))


def sessions(proxy: Any) -> dict[str, float]:
    out: dict[str, float] = {}
    for metric in proxy.app[METRICS].websocket_sessions.collect():
        for sample in metric.samples:
            if sample.name.endswith("_total"):
                out[sample.labels["outcome"]] = sample.value
    return out


async def test_codex_over_the_websocket_is_compacted_on_the_socket(
    make_responses_standin: MakeResponsesStandIn,
    tmp_path: Path,
    redis_url: str,
    redis_key_prefix: str,
) -> None:
    standin = await start_standin(
        make_responses_standin, True, script={"read_result": True}, websocket_status=101
    )
    proxy = await proxy_in_front(standin.url, redis_url, redis_key_prefix)
    try:
        run = await codex_task(tmp_path, proxy.url, "openai")
        statuses = responses_statuses(proxy)
        opened = sessions(proxy)
    finally:
        await proxy.stop()
    assert_task_done(run)
    # Every agent request went over the socket; only the proxy's summariser used HTTP.
    agent_posts = [
        p for p in posts(standin) if not p.record.headers.get("x-compaction-proxy-purpose")
    ]
    assert agent_posts == []
    upgrades = gets(standin)
    assert upgrades and all(u.status == 101 for u in upgrades)
    assert opened.get("relayed") == len(upgrades) and "refused" not in opened, opened
    assert "failed" not in opened and "426" not in statuses, (opened, statuses)
    sent = frames(standin)
    assert len(sent) > 16  # a prewarm, then every turn of the scenario
    assert sent[0].kind == "prewarm"
    # Every upstream frame fit the window and was answered.
    counter = ItemCounter(default_counter(), ResponsesOptions().seal_key)
    for n, record in enumerate(sent):
        assert record.status == 200 and record.outcome == "complete", (n, record.error)
        assert counter.count_request(resolved(record)) <= WINDOW, n
    # The proxy compacted on the socket and answered read_result there ...
    texts = [orjson.dumps(input_items(resolved(r))).decode() for r in sent]
    assert any("compaction-proxy offloaded this result" in t for t in texts)
    assert any('"name":"read_result"' in t for t in texts)
    # ... sending only the new items where the upstream keeps the rest: the turns before
    # the first offload, and every read_result round (its one output after the call); a
    # turn that stubs one more result rewrites the prefix, and goes whole.
    incremental = [orjson.loads(r.body) for r in sent[1:] if b'"previous_response_id"' in r.body]
    reads = [f for f in incremental if [i["type"] for i in f["input"]] == ["function_call_output"]]
    assert len(incremental) > len(sent) // 2 and len(reads) >= len(incremental) - 2
    # Codex never saw read_result.
    kept = codex_items(tmp_path / "codex-home")
    assert kept and not any(i.get("name") == "read_result" for i in kept)
    assert "read_result" not in orjson.dumps(run.events).decode()
    assert "499" not in statuses, statuses


@pytest.mark.parametrize("upstream", ["openai", "other"])
async def test_codex_compaction_over_the_websocket(
    make_responses_standin: MakeResponsesStandIn,
    tmp_path: Path,
    redis_url: str,
    redis_key_prefix: str,
    upstream: str,
) -> None:
    """Codex, told the window, compacts by itself on the socket: its compaction_trigger
    frame passes through to an upstream that serves it (OpenAI), or is served by the proxy
    for one that refuses it (`codex_compaction = "auto"`), and Codex goes on over the socket
    from the compaction item it got."""
    standin = await start_standin(
        make_responses_standin, upstream == "openai", websocket_status=101
    )
    proxy = await proxy_in_front(standin.url, redis_url, redis_key_prefix, LATE_POLICY)
    try:
        run = await codex_task(
            tmp_path, proxy.url, "openai", context_window=WINDOW, auto_compact_limit=COMPACT_AT
        )
        statuses = responses_statuses(proxy)
    finally:
        await proxy.stop()
    assert_task_done(run)
    assert "426" not in statuses and not [
        p for p in posts(standin) if not p.record.headers.get("x-compaction-proxy-purpose")
    ]
    sent = frames(standin)
    counter = ItemCounter(default_counter(), ResponsesOptions().seal_key)
    assert all(counter.count_request(resolved(r)) <= WINDOW for r in sent)
    triggers = [r for r in sent if b'"compaction_trigger"' in r.resolved]
    kept = codex_items(tmp_path / "codex-home")
    compactions = [i for i in kept if i.get("type") == "compaction"]
    assert compactions, "Codex never compacted"
    if upstream == "openai":
        assert triggers and all(r.status == 200 for r in triggers)
        assert all(not i["encrypted_content"].startswith("cpx1.") for i in compactions)
    else:
        assert len(triggers) == 1 and triggers[0].status == 400  # refused once, then served
        assert all(i["encrypted_content"].startswith("cpx1.") for i in compactions)
        later = [orjson.dumps(input_items(resolved(r))).decode() for r in sent]
        assert any("[compaction-proxy: summary of the conversation" in t for t in later)
        assert not any("cpx1." in t for t in later)  # never forwarded
