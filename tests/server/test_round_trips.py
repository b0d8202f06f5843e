"""Redis round trips per request, counted on the wire (issue 17): a request that reuses
its conversation's checkpoint costs one (the load), a crossing two (the load, then every
write in one pipelined call)."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from typing import Any

import anthropic
import pytest
from redis.asyncio.connection import AbstractConnection

from proxy.server.state import COMPACTOR
from proxy.testing.standin import StandInOptions
from tests.plugins.standin import RunningStandIn
from tests.server.conftest import SMALL_WINDOW, MakeProxy
from tests.server.test_compaction_e2e import synthetic_history


@pytest.fixture
def sent(monkeypatch: pytest.MonkeyPatch) -> Iterator[list[bytes]]:
    """Every request any Redis connection of this process sends (a pipeline or a
    MULTI/EXEC goes out as one): one entry per round trip, its packed bytes."""
    seen: list[bytes] = []
    original = AbstractConnection.send_packed_command

    async def counting(self: Any, command: Any, check_health: bool = True) -> None:
        parts = [command] if isinstance(command, (bytes, str, memoryview)) else list(command)
        seen.append(b"".join(bytes(p) if not isinstance(p, str) else p.encode() for p in parts))
        await original(self, command, check_health)

    monkeypatch.setattr(AbstractConnection, "send_packed_command", counting)
    yield seen


# What a conversation's compaction reads and writes (calibration samples, written after
# the answer, and connections opening are another matter).
CONVERSATION_KEYS = (b":lines:", b":summary:", b":blob:")


def conversation_trips(seen: list[bytes]) -> list[bytes]:
    return [s for s in seen if any(kind in s for kind in CONVERSATION_KEYS)]


async def test_a_checkpoint_reuse_is_one_round_trip_and_a_crossing_two(
    make_standin: Any, make_compacting_proxy: MakeProxy, sent: list[bytes]
) -> None:
    standin: RunningStandIn = await make_standin(
        StandInOptions(windows={"*": SMALL_WINDOW}, max_recorded=None)
    )
    proxy = await make_compacting_proxy(standin.url)
    compactor = proxy.app[COMPACTOR]
    client = anthropic.AsyncAnthropic(base_url=proxy.url, api_key="sk-trips", max_retries=0)
    headers = {"x-stand-in": '{"text": "ok"}', "x-conversation-id": uuid.uuid4().hex}
    history = synthetic_history(12)

    async def send(messages: list[dict[str, Any]]) -> tuple[str | None, list[bytes]]:
        await compactor.settled()
        before = len(sent)
        raw = await client.messages.with_raw_response.create(
            model="claude-test-1", max_tokens=64, messages=messages, extra_headers=headers
        )
        await compactor.settled()
        return raw.headers.get("x-compaction-strategy"), conversation_trips(sent[before:])

    strategy, trips = await send(history)
    assert strategy == "offload"
    assert len(trips) == 2, trips
    assert trips[0].count(b"GET") >= 1 and b"SET" not in trips[0]  # the load
    assert trips[1].count(b"SET") >= 2  # blobs and checkpoint, one call

    grown = [*history, {"role": "assistant", "content": "Read them."},
             {"role": "user", "content": "Go on."}]  # fmt: skip
    strategy, trips = await send(grown)
    assert strategy == "checkpoint"
    assert len(trips) == 1, trips
    await client.close()


async def test_a_line_taken_again_costs_one_round_trip_and_one_mark(
    make_standin: Any, make_compacting_proxy: MakeProxy, sent: list[bytes]
) -> None:
    """Two lines of one conversation (a fork after the first message): each crossing is
    two round trips, each reuse one; a reuse of the line that was not the most recent
    one adds one write in the background (its mark as most recently used)."""
    standin: RunningStandIn = await make_standin(
        StandInOptions(windows={"*": SMALL_WINDOW}, max_recorded=None)
    )
    proxy = await make_compacting_proxy(standin.url)
    compactor = proxy.app[COMPACTOR]
    client = anthropic.AsyncAnthropic(base_url=proxy.url, api_key="sk-trips", max_retries=0)
    headers = {"x-stand-in": '{"text": "ok"}', "x-conversation-id": uuid.uuid4().hex}
    lines = [synthetic_history(12), synthetic_history(12)]
    for message in lines[1][2::2]:
        message["content"][0]["content"] = "B " + message["content"][0]["content"]

    async def send(messages: list[dict[str, Any]]) -> tuple[str | None, list[bytes]]:
        await compactor.settled()
        before = len(sent)
        raw = await client.messages.with_raw_response.create(
            model="claude-test-1", max_tokens=64, messages=messages, extra_headers=headers
        )
        await compactor.settled()
        return raw.headers.get("x-compaction-strategy"), conversation_trips(sent[before:])

    for history in lines:
        strategy, trips = await send(history)
        assert strategy == "offload" and len(trips) == 2, trips
    more = [{"role": "assistant", "content": "Read them."}, {"role": "user", "content": "Go on."}]
    strategy, trips = await send([*lines[0], *more])  # the first line, not the most recent
    assert strategy == "checkpoint"
    load, *marks = trips
    assert b"HGETALL" in load and b"SET" not in load
    # The mark: one script call (two the first time a Redis meets the script: NOSCRIPT).
    assert 1 <= len(marks) <= 2 and all(b"EVALSHA" in m for m in marks), trips
    strategy, trips = await send([*lines[0], *more])  # now it is the most recent
    assert strategy == "checkpoint" and len(trips) == 1, trips
    await client.close()
