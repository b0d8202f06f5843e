"""What a proxy key may reach and what it pays for, through real `serve` replicas.

Two replicas with keys required share the test session's Redis, in front of two
recording upstreams (an Anthropic one and an OpenAI one, each the stand-in taught the
pass-through APIs: tests/fleet/upstreams.py). Each test makes its own keys:

- a key reaches other paths than the metered routes only through its scopes, so one
  team's key cannot list or read what another team stored upstream on a shared
  credential (files, message batches);
- a key is bound to its provider: its credential never goes to the other upstream;
- every metered route is reserved and settled or refused: pass-through model calls, a
  compressed body, an empty Content-Encoding, a float `max_tokens`, `n` choices.
"""

from __future__ import annotations

import asyncio
import gzip
import time
import urllib.error
import urllib.request
import uuid
import zlib
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import anthropic
import openai
import orjson
import pytest

from proxy.core.budget import reservation
from proxy.core.identity import credential
from proxy.store import Store
from proxy.store.accounts import Accounts, Scope
from tests.fleet.test_fleet import Replica, start_replicas
from tests.fleet.upstreams import COUNTER, ThreadedApp, api_app, running
from tests.plugins.redis import delete_keys

ANTHROPIC_ENV, ANTHROPIC_SECRET = "CP_ENF_ANTHROPIC", "sk-ant-enforcement"
OPENAI_ENV, OPENAI_SECRET = "CP_ENF_OPENAI", "sk-oai-enforcement"
VERSION = {"anthropic-version": "2023-06-01"}


@dataclass
class Setup:
    replicas: list[Replica]
    anthropic_side: ThreadedApp
    openai_side: ThreadedApp
    redis_url: str
    prefix: str

    @property
    def url(self) -> str:
        return self.replicas[0].url

    def logs(self) -> str:
        return "".join(r.log.read_text(errors="replace") for r in self.replicas)


@pytest.fixture(scope="module")
def setup(tmp_path_factory: pytest.TempPathFactory, redis_url: str) -> Iterator[Setup]:
    prefix = f"cpenf:{uuid.uuid4().hex[:10]}:"
    with running(api_app) as anthropic_side, running(api_app) as openai_side:
        replicas = start_replicas(
            tmp_path_factory.mktemp("enforcement"),
            2,
            anthropic_side.url,
            redis_url,
            prefix,
            f'[upstream]\nopenai_url = "{openai_side.url}"\n[budgets]\non_store_down = "closed"\n',
            env={ANTHROPIC_ENV: ANTHROPIC_SECRET, OPENAI_ENV: OPENAI_SECRET},
        )
        try:
            yield Setup(replicas, anthropic_side, openai_side, redis_url, prefix)
        finally:
            for replica in replicas:
                replica.stop()
            delete_keys(redis_url, prefix)


async def _accounts(setup: Setup, work: Any) -> Any:
    store = Store.from_url(setup.redis_url, prefix=setup.prefix, op_timeout=5.0)
    try:
        return await work(Accounts(store))
    finally:
        await store.close()


def new_key(
    setup: Setup,
    team: str,
    provider: str = "anthropic",
    scopes: tuple[str, ...] = (),
    **limits: int,
) -> tuple[str, str]:
    env, scheme = (OPENAI_ENV, "bearer") if provider == "openai" else (ANTHROPIC_ENV, "x-api-key")

    async def work(accounts: Accounts) -> tuple[str, str]:
        text, record = await accounts.create_key(
            team=team, upstream_env=env, upstream_scheme=scheme, provider=provider, scopes=scopes
        )
        if limits:
            await accounts.set_conf(Scope("key", record["id"]), dict(limits))  # type: ignore[arg-type]
        return text, record["id"]

    found: tuple[str, str] = asyncio.run(_accounts(setup, work))
    return found


def day_usage(setup: Setup, key_id: str) -> dict[str, int]:
    async def work(accounts: Accounts) -> dict[str, int]:
        return (await accounts.usage(Scope("key", key_id), time.time()))["day"]

    found: dict[str, int] = asyncio.run(_accounts(setup, work))
    return found


def settles_to(setup: Setup, key_id: str, check: Any) -> dict[str, int]:
    deadline = time.monotonic() + 15
    while True:
        used = day_usage(setup, key_id)
        if check(used) or time.monotonic() > deadline:
            return used
        time.sleep(0.05)


@dataclass
class Answer:
    status: int
    headers: dict[str, str]
    body: bytes

    @property
    def json(self) -> Any:
        return orjson.loads(self.body)


def call(
    url: str,
    method: str,
    path: str,
    headers: dict[str, str],
    body: bytes | None = None,
) -> Answer:
    request = urllib.request.Request(url + path, data=body, method=method, headers=headers)
    try:
        with urllib.request.urlopen(request, timeout=30) as response:
            return Answer(response.status, dict(response.headers), response.read())
    except urllib.error.HTTPError as e:
        return Answer(e.code, dict(e.headers), e.read())


def anthropic_headers(key: str, **more: str) -> dict[str, str]:
    return {"x-api-key": key, **VERSION, "content-type": "application/json", **more}


def openai_headers(key: str, **more: str) -> dict[str, str]:
    return {"authorization": f"Bearer {key}", "content-type": "application/json", **more}


def seen_with(app: ThreadedApp, secret: str) -> list[str]:
    """Paths the upstream received carrying `secret` as their credential."""
    return [
        f"{r.method} {r.path_qs}"
        for r in app.recorded
        if credential({k.lower(): v for k, v in r.headers.items()}) == secret
    ]


def anthropic_error(answer: Answer, kind: str) -> str:
    body = answer.json
    assert body["type"] == "error" and body["error"]["type"] == kind, body
    return str(body["error"]["message"])


def openai_error(answer: Answer, kind: str) -> str:
    error = answer.json["error"]
    assert error["type"] == kind and set(error) == {"message", "type", "param", "code"}, error
    return str(error["message"])


MESSAGE = {
    "model": "claude-haiku-4-5",
    "max_tokens": 64,
    "messages": [{"role": "user", "content": "Say ok."}],
}


# -- scopes: what a key may reach ----------------------------------------------------------


def test_a_key_reaches_other_paths_only_through_its_scopes(setup: Setup) -> None:
    """Two teams' keys map to the same upstream credential. Team A's key was given the
    files and batches scopes; team C's was not, and cannot list or read A's files or
    batches through it (finding 1)."""
    key_a, _ = new_key(setup, "team-a", scopes=("files", "batches"))
    key_c, _ = new_key(setup, "team-c")
    upstream = setup.anthropic_side
    before = len(upstream.recorded)
    reads = (
        "/v1/files",
        "/v1/files/file_team_a/content",
        "/v1/messages/batches",
        "/v1/messages/batches/msgbatch_team_a/results",
    )
    for path in reads:
        denied = call(setup.url, "GET", path, anthropic_headers(key_c))
        assert denied.status == 403, (path, denied.body)
        message = anthropic_error(denied, "permission_error")
        assert "scope" in message and "--scope" in message
    assert len(upstream.recorded) == before  # nothing of C's went upstream
    # A file upload is no different.
    upload = call(setup.url, "POST", "/v1/files", anthropic_headers(key_c), b"plans")
    assert upload.status == 403
    # Team A's key, with the scopes, reaches them, with the mapped credential.
    for path in reads:
        allowed = call(setup.url, "GET", path, anthropic_headers(key_a))
        assert allowed.status == 200, (path, allowed.body)
    assert b"team-a-plans" in call(setup.url, "GET", "/v1/files", anthropic_headers(key_a)).body
    assert seen_with(upstream, ANTHROPIC_SECRET)[-1] == "GET /v1/files"
    # Every key reaches the metered routes; even the model list needs its scope.
    with anthropic.Anthropic(base_url=setup.url, api_key=key_c, max_retries=0) as client:
        assert client.messages.create(**MESSAGE).content
    assert call(setup.url, "GET", "/v1/models", anthropic_headers(key_c)).status == 403
    key_m, _ = new_key(setup, "team-c", scopes=("models",))
    assert call(setup.url, "GET", "/v1/models", anthropic_headers(key_m)).status == 200
    # An OpenAI client's key gets the same refusal in OpenAI's shape.
    key_o, _ = new_key(setup, "team-c", provider="openai")
    denied = call(setup.url, "GET", "/v1/files", openai_headers(key_o))
    assert denied.status == 403
    assert "scope" in openai_error(denied, "permission_error")
    unknown = call(setup.url, "GET", "/v1/organizations/users", anthropic_headers(key_c))
    assert unknown.status == 403 and "'all'" in anthropic_error(unknown, "permission_error")
    assert (
        'compaction_proxy_budget_rejections_total{reason="scope"}'
        in call(setup.url, "GET", "/metrics", {}).body.decode()
    )


def test_a_key_never_sends_its_credential_to_the_other_provider(setup: Setup) -> None:
    """An Anthropic key's credential went to the OpenAI upstream on OpenAI paths
    (finding 6). Now each key reaches its own provider's API only."""
    key_a, _ = new_key(setup, "providers")
    key_o, _ = new_key(setup, "providers", provider="openai", scopes=("models",))
    openai_side, anthropic_side = setup.openai_side, setup.anthropic_side
    chat = {"model": "gpt-4o", "messages": [{"role": "user", "content": "hi"}]}
    for path, body in (
        ("/v1/chat/completions", chat),
        ("/v1/embeddings", {"model": "text-embedding-3-small", "input": "hi"}),
        ("/v1/responses", {"model": "gpt-4o", "input": "hi"}),
        ("/v1/completions", {"model": "gpt-3.5-turbo-instruct", "prompt": "hi"}),
    ):
        denied = call(setup.url, "POST", path, openai_headers(key_a), orjson.dumps(body))
        assert denied.status == 403, (path, denied.body)
        assert "Anthropic API" in openai_error(denied, "permission_error")
    client = openai.OpenAI(base_url=setup.url + "/v1", api_key=key_a, max_retries=0)
    with client, pytest.raises(openai.PermissionDeniedError):
        client.chat.completions.create(**chat)  # type: ignore[call-overload]
    assert seen_with(openai_side, ANTHROPIC_SECRET) == []
    # ... and an OpenAI key never reaches the Anthropic upstream.
    denied = call(setup.url, "POST", "/v1/messages", openai_headers(key_o), orjson.dumps(MESSAGE))
    assert denied.status == 403
    assert seen_with(anthropic_side, OPENAI_SECRET) == []
    # Each works where it belongs; a shared path (/v1/models) goes to the key's provider.
    with openai.OpenAI(base_url=setup.url + "/v1", api_key=key_o, max_retries=0) as client:
        assert client.chat.completions.create(**chat).choices  # type: ignore[call-overload]
    models = call(setup.url, "GET", "/v1/models", anthropic_headers(key_o))
    assert models.status == 200
    assert seen_with(openai_side, OPENAI_SECRET)[-2:] == [
        "POST /v1/chat/completions",
        "GET /v1/models",
    ]


# -- every metered route reserved and settled, or refused ----------------------------------


def test_pass_through_model_calls_are_reserved_and_settled_or_refused(setup: Setup) -> None:
    """A key over its budget got 429 on /v1/messages but 200 on message batches,
    /v1/complete, /v1/responses and /v1/completions (finding 2)."""
    limits = {"day:output": 300}
    key_a, id_a = new_key(setup, "metered", scopes=("batches",), **limits)
    key_o, id_o = new_key(setup, "metered", provider="openai", scopes=("batches",), **limits)
    batch = {
        "requests": [
            {"custom_id": f"r{n}", "params": {**MESSAGE, "max_tokens": 200}} for n in range(2)
        ]
    }
    too_much = [
        (key_a, "/v1/messages", {**MESSAGE, "max_tokens": 400}),
        (key_a, "/v1/messages/batches", batch),
        (key_a, "/v1/complete", {"model": "claude-2.1", "prompt": "\n\nHuman: hi\n\nAssistant:",
                                 "max_tokens_to_sample": 400}),
        (key_o, "/v1/responses", {"model": "gpt-4o", "input": "hi", "max_output_tokens": 400}),
        (key_o, "/v1/completions", {"model": "gpt-3.5-turbo-instruct", "prompt": "hi",
                                    "max_tokens": 400}),
    ]  # fmt: skip
    before = (len(setup.anthropic_side.recorded), len(setup.openai_side.recorded))
    for key, path, body in too_much:
        headers = anthropic_headers(key) if key == key_a else openai_headers(key)
        refused = call(setup.url, "POST", path, headers, orjson.dumps(body))
        assert refused.status == 429, (path, refused.body)
        assert int(refused.headers["retry-after"]) >= 1
        assert b"needs 400 output tokens" in refused.body and b"budget of 300" in refused.body
    assert (len(setup.anthropic_side.recorded), len(setup.openai_side.recorded)) == before
    # Within the budget: a legacy completion settles to the usage it reports ...
    body = {"model": "gpt-3.5-turbo-instruct", "prompt": "Say ok.", "max_tokens": 100}
    done = call(setup.url, "POST", "/v1/completions", openai_headers(key_o), orjson.dumps(body))
    assert done.status == 200
    usage = done.json["usage"]
    used = settles_to(setup, id_o, lambda u: u["output"] == usage["completion_tokens"])
    assert (used["input"], used["output"]) == (usage["prompt_tokens"], usage["completion_tokens"])
    # ... /v1/complete reports none: it costs its whole reservation ...
    legacy = {"model": "claude-2.1", "prompt": "\n\nHuman: hi\n\nAssistant:",
              "max_tokens_to_sample": 50}  # fmt: skip
    done = call(setup.url, "POST", "/v1/complete", anthropic_headers(key_a), orjson.dumps(legacy))
    assert done.status == 200
    assert settles_to(setup, id_a, lambda u: u["output"] == 50)["output"] == 50
    # ... a batch is charged every request it holds, once accepted.
    small = {"requests": [{"custom_id": "a", "params": {**MESSAGE, "max_tokens": 100}}] * 2}
    accepted = call(
        setup.url, "POST", "/v1/messages/batches", anthropic_headers(key_a), orjson.dumps(small)
    )
    assert accepted.status == 200
    charged = reservation(2 * COUNTER.count_request(small["requests"][0]["params"]), 200,
                          one_hour_cache=False)  # fmt: skip
    used = settles_to(setup, id_a, lambda u: u["output"] == 250)
    assert (used["output"], used["input"]) == (250, charged.input + COUNTER.count_json(legacy))
    # Reading batches costs nothing; an OpenAI batch (its requests are in an uploaded
    # file) cannot be estimated: refused for a key with budgets.
    assert call(setup.url, "GET", "/v1/messages/batches", anthropic_headers(key_a)).status == 200
    file_batch = {"input_file_id": "file_x", "endpoint": "/v1/chat/completions"}
    refused = call(
        setup.url, "POST", "/v1/batches", openai_headers(key_o), orjson.dumps(file_batch)
    )
    assert refused.status == 403 and "cannot estimate" in openai_error(refused, "permission_error")
    assert not [r for r in setup.openai_side.recorded if r.path_qs == "/v1/batches"]


def _gzip_bomb(size: int) -> bytes:
    packer = zlib.compressobj(9, zlib.DEFLATED, 16 + zlib.MAX_WBITS)
    chunk = b" " * (1 << 20)
    head = b'{"model": "claude-haiku-4-5", "max_tokens": 64, "pad": "'
    parts = [packer.compress(head)]
    parts += [packer.compress(chunk) for _ in range(size >> 20)]
    parts.append(packer.compress(b'"}') + packer.flush())
    return b"".join(parts)


def test_a_budget_sees_through_compressed_and_odd_bodies(setup: Setup) -> None:
    """An empty Content-Encoding, a gzip body or a float max_tokens reserved 4,096
    output tokens for a request asking 64,000 against a 10,000 limit (finding 3); a
    max_tokens of 1e17 broke the reservation script half-way (a Low item)."""
    key, key_id = new_key(setup, "encodings", **{"day:output": 10_000})
    big = orjson.dumps({**MESSAGE, "max_tokens": 64_000})
    upstream = setup.anthropic_side
    before = len(upstream.recorded)
    for headers, body in (
        ({"content-encoding": ""}, big),
        ({"content-encoding": "identity"}, big),
        ({"content-encoding": "gzip"}, gzip.compress(big)),
        ({"content-encoding": "deflate"}, zlib.compress(big)),
        ({"content-encoding": "gzip, gzip"}, gzip.compress(gzip.compress(big))),
    ):
        refused = call(setup.url, "POST", "/v1/messages", anthropic_headers(key, **headers), body)
        assert refused.status == 429, (headers, refused.body)
        assert "needs 64000 output tokens" in anthropic_error(refused, "rate_limit_error")
    for value, shown in (("64000.0", "64000.0"), ("1e17", "1e+17"), ('"64000"', "'64000'")):
        body = b'{"model": "claude-haiku-4-5", "messages": [], "max_tokens": %s}' % value.encode()
        refused = call(setup.url, "POST", "/v1/messages", anthropic_headers(key), body)
        assert refused.status == 400, refused.body
        message = anthropic_error(refused, "invalid_request_error")
        assert "max_tokens" in message and shown in message
    unreadable = call(
        setup.url, "POST", "/v1/messages", anthropic_headers(key, **{"content-encoding": "br"}), big
    )
    assert unreadable.status == 415
    assert "Content-Encoding" in anthropic_error(unreadable, "invalid_request_error")
    bomb = call(
        setup.url,
        "POST",
        "/v1/messages",
        anthropic_headers(key, **{"content-encoding": "gzip"}),
        _gzip_bomb(64 << 20),  # 64 MiB of spaces in about 64 KiB
    )
    assert bomb.status == 413
    assert len(upstream.recorded) == before  # none of them went upstream
    # A compressed request within the budget goes through as sent and is settled.
    small = orjson.dumps({**MESSAGE, "max_tokens": 100})
    gzipped = anthropic_headers(key, **{"content-encoding": "gzip"})
    done = call(setup.url, "POST", "/v1/messages", gzipped, gzip.compress(small))
    assert done.status == 200, done.body
    (received,) = upstream.recorded[before:]
    assert {k.lower(): v for k, v in received.headers.items()}["content-encoding"] == "gzip"
    assert orjson.loads(received.body) == orjson.loads(small)  # the stand-in decoded it
    output = done.json["usage"]["output_tokens"]
    assert settles_to(setup, key_id, lambda u: u["output"] == output)["output"] == output


def test_choices_multiply_the_output_reservation(setup: Setup) -> None:
    """Chat `n = 8` reserved one completion: 4,000 used against a 1,000 budget
    (finding 5)."""
    key, key_id = new_key(setup, "choices", provider="openai", **{"day:output": 1_000})
    chat = {"model": "gpt-4o", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 500}
    with openai.OpenAI(base_url=setup.url + "/v1", api_key=key, max_retries=0) as client:
        with pytest.raises(openai.RateLimitError) as refused:
            client.chat.completions.create(**chat, n=8)  # type: ignore[call-overload]
        assert "needs 4000 output tokens" in refused.value.message
        answer = client.chat.completions.create(**{**chat, "max_tokens": 250}, n=4)  # type: ignore[call-overload]
    assert len(answer.choices) == 4
    output = answer.usage.completion_tokens
    assert settles_to(setup, key_id, lambda u: u["output"] == output)["output"] == output
    client = openai.OpenAI(base_url=setup.url + "/v1", api_key=key, max_retries=0)
    with client, pytest.raises(openai.BadRequestError) as bad:
        client.chat.completions.create(**chat, n=0)  # type: ignore[call-overload]
    assert bad.value.body["param"] == "n"  # type: ignore[index]


def test_readiness_and_errors_name_no_upstream_password(tmp_path: Path, redis_url: str) -> None:
    """A password in upstream.url appeared in 502 bodies, in the unauthenticated
    /readyz and in the start-up log line (finding 7)."""
    secret = f"pw{uuid.uuid4().hex[:12]}"
    dead = f"http://operator:{secret}@127.0.0.1:9"
    prefix = f"cppw:{uuid.uuid4().hex[:8]}:"
    keys_off = '[auth]\nkeys = "off"\n'
    (replica,) = start_replicas(tmp_path, 1, dead, redis_url, prefix, auth=keys_off)
    try:
        failed = call(replica.url, "POST", "/v1/messages", anthropic_headers("sk-x"),
                      orjson.dumps(MESSAGE))  # fmt: skip
        assert failed.status == 502
        assert "operator:***@127.0.0.1:9" in anthropic_error(failed, "api_error")
        ready = call(replica.url, "GET", "/readyz", {})
        assert ready.json["upstream"] == "http://operator:***@127.0.0.1:9"
    finally:
        replica.stop()
        delete_keys(redis_url, prefix)
    log = replica.log.read_text()
    assert "upstream http://operator:***@127.0.0.1:9" in log
    assert secret not in log and secret.encode() not in failed.body + ready.body
