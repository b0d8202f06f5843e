"""No prompt text or credential leaves the proxy through its logs, metrics or key names,
and the admin API shows a key's secret only in the answer that creates it.

Unique canary strings go into the prompt, the tool results, `x-api-key` and
`Authorization`; the request is big enough to be offloaded and summarised, and the
stand-in reads an offloaded result back (a read_result round). Then every log line of
the process (the proxy's own loggers at DEBUG, everything else at the default INFO, in
both formats), /metrics and every Redis key name under the test's prefix are searched.
"""

from __future__ import annotations

import logging
import uuid
from collections.abc import Iterator
from typing import Any

import aiohttp
import anthropic
import orjson
import pytest
import redis

from proxy.server.logs import JSONFormatter
from proxy.store.keys import scan_pattern
from proxy.testing.agent import run_agent
from proxy.testing.standin import StandInOptions
from tests.server.conftest import UPSTREAM_KEY_ENV, AdminAPI, MakeProxy
from tests.server.test_metrics import MakeStandIn, long_history


class Everything(logging.Handler):
    """Every record, rendered by both of the proxy's formats."""

    def __init__(self) -> None:
        super().__init__(logging.DEBUG)
        self.lines: list[str] = []
        self.human = logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s")
        self.json = JSONFormatter()

    def emit(self, record: logging.LogRecord) -> None:
        self.lines.append(self.human.format(record))
        self.lines.append(self.json.format(record))
        if record.exc_info:
            self.lines.append(self.human.formatException(record.exc_info))


@pytest.fixture
def all_logs() -> Iterator[Everything]:
    handler = Everything()
    root = logging.getLogger()
    ours = [logging.getLogger(n) for n in ("proxy", "compaction_proxy", "aiohttp", "redis")]
    saved = root.level, [lg.level for lg in ours]
    root.addHandler(handler)
    root.setLevel(logging.INFO)
    for lg in ours:
        lg.setLevel(logging.DEBUG)
    try:
        yield handler
    finally:
        root.removeHandler(handler)
        root.setLevel(saved[0])
        for lg, level in zip(ours, saved[1], strict=True):
            lg.setLevel(level)


@pytest.mark.parametrize("stream", [False, True], ids=["whole", "stream"])
async def test_canaries_appear_in_no_log_metric_or_key_name(
    make_standin: MakeStandIn,
    make_compacting_proxy: MakeProxy,
    redis_url: str,
    redis_key_prefix: str,
    all_logs: Everything,
    stream: bool,
) -> None:
    canaries = {
        "prompt": f"CANARY-PROMPT-{uuid.uuid4().hex}",
        "key": f"sk-CANARY-KEY-{uuid.uuid4().hex}",
        "bearer": f"CANARY-BEARER-{uuid.uuid4().hex}",
    }
    standin = await make_standin(StandInOptions(windows={"*": 30_000}, max_recorded=None))
    proxy = await make_compacting_proxy(standin.url)
    client = anthropic.AsyncAnthropic(
        base_url=proxy.url,
        api_key=canaries["key"],
        default_headers={"Authorization": f"Bearer {canaries['bearer']}"},
        max_retries=0,
    )
    request = {
        "model": "claude-test-1",
        "max_tokens": 64,
        "messages": long_history(turns=10, chars=6_000, chat_chars=600, marker=canaries["prompt"]),
        "extra_headers": {"x-stand-in": orjson.dumps({"read_result": True}).decode()},
    }
    if stream:
        async with client.messages.stream(**request) as s:  # type: ignore[arg-type]
            await s.get_final_message()
            headers = s.response.headers
    else:
        raw = await client.messages.with_raw_response.create(**request)  # type: ignore[arg-type]
        headers = raw.headers

    # The request really went through every part that handles the canaries.
    assert headers["x-compaction-strategy"] == "offload+summary"
    assert headers["x-compaction-summary"] == "made"
    bodies = [r.body for r in standin.recorded]
    assert any(b"characters 0 to" in b for b in bodies), "a read_result round was answered"
    assert any(canaries["prompt"].encode() in b for b in bodies)
    assert any("x-compaction-proxy-purpose" in r.headers for r in standin.recorded)

    async with aiohttp.ClientSession() as session, session.get(f"{proxy.url}/metrics") as r:
        metrics = await r.text()
    client_redis = redis.Redis.from_url(redis_url)
    try:
        keys = [k.decode() for k in client_redis.scan_iter(match=scan_pattern(redis_key_prefix))]
    finally:
        client_redis.close()

    request_lines = [line for line in all_logs.lines if "compaction_proxy.requests" in line]
    assert len(request_lines) >= 2 and keys and "compaction_proxy_requests_total" in metrics
    for name, canary in canaries.items():
        for line in all_logs.lines:
            assert canary not in line, f"the {name} canary is in a log line"
        assert canary not in metrics, f"the {name} canary is in /metrics"
        for key in keys:
            assert canary not in key, f"the {name} canary is in a Redis key name"


async def test_a_redis_password_is_not_logged(
    make_standin: MakeStandIn, make_proxy: Any, all_logs: Everything, unused_tcp_port: int
) -> None:
    secret = f"CANARY-REDIS-{uuid.uuid4().hex}"
    standin = await make_standin(StandInOptions())
    url = f"redis://user:{secret}@127.0.0.1:{unused_tcp_port}/0"  # nothing listens there
    proxy = await make_proxy(standin.url, **{"store.redis_url": url})
    async with aiohttp.ClientSession() as session, session.get(f"{proxy.url}/readyz") as r:
        assert r.status == 503
    assert any("does not answer" in line and "user:***@" in line for line in all_logs.lines)
    assert not any(secret in line for line in all_logs.lines)


def _every_value(url: str, prefix: str) -> list[bytes]:
    """Every key name under `prefix` and everything stored under it."""
    client_redis = redis.Redis.from_url(url)
    out: list[bytes] = []
    try:
        for key in client_redis.scan_iter(match=scan_pattern(prefix)):
            out.append(key)
            kind = client_redis.type(key)
            if kind == b"string":
                out.append(client_redis.get(key) or b"")
            elif kind == b"hash":
                out.extend(b for pair in client_redis.hgetall(key).items() for b in pair)
            elif kind == b"list":
                out.extend(client_redis.lrange(key, 0, -1))
            elif kind == b"set":
                out.extend(client_redis.smembers(key))
            elif kind == b"zset":
                out.extend(client_redis.zrange(key, 0, -1))
    finally:
        client_redis.close()
    return out


async def test_admin_endpoints_keep_key_secrets_and_the_admin_key_to_themselves(
    make_standin: MakeStandIn,
    make_admin_proxy: MakeProxy,
    admin_key: str,
    redis_url: str,
    redis_key_prefix: str,
    all_logs: Everything,
) -> None:
    standin = await make_standin(StandInOptions(windows={"*": 30_000}, max_recorded=None))
    proxy = await make_admin_proxy(standin.url)
    api = AdminAPI(proxy.url, admin_key)
    created = await api.ok(
        "POST", "/admin/keys", {"team": "canary", "upstream_env": UPSTREAM_KEY_ENV}
    )
    secret = created["key"]
    hidden = secret.removeprefix(f"cpk_{created['id']}_")  # the part that is not the id
    # The key at work: offloads, a summary and read_result rounds.
    client = anthropic.AsyncAnthropic(base_url=proxy.url, api_key=secret, max_retries=0)
    async with client:
        turns = await run_agent(
            client, turns=24, result_chars=8_000, read_every=4, conversation="canary-admin"
        )
    assert any(t.headers.get("x-compaction-summary") in ("made", "ahead", "waited") for t in turns)
    assert any(int(t.headers.get("x-compaction-read-rounds", 0)) for t in turns)
    # Every admin endpoint, and the mistakes an attacker would try.
    answers = [
        await api.ok("GET", "/admin/keys"),
        await api.ok("GET", "/admin/budgets"),
        await api.ok(
            "PUT", f"/admin/budgets/key/{created['id']}", {"limits": {"day": {"input": 10**7}}}
        ),
        await api.ok("GET", "/admin/budgets/team/canary"),
        await api.ok("GET", "/admin/stats"),
    ]
    for headers in ({"Authorization": f"Bearer {secret}"}, {"x-api-key": admin_key}):
        status, refused = await api.call("GET", "/admin/stats", headers=headers)
        assert status == 401
        answers.append(refused)
    answers.append(await api.ok("DELETE", f"/admin/keys/{created['id']}"))
    async with aiohttp.ClientSession() as session:
        async with session.get(f"{proxy.url}/dashboard#admin_key={admin_key}") as r:
            answers.append(await r.text())
        async with session.get(f"{proxy.url}/metrics") as r:
            metrics = await r.text()
    await api.ok("GET", "/admin/stats")  # flushes this replica's stats to Redis
    stored = _every_value(redis_url, redis_key_prefix)

    assert any(b"g:stats:" in value for value in stored), "the stats reached Redis"
    assert "compaction_proxy_budget_rejections_total" in metrics
    text = orjson.dumps(answers).decode()
    for name, canary in {"key secret": hidden, "admin key": admin_key}.items():
        assert canary not in text, f"the {name} is in an admin answer"
        for line in all_logs.lines:
            assert canary not in line, f"the {name} is in a log line"
        assert canary not in metrics, f"the {name} is in /metrics"
        for value in stored:
            assert canary.encode() not in value, f"the {name} is in Redis"
