"""The compactor's quiet path: a request whose history's bytes prove it under every
threshold is forwarded without looking anything up in the count cache; the bytes are
read off the reuse cache's layout for a line's continuation, and a `source` in the new
messages or anything but text in the system prompt sends it to the count."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import orjson
import pytest

from proxy.core.counting import count_unless_quiet
from proxy.core.identity import tenant_of
from proxy.core.policy import Policy
from proxy.core.reuse import key_of
from proxy.server import compactor as compactor_module
from proxy.server.bodies import Incoming
from proxy.server.compactor import Asked, Compactor
from proxy.server.record import RequestRecord
from proxy.wire import ANTHROPIC

AGENT = Path(__file__).parents[1] / "fixtures" / "agent-requests"
IMAGE = {"type": "image", "source": {"type": "url", "url": "https://x/y.png"}}


async def _counted(bodies: list[dict[str, Any]]) -> list[bool]:
    """Each body prepared in turn as one line's requests (no calibration sample): whether
    it was counted (the count cache asked)."""

    def asked(compactor: Compactor) -> object:
        info = compactor.counter.cache_info()
        return info.hits, info.misses

    return await _moved(bodies, asked)


async def _moved(bodies: list[dict[str, Any]], mark: Callable[[Compactor], object]) -> list[bool]:
    """Each body prepared in turn as one line's requests (no calibration sample): whether
    `mark(compactor)` moved while it was."""
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
        before = mark(compactor)
        prepared = await compactor.prepare(
            Incoming(raw, payload, seen=seen), ANTHROPIC, None, asked, record
        )
        assert prepared.body is raw  # under every threshold: untouched either way
        counted.append(mark(compactor) != before)
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


async def _quiet(bodies: list[dict[str, Any]], monkeypatch: pytest.MonkeyPatch) -> list[bool]:
    """Each body prepared in turn as one line's requests: whether its bytes proved it
    quiet (nothing counted: `count_unless_quiet` not reached, whatever it would find in
    the counts the line keeps)."""
    reached: list[int] = []

    def counting(*args: Any) -> Any:
        reached.append(1)
        return count_unless_quiet(*args)

    monkeypatch.setattr(compactor_module, "count_unless_quiet", counting)
    return [not counted for counted in await _moved(bodies, lambda _: len(reached))]


async def test_an_image_in_the_messages_a_line_repeats_is_counted_each_time(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # The search skips only the bytes a line's last search found without a `source`.
    body = json.loads((AGENT / "claude-code-turn1.json").read_text())["body"]
    body = {**body, "model": "m"}
    reply = {"role": "assistant", "content": [{"type": "text", "text": "Looking."}]}
    pictured = [*body["messages"], reply, {"role": "user", "content": [IMAGE]}]
    more = [*pictured, reply, {"role": "user", "content": [{"type": "text", "text": "go"}]}]
    bodies = [{**body, "messages": m} for m in (pictured, pictured, more)]
    assert await _quiet(bodies, monkeypatch) == [False, False, False]


async def test_a_line_searched_quiet_stays_quiet_and_its_new_image_is_counted(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    body = json.loads((AGENT / "claude-code-turn1.json").read_text())["body"]
    body = {**body, "model": "m"}
    reply = {"role": "assistant", "content": [{"type": "text", "text": "Looking."}]}
    go = {"role": "user", "content": [{"type": "text", "text": "go"}]}
    grown = [*body["messages"], reply, go]
    pictured = [*grown, reply, {"role": "user", "content": [IMAGE]}]
    bodies = [{**body, "messages": m} for m in (body["messages"], grown, grown, pictured)]
    assert await _quiet(bodies, monkeypatch) == [True, True, True, False]


async def test_an_image_where_the_lines_last_request_had_text_is_counted(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # A fork (a rewind, an edited last turn): only the messages both repeat were searched.
    body = json.loads((AGENT / "claude-code-turn1.json").read_text())["body"]
    body = {**body, "model": "m"}
    reply = {"role": "assistant", "content": [{"type": "text", "text": "Looking."}]}
    said = {"role": "user", "content": [{"type": "text", "text": "go on " * 200}]}
    shown = {"role": "user", "content": [IMAGE]}
    turns = (said, said, shown)  # (a line's first request is not laid out: written out)
    bodies = [{**body, "messages": [*body["messages"], reply, turn]} for turn in turns]
    assert await _quiet(bodies, monkeypatch) == [True, True, False]
