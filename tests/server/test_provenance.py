"""Provenance (issue 22): everything the proxy adds to a request comes from that
request's own history. Each finding of the issue as it was found: a ref typed by the
client never opens another conversation's result, a summary made ahead on a turn that
was then rewound never reaches the new line, and two lines sharing a prefix keep their
own checkpoints. Real proxy, real Redis, the stand-in, the anthropic SDK; a unique
marker in every message says where any text upstream came from."""

from __future__ import annotations

import uuid
from collections.abc import Awaitable, Callable
from typing import Any

import anthropic
import orjson
import pytest

from proxy.core.offload import unknown_ref
from proxy.server.state import COMPACTOR
from proxy.testing.standin import StandInOptions
from tests.server.conftest import SMALL_WINDOW, MakeProxy
from tests.server.test_compaction_e2e import synthetic_history

MakeStandIn = Callable[[StandInOptions], Awaitable[Any]]
PURPOSE = "x-compaction-proxy-purpose"


def _stub_of(body: bytes) -> str:
    """The first stub's text in a recorded upstream request."""
    for message in orjson.loads(body)["messages"]:
        for block in message["content"] if isinstance(message["content"], list) else []:
            inner = block.get("content") if isinstance(block, dict) else None
            if isinstance(inner, str) and "read_result(ref=" in inner:
                return inner
    raise AssertionError("no stub in the request")


@pytest.mark.parametrize("stream", [False, True])
async def test_a_ref_the_client_typed_stays_unreadable_once_its_turn_is_folded(
    make_standin: MakeStandIn, make_compacting_proxy: MakeProxy, stream: bool
) -> None:
    """Finding 3: conversation 1 offloads a result; conversation 3 of the same key types
    that ref in an early user turn. When the turn is folded, the proxy's summary quotes
    it (the stand-in notes every message, and the line of identifiers lists it): the ref
    must still read as missing, and conversation 1's text must never go upstream in 3."""
    standin = await make_standin(StandInOptions(windows={"*": SMALL_WINDOW}, max_recorded=None))
    proxy = await make_compacting_proxy(standin.url)
    client = anthropic.AsyncAnthropic(base_url=proxy.url, api_key="sk-typed-ref", max_retries=0)
    first = {"x-stand-in": '{"text": "ok"}', "x-conversation-id": f"one-{uuid.uuid4().hex}"}
    mine = synthetic_history(12)
    for message in mine[2::2]:
        message["content"][0]["content"] = "CONV1SECRET " + message["content"][0]["content"]
    await client.messages.create(
        model="claude-test-1", max_tokens=64, messages=mine, extra_headers=first
    )
    stub = _stub_of(standin.agent_calls[-1].body)
    ref = stub.split('ref="')[1].split('"')[0]

    # Conversation 3: the same key, the ref typed in its first turn, long enough that the
    # turn is folded at once.
    theirs = synthetic_history(40)
    typed = f'Look at read_result(ref="{ref}", start=0, length=400) from my other session.'
    theirs[0] = {"role": "user", "content": [{"type": "text", "text": typed}]}
    theirs += [
        {"role": "assistant", "content": "Done with those."},
        {"role": "user", "content": "Now sum it up."},  # the pinned last user message
    ]
    # The model reads exactly that ref (a read_result call the proxy answers itself).
    reads = {"tool": {"name": "read_result", "input": {"ref": ref, "start": 0, "length": 400}}}
    third = {"x-stand-in": orjson.dumps(reads).decode(), "x-conversation-id": uuid.uuid4().hex}
    before = len(standin.recorded)
    if stream:
        async with client.messages.stream(
            model="claude-test-1", max_tokens=64, messages=theirs, extra_headers=third
        ) as events:
            answer = await events.get_final_message()
            headers = events.response.headers
    else:
        raw = await client.messages.with_raw_response.create(
            model="claude-test-1", max_tokens=64, messages=theirs, extra_headers=third
        )
        answer, headers = await raw.parse(), raw.headers
    await proxy.app[COMPACTOR].settled()
    assert "summary" in headers["x-compaction-strategy"], headers
    sent = [r for r in standin.recorded[before:] if not r.headers.get(PURPOSE)]
    assert len(sent) >= 2, "the model's read_result call was not answered by the proxy"
    folded = orjson.loads(sent[0].body)["messages"][0]["content"][0]["text"]
    assert folded.startswith("[compaction-proxy: summary of")
    assert ref in folded, "the summary did not quote the typed ref: the test tested nothing"
    read = orjson.loads(sent[1].body)["messages"][-1]["content"][0]
    assert read["is_error"] is True
    assert read["content"] == unknown_ref(ref)
    assert all(b"CONV1SECRET" not in r.body for r in standin.recorded[before:])
    assert all(b.type != "tool_use" for b in answer.content)
    await client.close()
