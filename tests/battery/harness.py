"""A real `compaction-proxy serve` (a child process, its log captured) in front of the
strict stand-in (in a thread), and what the battery checks of each exchange.

Every example posts one request and reads what the stand-in recorded for it: the
client's answer, and each request the proxy sent upstream with the stand-in's verdict
(a 400 it refused with, `error`). The properties (`check`) are the issue's: no 5xx the
proxy caused, nothing the proxy built refused by the upstream (a rewrite, a read round,
a summariser call), what a rewrite kept sent as the client's bytes, every ref it made
readable, the client's answer in the API's shape and never empty, and (at the end) no
unhandled error in serve's log.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import orjson
import requests

from proxy.testing.standin_http import RecordedRequest
from tests.battery.generate import Format
from tests.battery.policy import BATTERY_POLICY
from tests.plugins.standin import RunningStandIn

PURPOSE = "x-compaction-proxy-purpose"
STUB_READ = {"x-stand-in": '{"read_result": true}'}
# What serve's log must never hold (an error escaping a task, a traceback).
UNHANDLED = ("Task exception was never retrieved", "Traceback (most recent call last)")


def battery_examples(default: int) -> int:
    """Examples per test: BATTERY_EXAMPLES (README, "Tests"), else the modest default."""
    return int(os.environ.get("BATTERY_EXAMPLES", default))


def _toml(value: Any) -> str:
    return orjson.dumps(value).decode() if isinstance(value, str) else str(value).lower()


def config_text(upstream: str, redis_url: str, prefix: str) -> str:
    policy = "\n".join(f"{key} = {_toml(value)}" for key, value in BATTERY_POLICY.items())
    return (
        f'[server]\nport = 0\nhost = "127.0.0.1"\n\n'
        f'[upstream]\nurl = "{upstream}"\nopenai_url = "{upstream}"\n'
        f'bedrock_url = "{upstream}"\nvertex_url = "{upstream}"\n'
        f'gemini_url = "{upstream}"\n\n'
        f'[store]\nredis_url = "{redis_url}"\nkey_prefix = "{prefix}"\n\n'
        f"[[policy]]\n{policy}\n"
    )


@dataclass
class Serve:
    url: str
    log: Path
    standin: RunningStandIn

    def log_text(self) -> str:
        return self.log.read_text(errors="replace")


@contextmanager
def serve(standin: RunningStandIn, redis_url: str, prefix: str, where: Path) -> Iterator[Serve]:
    """`python -m proxy serve --config ...` with the battery's policy, its stderr in a
    file (read while it runs: a pipe left unread would stall it)."""
    config = where / "battery.toml"
    config.write_text(config_text(standin.url, redis_url, prefix))
    log = where / "serve.log"
    env = {k: v for k, v in os.environ.items() if not k.startswith("COMPACTION_PROXY_")}
    with log.open("w") as sink:
        child = subprocess.Popen(
            [sys.executable, "-m", "proxy", "serve", "--config", str(config)],
            env=env,
            stderr=sink,
            stdout=subprocess.DEVNULL,
        )
    try:
        url = ""
        deadline = time.monotonic() + 60
        while not url and time.monotonic() < deadline and child.poll() is None:
            for line in log.read_text(errors="replace").splitlines():
                if "listening on " in line:
                    url = line.split("listening on ")[1].split(",")[0]
            time.sleep(0.05)
        assert url.startswith("http://127.0.0.1:"), log.read_text(errors="replace")
        yield Serve(url, log, standin)
    finally:
        child.terminate()
        try:
            child.wait(10)
        except subprocess.TimeoutExpired:
            child.kill()
            child.wait()


@dataclass
class Exchange:
    status: int
    headers: Mapping[str, str]
    answer: Any  # the client's answer, parsed (None when it is not JSON)
    sent: list[RecordedRequest]  # what reached the stand-in for it, in order
    raw: bytes = b""  # the client's answer as it came


def exchange(
    client: requests.Session,
    s: Serve,
    fmt: Format,
    body: bytes,
    path: str = "",
    tag: bytes = b"",
    extra: Mapping[str, str] | None = None,
) -> Exchange:
    """`body` posted to the format's path (or `path`: a stream's), with `extra` headers.
    `tag`: what only this request's sending holds (requests sent at once: the others'
    are left out)."""
    before = len(s.standin.recorded)
    headers = {**fmt.headers, **STUB_READ, "content-type": "application/json", **(extra or {})}
    response = client.post(s.url + (path or fmt.path), data=body, headers=headers, timeout=60)
    try:
        answer = orjson.loads(response.content)
    except orjson.JSONDecodeError:
        answer = None
    # A summary made ahead may still be on its way: what it sent is looked at when the
    # next example's request began (the recorder keeps the order they came in).
    script = headers["x-stand-in"]  # (requests made for another exchange left out)
    sent = [
        r
        for r in s.standin.recorded[before:]
        if tag in r.body and header(r, "x-stand-in") == script
    ]
    # A streamed answer's last bytes can reach the client before the stand-in has noted
    # the request done: its own requests are read once they are.
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline and any(
        r.ended_at is None for r in sent if not r.headers.get(PURPOSE)
    ):
        time.sleep(0.01)
    return Exchange(response.status_code, response.headers, answer, sent, response.content)


def header(r: RecordedRequest, name: str) -> str:
    """A header of a recorded request (as received: any case)."""
    return next((v for k, v in r.headers.items() if k.lower() == name), "")


def history_of(body: Any) -> list[Any]:
    history = None
    if isinstance(body, dict):
        history = body.get("input", body.get("messages", body.get("contents")))
    return history if isinstance(history, list) else []


def check_valid(fmt: Format, raw: bytes, spans: list[bytes] | None, ex: Exchange) -> None:
    """A valid conversation: answered (or refused by the proxy as the API would, when it
    cannot fit), everything the proxy sent taken by the upstream, what it kept exact
    (`spans`: the bytes of each message, when they are to be kept byte for byte)."""
    assert ex.status < 500, (ex.status, ex.answer)
    if ex.status != 200:
        assert ex.status == 400 and "too long" in str(ex.answer), (ex.status, ex.answer)
        assert not [r for r in ex.sent if not r.headers.get(PURPOSE)], "refused, not sent"
        return
    _check_sent(ex)
    assert_answer(fmt, ex.answer)
    rewritten = ex.headers.get("x-compaction-strategy")
    agent = [r for r in ex.sent if not r.headers.get(PURPOSE)]
    assert agent, "the request went upstream"
    if rewritten is None:
        assert agent[0].body == raw, "not rewritten: the client's bytes"
    _kept_exactly(raw, spans, agent[0].body)


def check_invalid(fmt: Format, raw: bytes, ex: Exchange) -> None:
    """A broken request: never rewritten, never summarised; the client's bytes go up (or
    the proxy answers it itself, in the API's shape), and nobody answers 5xx."""
    assert ex.status < 500, (ex.status, ex.answer)
    assert "x-compaction-strategy" not in ex.headers
    assert not [r for r in ex.sent if r.headers.get(PURPOSE)], "no summariser call"
    for r in ex.sent:
        assert r.body == raw, "a broken request goes up as it came"
        assert r.status is not None and r.status < 500
    if ex.status == 200:
        assert_answer(fmt, ex.answer)
    else:
        assert_error(fmt, ex.answer)


def check_odd(fmt: Format, raw: bytes, deep: bytes, ex: Exchange) -> None:
    """A valid request holding a value nested deeper than orjson writes: compacted (what
    was sent taken by the upstream, the deep value as the client wrote it) or declined
    (the client's bytes), never a failure."""
    assert ex.status < 500, (ex.status, ex.answer)
    if "x-compaction-strategy" in ex.headers:
        _check_sent(ex)
        assert all(deep in r.body for r in ex.sent if not r.headers.get(PURPOSE))
    else:
        assert all(r.body == raw for r in ex.sent if not r.headers.get(PURPOSE))
    if ex.status == 200:
        assert_answer(fmt, ex.answer)
    else:
        assert_error(fmt, ex.answer)


def _check_sent(ex: Exchange) -> None:
    for r in ex.sent:
        if r.status is None and r.headers.get(PURPOSE):
            continue  # a summary made ahead, still on its way: checked at the end
        assert r.status is not None and r.status < 500, (r.status, r.error)
        assert r.status == 200, f"the upstream refused what the proxy sent: {r.error}"
        assert b"No offloaded result" not in r.body, "a ref the proxy made reads as missing"


def _kept_exactly(raw: bytes, spans: list[bytes] | None, sent: bytes) -> None:
    """Every message of the client's that the rewrite kept (the same value) is in what
    was sent with every value as the client wrote it (numbers read exactly: Python's
    json keeps a 30-digit integer whole), and as the client's very bytes (`spans`, each
    message's) when the client wrote compact JSON: its spaces and escapes otherwise mean
    the same whoever writes them."""
    client, upstream = history_of(orjson.loads(raw)), history_of(orjson.loads(sent))
    exact_client, exact_upstream = history_of(json.loads(raw)), history_of(json.loads(sent))
    assert spans is None or len(spans) == len(client)
    for k, message in enumerate(upstream):
        for n, mine in enumerate(client):
            if message == mine:
                assert exact_upstream[k] == exact_client[n], f"message {n} kept, a value changed"
                if spans is not None:
                    assert spans[n] in sent, f"message {n} kept, but not as the client wrote it"
                break


def assert_answer(fmt: Format, answer: Any) -> None:
    """The answer in the API's shape, not empty, and no call of a tool the client did not
    give (the proxy's read_result is never seen)."""
    assert isinstance(answer, dict), answer
    if fmt.name in ("messages", "bedrock", "vertex"):
        assert answer["type"] == "message" and answer["content"], answer
        called = [b["name"] for b in answer["content"] if b["type"] == "tool_use"]
    elif fmt.name == "gemini":
        parts = answer["candidates"][0]["content"]["parts"]
        assert parts and any(p.get("text") or p.get("functionCall") for p in parts), answer
        called = [p["functionCall"]["name"] for p in parts if "functionCall" in p]
    elif fmt.name == "chat":
        message = answer["choices"][0]["message"]
        assert message.get("content") or message.get("tool_calls"), answer
        called = [c["function"]["name"] for c in message.get("tool_calls") or []]
    else:
        assert answer["object"] == "response" and answer["output"], answer
        called = [i["name"] for i in answer["output"] if i["type"] == "function_call"]
    assert set(called) <= {"run"}, f"a call of a tool the client did not give: {called}"


def assert_error(fmt: Format, answer: Any) -> None:
    assert isinstance(answer, dict), answer
    if fmt.name == "messages":
        assert answer["type"] == "error" and answer["error"]["message"], answer
    elif fmt.name == "bedrock":  # AWS's shape
        assert answer["message"], answer
    else:  # OpenAI's, Google's (Vertex's own refusals) or Anthropic's (its model's)
        assert answer["error"]["message"], answer
