"""The gate cannot be stepped around (issue 21), through a real `serve` with proxy keys
required, an admin key and budgets, in front of a recording stand-in, on the session's
Redis:

- one canonical request target: percent-encoded slashes, dot segments, empty segments
  and targets that do not normalise to themselves get 400 before the key check, and
  nothing reaches the upstream; the pass-through forwards only /v1/ paths (finding 1);
- the gate first: a key over its budget gets its 429 before any summary is made for it,
  and what the proxy spends on its behalf is reserved and charged to it (finding 2);
- a charge is never refused, even for a key above its limit (finding 3, with an outage's
  settlement);
- the proxy's own headers sent by a client never reach the upstream (finding 8).
"""

from __future__ import annotations

import asyncio
import os
import signal
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import orjson
import pytest

from proxy.store import EmbeddedRedis
from proxy.store.accounts import Accounts, Scope
from proxy.testing.standin import RecordedRequest, StandInOptions
from tests.fleet.test_fleet import (
    ENV,
    PURPOSE,
    REQUEST,
    Fleet,
    Replica,
    new_key,
    quiet_usage,
    settled_usage,
    start_replicas,
    text_history,
    usage,
    with_accounts,
)
from tests.fleet.upstreams import ThreadedApp, api_app, running
from tests.plugins.redis import delete_keys
from tests.plugins.standin import RunningStandIn
from tests.server.rawhttp import RawResponse, send

ADMIN_ENV, ADMIN_SECRET = "CP_GATE_ADMIN_KEY", "admin-secret-for-the-gate-tests"
OPENAI_ENV = "CP_GATE_OPENAI_KEY"
VERSION = ("anthropic-version", "2023-06-01")


@dataclass
class Gate:
    replica: Replica
    upstream: ThreadedApp
    fleet: Fleet

    @property
    def url(self) -> str:
        return self.replica.url

    def seen(self) -> list[RecordedRequest]:
        return list(self.upstream.recorded)


@pytest.fixture(scope="module")
def gate(tmp_path_factory: pytest.TempPathFactory, redis_url: str) -> Iterator[Gate]:
    prefix = f"cpgate:{uuid.uuid4().hex[:10]}:"
    auth = f'[auth]\nkeys = "required"\ncache_seconds = 0.5\nadmin_key_env = "{ADMIN_ENV}"\n'
    with running(api_app) as upstream:
        (replica,) = start_replicas(
            tmp_path_factory.mktemp("gate"),
            1,
            upstream.url,
            redis_url,
            prefix,
            f'[upstream]\nopenai_url = "{upstream.url}"\n[budgets]\non_store_down = "closed"\n',
            env={ADMIN_ENV: ADMIN_SECRET, OPENAI_ENV: "sk-oai-gate"},
            auth=auth,
        )
        fleet = Fleet([replica], None, redis_url, prefix)  # type: ignore[arg-type]
        try:
            yield Gate(replica, upstream, fleet)
        finally:
            replica.stop()
            delete_keys(redis_url, prefix)


def _error(response: RawResponse) -> tuple[str, str]:
    """(the API's shape, the error type) of one of the proxy's own error answers."""
    body = orjson.loads(response.body)
    if body.get("type") == "error":
        return "anthropic", str(body["error"]["type"])
    assert set(body["error"]) == {"message", "type", "param", "code"}, body
    return "openai", str(body["error"]["type"])


MESSAGE = orjson.dumps(
    {"model": "claude-haiku-4-5", "max_tokens": 16, "messages": [{"role": "user", "content": "hi"}]}
)
CHAT = orjson.dumps(
    {"model": "gpt-4o-mini", "max_tokens": 16, "messages": [{"role": "user", "content": "hi"}]}
)

# (method, raw target, headers, body, the API whose shape the 400 is in)
STEPPED_AROUND: list[tuple[str, str, list[tuple[str, str]], bytes, str]] = [
    # The three, with the caller's own upstream credential and no proxy key.
    ("POST", "/dashboard%2F..%2Fv1%2Fmessages", [("x-api-key", "sk-own"), VERSION], MESSAGE,
     "anthropic"),
    ("GET", "/dashboard%2f..%2fv1%2fmodels", [("x-api-key", "sk-own"), VERSION], b"", "anthropic"),
    ("POST", "/dashboard%2F..%2Fv1%2Fchat%2Fcompletions", [("authorization", "Bearer sk-own")],
     CHAT, "openai"),
    # Other spellings of the same walk.
    ("POST", "/dashboard/..%2Fv1/messages", [("x-api-key", "sk-own"), VERSION], MESSAGE,
     "anthropic"),
    ("POST", "/admin/../v1/messages", [("x-api-key", "sk-own"), VERSION], MESSAGE, "anthropic"),
    ("POST", "/dashboard/./../v1/messages", [("x-api-key", "sk-own"), VERSION], MESSAGE,
     "anthropic"),
    ("POST", "/dashboard%5C..%5Cv1%5Cmessages", [("x-api-key", "sk-own"), VERSION], MESSAGE,
     "anthropic"),
    ("POST", "/dashboard\\..\\v1\\messages", [("x-api-key", "sk-own"), VERSION], MESSAGE,
     "anthropic"),
    ("GET", "/v1/messages/../models", [("x-api-key", "sk-own"), VERSION], b"", "anthropic"),
    ("POST", "/v1//messages", [("x-api-key", "sk-own"), VERSION], MESSAGE, "anthropic"),
    ("POST", "/v1/%6Dessages", [("x-api-key", "sk-own"), VERSION], MESSAGE, "anthropic"),
    ("POST", "/v1/messages%2e", [("x-api-key", "sk-own"), VERSION], MESSAGE, "anthropic"),
    ("GET", "/v1/files/%252e%252e", [("x-api-key", "sk-own"), VERSION], b"", "anthropic"),
    ("POST", "/dashboard%2F..%2Fv1%2Fmessages?beta=true", [("x-api-key", "sk-own"), VERSION],
     MESSAGE, "anthropic"),
]  # fmt: skip


def test_a_target_that_is_not_canonical_is_refused_before_anything_reads_it(gate: Gate) -> None:
    """`POST /dashboard%2F..%2Fv1%2Fmessages` with no proxy key answered 200 and the
    upstream got the raw path: the admin guard read the decoded path, the router the raw
    one (finding 1). Now every such target is a 400 in its API's shape, before the key
    check, and nothing is sent upstream."""
    before = len(gate.seen())
    for method, target, headers, body, shape in STEPPED_AROUND:
        response = asyncio.run(send(gate.url, method, target, headers, body))
        assert response.status == 400, (target, response.status, response.body[:300])
        assert _error(response) == (shape, "invalid_request_error"), target
    assert gate.seen()[before:] == []


def test_the_pass_through_forwards_only_api_paths(gate: Gate) -> None:
    """A proxy key reaches only the APIs' own paths through the pass-through; any other
    path is a 404 of the proxy's, not a request to the upstream."""

    async def work(accounts: Accounts) -> str:
        text, _ = await accounts.create_key(team="paths", upstream_env=ENV, scopes=("all",))
        return text

    key: str = asyncio.run(with_accounts(gate.fleet, work))
    headers = [("x-api-key", key), VERSION]
    before = len(gate.seen())
    for target in ("/not-an-api", "/v2/messages", "/dashboardx/v1/messages", "/v2beta/models"):
        response = asyncio.run(send(gate.url, "GET", target, headers))
        assert response.status == 404, (target, response.status, response.body[:300])
        assert _error(response) == ("anthropic", "not_found_error")
    # /v1beta is the Gemini API's (issue 33): an Anthropic key may not reach it.
    response = asyncio.run(send(gate.url, "GET", "/v1beta/models", headers))
    assert response.status == 403, response.body[:300]
    assert orjson.loads(response.body)["error"]["status"] == "PERMISSION_DENIED"
    assert gate.seen()[before:] == []
    # A canonical API path still goes through, percent-encoding of reserved characters
    # and query strings untouched.
    response = asyncio.run(send(gate.url, "GET", "/v1/models?after_id=a%2Fb", headers))
    assert response.status == 200, response.body[:300]
    assert gate.seen()[-1].path_qs == "/v1/models?after_id=a%2Fb"


def _post(gate: Gate, key: str, body: dict[str, Any], **headers: str) -> RawResponse:
    sent = [("x-api-key", key), VERSION, ("content-type", "application/json")]
    sent += list(headers.items())
    return asyncio.run(send(gate.url, "POST", "/v1/messages", sent, orjson.dumps(body)))


def _summaries(records: list[RecordedRequest]) -> list[RecordedRequest]:
    return [r for r in records if r.headers.get(PURPOSE) == "summary"]


def test_a_key_over_its_budget_makes_the_upstream_pay_for_nothing(gate: Gate) -> None:
    """A key with an output budget of 30 sent 4 new long conversations: all got 429 and
    the upstream received 4 summary calls made for them (finding 2): compaction ran
    before the budget check."""
    key, key_id = new_key(gate.fleet, "over", **{"day:output": 30})
    before = len(gate.seen())
    for n in range(4):
        body = {**REQUEST, "messages": text_history(24)}  # over the trigger: a fold
        answer = _post(gate, key, body, **{"x-conversation-id": f"over-{n}-{uuid.uuid4().hex}"})
        assert answer.status == 429, answer.body[:300]
    time.sleep(0.5)  # a summary made ahead would have been sent by now
    assert gate.seen()[before:] == []
    assert quiet_usage(gate.fleet, Scope("key", key_id)) == {"input": 0, "output": 0, "weighted": 0}


def test_summaries_made_for_a_key_are_reserved_and_charged_to_it(gate: Gate) -> None:
    """With room in its budget, the summary a key's request needs is made and what the
    upstream reports for it is on the key's counters, with the request's own usage."""
    key, key_id = new_key(gate.fleet, "room", **{"day:output": 10**6, "day:input": 10**7})
    before = len(gate.seen())
    body = {**REQUEST, "messages": text_history(24)}
    answer = _post(gate, key, body, **{"x-conversation-id": f"room-{uuid.uuid4().hex}"})
    assert answer.status == 200, answer.body[:300]
    assert "summary" in (answer.header("x-compaction-strategy") or "")
    assert _summaries(gate.seen()[before:]), "a summary was made for the fold"

    def upstream_output() -> int:  # the answer's and every summary's (one made ahead too)
        return sum(int(r.usage.get("output_tokens", 0)) for r in gate.seen()[before:])

    scope = Scope("key", key_id)
    assert settled_usage(gate.fleet, scope, lambda d: d["output"] == upstream_output())
    assert quiet_usage(gate.fleet, scope)["output"] == upstream_output()


def test_the_proxy_headers_a_client_sends_never_reach_the_upstream(gate: Gate) -> None:
    """A client could send `x-compaction-proxy-purpose: summary` itself and it reached the
    upstream unchanged (finding 8)."""
    key, _ = new_key(gate.fleet, "headers", **{"day:output": 10**6})
    before = len(gate.seen())
    answer = _post(
        gate,
        key,
        {**REQUEST, "max_tokens": 8},
        **{"x-compaction-proxy-purpose": "summary", "X-Compaction-Proxy-Other": "1"},
    )
    assert answer.status == 200, answer.body[:300]
    (seen,) = gate.seen()[before:]
    names = {name.lower() for name in seen.headers}
    assert not any(name.startswith("x-compaction-proxy-") for name in names), names


# -- a charge is never refused -------------------------------------------------------------


def _kill(server: EmbeddedRedis) -> None:
    assert server.pid is not None
    os.kill(server.pid, signal.SIGKILL)
    server.stop_sync()


def _status(url: str, key: str) -> tuple[int, int]:
    import anthropic

    try:
        with anthropic.Anthropic(base_url=url, api_key=key, max_retries=0) as client:
            message = client.messages.create(**REQUEST)
    except anthropic.APIStatusError as e:
        return e.status_code, 0
    return 200, message.usage.output_tokens


def test_what_an_outage_admitted_is_charged_to_a_key_above_its_limit(
    tmp_path: Path,
    embedded_redis: Callable[[], EmbeddedRedis],
    make_standin_thread: Callable[[StandInOptions], RunningStandIn],
) -> None:
    """The charge of usage that already happened reserved zero first, which a key above
    its limit is refused, so the charge was dropped (finding 3): what a fail-open outage
    admitted for a key whose limit was lowered meanwhile was never counted."""
    server = embedded_redis()
    standin = make_standin_thread(StandInOptions(max_recorded=None))
    fleet = Fleet([], standin, server.url, "cpcharge:")
    key, key_id = new_key(fleet, "charged", **{"day:output": 10**6})
    extra = '[budgets]\non_store_down = "open"\noutage_allowance = 100000\n'
    auth = '[auth]\nkeys = "required"\ncache_seconds = 30\n'
    (replica,) = start_replicas(tmp_path, 1, standin.url, server.url, "cpcharge:", extra, auth=auth)
    fleet.replicas = [replica]
    try:
        status, first = _status(replica.url, key)
        assert status == 200
        scope = Scope("key", key_id)
        assert quiet_usage(fleet, scope)["output"] == first

        async def lower(accounts: Accounts) -> Any:
            return await accounts.set_conf(scope, {"day:output": 1})  # now above its limit

        asyncio.run(with_accounts(fleet, lower))
        redis_conn = __import__("redis").Redis.from_url(server.url)
        redis_conn.config_set("appendfsync", "always")
        redis_conn.close()
        _kill(server)
        outputs = [_status(replica.url, key) for _ in range(2)]
        assert [s for s, _ in outputs] == [200, 200]  # admitted uncounted
        server.start_sync()
        expected = first + sum(o for _, o in outputs)
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            _status(replica.url, key)  # refused (above the limit); its call wakes the payer
            if usage(fleet, scope)["day"]["output"] >= expected:
                break
            time.sleep(0.3)
        assert usage(fleet, scope)["day"]["output"] == expected
    finally:
        replica.stop()


def test_charges_are_never_refused_above_the_limit(redis_url: str) -> None:
    """Accounts.charge adds usage that already happened whatever the limits say."""
    prefix = f"cpchargeonly:{uuid.uuid4().hex[:8]}:"
    fleet = Fleet([], None, redis_url, prefix)  # type: ignore[arg-type]
    scope = Scope("key", uuid.uuid4().hex[:12])

    async def work(accounts: Accounts) -> dict[str, int]:
        await accounts.set_conf(scope, {"day:output": 30, "minute:input": 5})
        from proxy.core.budget import Amounts

        held = await accounts.reserve(scope, Amounts(0, 30, 0), time.time())
        assert held.__class__.__name__ == "Held"
        for _ in range(2):
            await accounts.charge(scope, Amounts(7, 20, 9), time.time())
        used = await accounts.usage(scope, time.time())
        return {**used["day"], "minute_input": used["minute"]["input"]}

    try:
        found = asyncio.run(with_accounts(fleet, work))
    finally:
        delete_keys(redis_url, prefix)
    assert found == {"input": 14, "output": 70, "weighted": 18, "minute_input": 14}


# -- duplicate keys ------------------------------------------------------------------------


def test_a_field_the_proxy_reads_twice_is_refused(gate: Gate) -> None:
    """`"max_tokens": 50000 ... "max_tokens": 10` was reserved for 10 and forwarded as
    sent: an upstream that keeps the first obeys 50,000 (finding 6). Now 400, in the
    route's shape, and nothing goes upstream; the same key nested in a tool's schema (or
    a `\\u` escape in an ordinary string) is no duplicate."""
    key, key_id = new_key(gate.fleet, "duplicates", **{"day:output": 10**6})
    before = len(gate.seen())
    head = b'{"model": "claude-haiku-4-5", "messages": [{"role": "user", "content": "hi"}], '
    for body in (
        head + b'"max_tokens": 50000, "max_tokens": 10}',
        head + b'"max_tok\\u0065ns": 50000, "max_tokens": 10}',
        b'{"model": "claude-opus-4-1", "model": "claude-haiku-4-5", "max_tokens": 10,'
        b' "messages": [{"role": "user", "content": "hi"}]}',
        b'{"model": "claude-haiku-4-5", "max_tokens": 10, "messages": [{"role": "user",'
        b' "content": "'
        + b"long " * 2000
        + b'"}], "messages": [{"role": "user", "content": "hi"}]}',
    ):
        sent = [("x-api-key", key), VERSION, ("content-type", "application/json")]
        answer = asyncio.run(send(gate.url, "POST", "/v1/messages", sent, body))
        assert answer.status == 400, (body[:80], answer.status, answer.body[:200])
        assert _error(answer) == ("anthropic", "invalid_request_error")
        assert "more than once" in orjson.loads(answer.body)["error"]["message"]
    chat = b'{"model": "gpt-4o-mini", "max_completion_tokens": 9000, "max_completion_tokens": 5,'
    chat += b' "messages": [{"role": "user", "content": "hi"}]}'

    async def openai_key(accounts: Accounts) -> str:
        text, record = await accounts.create_key(
            team="duplicates", upstream_env=OPENAI_ENV, upstream_scheme="bearer", provider="openai"
        )
        await accounts.set_conf(Scope("key", record["id"]), {"day:output": 10**6})
        return text

    oai: str = asyncio.run(with_accounts(gate.fleet, openai_key))
    sent = [("authorization", f"Bearer {oai}"), ("content-type", "application/json")]
    answer = asyncio.run(send(gate.url, "POST", "/v1/chat/completions", sent, chat))
    assert answer.status == 400, answer.body[:200]
    assert _error(answer) == ("openai", "invalid_request_error")
    assert orjson.loads(answer.body)["error"]["param"] == "max_completion_tokens"
    assert gate.seen()[before:] == []
    nested = {
        **REQUEST,
        "max_tokens": 8,
        "messages": [{"role": "user", "content": 'say "max_tokens": 5 \u2019'}],
        "tools": [
            {
                "name": "pick",
                "input_schema": {
                    "type": "object",
                    "properties": {"model": {"type": "string"}, "max_tokens": {"type": "integer"}},
                },
            }
        ],
    }
    assert _post(gate, key, nested).status == 200
    assert quiet_usage(gate.fleet, Scope("key", key_id))["output"] > 0


# -- upstream_env ----------------------------------------------------------------------------


def _admin(gate: Gate, method: str, path: str, body: Any) -> RawResponse:
    headers = [("authorization", f"Bearer {ADMIN_SECRET}"), ("content-type", "application/json")]
    return asyncio.run(send(gate.url, method, path, headers, orjson.dumps(body)))


def test_admin_made_keys_name_only_upstream_variables_the_operator_allows(gate: Gate) -> None:
    """`POST /admin/keys {"upstream_env": ...}` accepted any variable, the admin key's
    among them: a proxy key then sent the admin key upstream (finding 7)."""
    for env in (ADMIN_ENV, "COMPACTION_PROXY_STORE_REDIS_URL", "REDIS_URL", "HOME", ENV):
        answer = _admin(gate, "POST", "/admin/keys", {"team": "envs", "upstream_env": env})
        assert answer.status == 400, (env, answer.status, answer.body[:200])
        assert "upstream" in orjson.loads(answer.body)["error"]["message"]
    made = _admin(gate, "POST", "/admin/keys", {"team": "envs"})  # the provider's default
    assert made.status == 201, made.body[:200]
    assert orjson.loads(made.body)["upstream_env"] == "ANTHROPIC_API_KEY"

    # A record naming the admin key's variable (written to Redis by other means) is
    # never served: the admin key never goes upstream.
    async def work(accounts: Accounts) -> str:
        text, _ = await accounts.create_key(team="envs", upstream_env=ADMIN_ENV)
        return text

    key: str = asyncio.run(with_accounts(gate.fleet, work))
    before = len(gate.seen())
    answer = _post(gate, key, {**REQUEST, "max_tokens": 8})
    assert answer.status == 401, answer.body[:200]
    assert gate.seen()[before:] == []
    assert all(ADMIN_SECRET not in str(r.headers) for r in gate.seen())
