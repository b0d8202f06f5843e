"""The compactor's quiet path: a request whose history's bytes prove it under every
threshold is forwarded without looking anything up in the count cache; the bytes are
read off the reuse cache's layout for a line's continuation, and a `source` in the new
messages or anything but text in the system prompt sends it to the count."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import orjson

from proxy.core.identity import tenant_of
from proxy.core.policy import Policy
from proxy.core.reuse import key_of
from proxy.server.bodies import Incoming
from proxy.server.compactor import Asked, Compactor
from proxy.server.record import RequestRecord
from proxy.wire import ANTHROPIC

AGENT = Path(__file__).parents[1] / "fixtures" / "agent-requests"
IMAGE = {"type": "image", "source": {"type": "url", "url": "https://x/y.png"}}


async def _counted(bodies: list[dict[str, Any]]) -> list[bool]:
    """Each body prepared in turn as one line's requests (no calibration sample): whether
    it was counted (the count cache asked)."""
    recorded = json.loads((AGENT / "claude-code-turn1.json").read_text())
    headers = {**recorded["headers"], "x-api-key": "sk-quiet"}
    compactor = Compactor([Policy(window=1_000_000)])
    for _ in range(25):  # past the calibration's warm-up samples
        compactor.calibration.record("anthropic:m", 1.0, None, tenant_of(headers))
    asked = Asked(headers, "m")
    counted = []
    for n, body in enumerate(bodies):
        raw = orjson.dumps(body)
        payload, seen = compactor.reuse.parse(key_of("t", "line", raw), raw, "messages")
        if n:
            assert seen is not None and seen.reused  # a continuation of the line
        record = RequestRecord("", "", "")
        before = compactor.counter.cache_info()
        prepared = await compactor.prepare(
            Incoming(raw, payload, seen=seen), ANTHROPIC, None, asked, record
        )
        assert prepared.body is raw  # under every threshold: untouched either way
        info = compactor.counter.cache_info()
        counted.append((info.hits, info.misses) != (before.hits, before.misses))
    await compactor.close()
    return counted


async def test_a_short_history_is_quiet_by_its_bytes_and_a_new_image_is_counted() -> None:
    body = json.loads((AGENT / "claude-code-turn1.json").read_text())["body"]
    body = {**body, "model": "m"}
    messages = body["messages"]
    reply = {"role": "assistant", "content": [{"type": "text", "text": "Looking."}]}
    grown = [*messages, reply, {"role": "user", "content": [{"type": "text", "text": "go"}]}]
    pictured = [*grown, reply, {"role": "user", "content": [IMAGE]}]
    counted = await _counted([body, {**body, "messages": grown}, {**body, "messages": pictured}])
    assert counted == [False, False, True]  # the image is charged as the counter charges it


async def test_a_system_prompt_of_more_than_text_is_counted() -> None:
    body = json.loads((AGENT / "claude-code-turn1.json").read_text())["body"]
    body = {**body, "model": "m", "system": [*body["system"], IMAGE]}
    assert await _counted([body]) == [True]
