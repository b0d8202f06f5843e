"""A hostile upstream cannot take a replica down (issue 21, finding 5).

One `serve` process (keys off, small windows) in front of an upstream that answers with
far more than the proxy reads: a 48 MiB event line in a stream, a 64 MiB answer to a
summariser call, a 64 MiB answer to a read_result round. With
`upstream.max_line_bytes` and `upstream.max_answer_bytes` at 4 MiB, each is refused
cleanly (an error event ending the stream, a pack instead of the summary, a 502) and
the replica's peak resident memory (VmHWM) grows by a small multiple of the cap; it grew
by hundreds of MiB (and stalled the loop for a second) when answers were read unbounded.
"""

from __future__ import annotations

import re
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import anthropic
import orjson
import pytest
from aiohttp import web

from tests.fleet.test_fleet import (
    PURPOSE,
    REQUEST,
    TOOLS,
    Replica,
    start_replicas,
    text_history,
    tool_history,
)
from tests.fleet.upstreams import COUNTER, running
from tests.plugins.redis import delete_keys

MiB = 1024 * 1024
CAP = 4 * MiB
HUGE = 64 * MiB
LINE = 48 * MiB
# What the replica may grow by while refusing all of it: a few caps, plus the slack of
# a Python process doing ordinary work (allocator arenas, the answers it does give).
BOUND = 4 * CAP + 24 * MiB
_REF = re.compile(rb'ref=\\"([^\\"]+)\\"')
PIECE = b"x" * MiB


def _message(content: list[dict[str, Any]], body: dict[str, Any], stop: str = "end_turn") -> bytes:
    """An answer reporting the input the stand-in's counter gives (as the real API's
    would be close to it: calibration learns from it)."""
    return orjson.dumps(
        {
            "id": "msg_hostile",
            "type": "message",
            "role": "assistant",
            "model": "claude-haiku-4-5",
            "content": content,
            "stop_reason": stop,
            "stop_sequence": None,
            "usage": {"input_tokens": COUNTER.count_request(body), "output_tokens": 5},
        }
    )


async def _huge_json(request: web.Request) -> web.StreamResponse:
    """A JSON answer of HUGE bytes, sent chunked (no Content-Length to refuse it by)."""
    out = web.StreamResponse(headers={"Content-Type": "application/json"})
    await out.prepare(request)
    try:
        await out.write(
            b'{"type": "message", "role": "assistant", "content": [{"type": "text", "text": "'
        )
        for _ in range(HUGE // MiB):
            await out.write(PIECE)
        await out.write(b'"}], "usage": {"input_tokens": 1, "output_tokens": 1}}')
        await out.write_eof()
    except (ConnectionError, RuntimeError):
        pass  # the proxy stopped reading: what it should do
    return out


async def _huge_line(request: web.Request) -> web.StreamResponse:
    """A stream whose first event is one LINE-byte data line (a message_start, which the
    usage meter reads)."""
    out = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
    await out.prepare(request)
    try:
        await out.write(
            b'event: message_start\ndata: {"type": "message_start", "message": {"id": "'
        )
        for _ in range(LINE // MiB):
            await out.write(PIECE)
        await out.write(b'"}}\n\n')
        await out.write(b'event: message_stop\ndata: {"type": "message_stop"}\n\n')
        await out.write_eof()
    except (ConnectionError, RuntimeError):
        pass
    return out


async def messages(request: web.Request) -> web.StreamResponse:
    raw = await request.read()
    body = orjson.loads(raw)
    if request.headers.get(PURPOSE) == "summary":
        return await _huge_json(request)
    if body.get("stream"):
        return await _huge_line(request)
    last = body["messages"][-1]["content"]
    answered_read = isinstance(last, list) and any(
        block.get("tool_use_id") == "toolu_read" for block in last if isinstance(block, dict)
    )
    if answered_read:
        return await _huge_json(request)  # the read_result round's answer
    names = [tool.get("name") for tool in body.get("tools", [])]
    found = _REF.search(raw)
    if "read_result" in names and found is not None:
        call = {
            "type": "tool_use",
            "id": "toolu_read",
            "name": "read_result",
            "input": {"ref": found.group(1).decode(), "start": 0, "length": 100},
        }
        return web.Response(
            body=_message([call], body, "tool_use"), content_type="application/json"
        )
    return web.Response(
        body=_message([{"type": "text", "text": "ok"}], body), content_type="application/json"
    )


def hostile_app() -> web.Application:
    app = web.Application(client_max_size=16 * MiB)
    app.router.add_post("/v1/messages", messages)
    return app


@dataclass
class Rig:
    replica: Replica

    @property
    def url(self) -> str:
        return self.replica.url

    def peak(self) -> int:
        """The replica's peak resident memory so far (VmHWM), in bytes."""
        status = Path(f"/proc/{self.replica.process.pid}/status").read_text()
        found = re.search(r"VmHWM:\s+(\d+) kB", status)
        assert found is not None
        return int(found.group(1)) * 1024


@pytest.fixture
def rig(tmp_path_factory: pytest.TempPathFactory, redis_url: str) -> Iterator[Rig]:
    """A replica of its own for each test: its peak memory says what that test did."""
    prefix = f"cpbound:{uuid.uuid4().hex[:10]}:"
    extra = f"[upstream]\nmax_line_bytes = {CAP}\nmax_answer_bytes = {CAP}\n"
    with running(hostile_app) as upstream:
        (replica,) = start_replicas(
            tmp_path_factory.mktemp("bounded"),
            1,
            upstream.url,
            redis_url,
            prefix,
            extra,
            auth='[auth]\nkeys = "off"\n',
        )
        try:
            rig = Rig(replica)
            _client(rig).messages.create(**REQUEST)  # warm: the tokenizer, pools, Redis
            yield rig
        finally:
            replica.stop()
            delete_keys(redis_url, prefix)


def _client(rig: Rig) -> anthropic.Anthropic:
    return anthropic.Anthropic(base_url=rig.url, api_key="sk-own", max_retries=0, timeout=120)


def test_an_event_line_over_the_cap_ends_the_stream_cleanly(rig: Rig) -> None:
    before = rig.peak()
    with (
        _client(rig) as client,
        pytest.raises(anthropic.APIStatusError) as raised,
        client.messages.stream(**REQUEST) as stream,
    ):
        for _ in stream:
            pass
    assert "max_line_bytes" in str(raised.value)  # the proxy's error event, not a cut
    grown = rig.peak() - before
    print(f"peak grew {grown / MiB:.1f} MiB")
    assert grown < BOUND, grown // MiB


def test_a_summary_answer_over_the_cap_is_not_read(rig: Rig) -> None:
    before = rig.peak()
    body = {**REQUEST, "messages": text_history(24)}  # over the trigger: a fold
    headers = {"x-conversation-id": f"bounded-{uuid.uuid4().hex}"}
    with _client(rig) as client:
        answer = client.messages.with_raw_response.create(**body, extra_headers=headers)
    assert answer.status_code == 200  # packed instead: the summary never came
    assert "summary" not in answer.headers.get("x-compaction-strategy", "")
    grown = rig.peak() - before
    print(f"peak grew {grown / MiB:.1f} MiB")
    assert grown < BOUND, grown // MiB


def test_a_read_round_answer_over_the_cap_is_a_502(rig: Rig) -> None:
    before = rig.peak()
    body = {**REQUEST, "messages": tool_history(12), "tools": TOOLS}
    headers = {"x-conversation-id": f"bounded-{uuid.uuid4().hex}"}
    with _client(rig) as client, pytest.raises(anthropic.APIStatusError) as raised:
        client.messages.create(**body, extra_headers=headers)
    assert raised.value.status_code == 502
    assert "max_answer_bytes" in str(raised.value)
    grown = rig.peak() - before
    print(f"peak grew {grown / MiB:.1f} MiB")
    assert grown < BOUND, grown // MiB
