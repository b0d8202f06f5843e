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
import openai
import orjson
import pytest

from proxy.core.offload import unknown_ref
from proxy.server.state import COMPACTOR
from proxy.testing.standin import StandInOptions
from tests.server.compaction_checks import text_of
from tests.server.conftest import SMALL_WINDOW, MakeProxy
from tests.server.test_compaction_e2e import synthetic_history
from tests.server.test_metrics import scrape

MakeStandIn = Callable[[StandInOptions], Awaitable[Any]]
FORMATS = ("messages", "chat", "responses")
PURPOSE = "x-compaction-proxy-purpose"


def _stub_of(body: bytes) -> str:
    """The first stub's text in a recorded upstream request."""
    for message in orjson.loads(body)["messages"]:
        for block in message["content"] if isinstance(message["content"], list) else []:
            inner = block.get("content") if isinstance(block, dict) else None
            inner = text_of(inner) if isinstance(inner, str | list) else None
            if inner is not None and "read_result(ref=" in inner:
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


def _item(message: dict[str, Any]) -> dict[str, Any]:
    """A {role, content} message as a Responses input item."""
    kind = "output_text" if message["role"] == "assistant" else "input_text"
    content = [{"type": kind, "text": message["content"]}]
    return {"type": "message", "role": message["role"], "content": content}


def _turn(marker: str, words: int = 220) -> list[dict[str, Any]]:
    """One turn of a line: the model's answer and the user's next message, each holding
    the turn's marker (so any text upstream says which line it came from)."""
    said = " ".join(f"{marker.lower()}a{i}" for i in range(words))
    asked = " ".join(f"{marker.lower()}u{i}" for i in range(words))
    return [
        {"role": "assistant", "content": f"Answer {marker}: {said}"},
        {"role": "user", "content": f"Task {marker}: {asked}"},
    ]


class Lines:
    """Lines of one conversation sent through the proxy, one request at a time, with
    what went upstream for each request (the background work settled after each), in
    one of the three formats (messages are given as Messages/Chat {role, content})."""

    def __init__(self, proxy: Any, standin: Any, conversation: str, fmt: str = "messages"):
        self.proxy, self.standin, self.fmt = proxy, standin, fmt
        self.client = anthropic.AsyncAnthropic(
            base_url=proxy.url, api_key="sk-lines", max_retries=0
        )
        self.openai = openai.AsyncOpenAI(
            base_url=proxy.url + "/v1", api_key="sk-lines", max_retries=0
        )
        self.headers = {"x-stand-in": '{"text": "ok"}', "x-conversation-id": conversation}
        self.sent: dict[str, list[bytes]] = {}  # line -> its upstream requests' bodies
        self.strategies: dict[str, list[str]] = {}

    async def send(self, line: str, messages: list[dict[str, Any]]) -> None:
        compactor = self.proxy.app[COMPACTOR]
        await compactor.settled()
        before = len(self.standin.recorded)
        raw: Any
        if self.fmt == "messages":
            raw = await self.client.messages.with_raw_response.create(
                model="claude-test-1", max_tokens=64, messages=messages,
                extra_headers=self.headers,
            )  # fmt: skip
        elif self.fmt == "chat":
            raw = await self.openai.chat.completions.with_raw_response.create(
                model="gpt-test-1", max_completion_tokens=64, messages=messages,
                extra_headers=self.headers,
            )  # fmt: skip
        else:
            items = [_item(m) for m in messages]
            raw = await self.openai.responses.with_raw_response.create(
                model="gpt-test-1", max_output_tokens=64, input=items, store=False,
                extra_headers=self.headers,
            )  # fmt: skip
        await compactor.settled()
        mine = [r for r in self.standin.recorded[before:] if not r.headers.get(PURPOSE)]
        assert len(mine) == 1
        self.sent.setdefault(line, []).append(mine[0].body)
        self.strategies.setdefault(line, []).append(
            raw.headers.get("x-compaction-strategy", "untouched")
        )

    async def close(self) -> None:
        await self.client.close()
        await self.openai.close()

    def summary_calls(self, since: int = 0) -> list[Any]:
        return [r for r in self.standin.recorded[since:] if r.headers.get(PURPOSE) == "summary"]


@pytest.mark.parametrize("fmt", FORMATS)
async def test_a_rewind_never_carries_the_abandoned_turn_into_the_new_line(
    make_standin: MakeStandIn, make_compacting_proxy: MakeProxy, fmt: str
) -> None:
    """Finding 1: a summary made ahead, in place, on the turn before a rewind saw that
    turn (the stand-in's summariser notes everything it is shown, the newest turn
    included). The new line shares the folded turns, not the abandoned one: it must
    never get that summary, nor any text of the abandoned turn."""
    standin = await make_standin(StandInOptions(windows={"*": SMALL_WINDOW}, max_recorded=None))
    proxy = await make_compacting_proxy(standin.url, **{"upstream.openai_url": standin.url})
    lines = Lines(proxy, standin, uuid.uuid4().hex, fmt)
    history: list[dict[str, Any]] = [{"role": "user", "content": "Start S00."}]
    t = 0
    while not lines.summary_calls():  # until a summary is made ahead
        t += 1
        assert t < 40, "no summary was ever made ahead"
        history += _turn(f"S{t:02d}")
        await lines.send("shared", history)
    ahead = lines.summary_calls()[0].body
    assert f"S{t:02d}".encode() in ahead, "the summariser was not shown the newest turn"
    assert "summary" not in lines.strategies["shared"][-1], "folded before the rewind"

    # The user edits the newest message and goes on: a new line, sharing all but it.
    rewound = [*history[:-1], {"role": "user", "content": "Task B: something else."}]
    for k in range(12):
        rewound += _turn(f"B{k:02d}")
        await lines.send("new", rewound)
    assert any("summary" in s for s in lines.strategies["new"]), "the new line never folded"
    abandoned = f"s{t:02d}u".encode()  # the abandoned message's words, in any form
    for body in lines.sent["new"]:
        assert abandoned not in body
    await lines.close()


async def _alternate(lines: Lines, fork: int, steps: int, only: str | None = None) -> None:
    """Two lines sharing `fork` turns, then taking turns (only one of them: `only`)."""
    shared: list[dict[str, Any]] = [{"role": "user", "content": "Start."}]
    for t in range(fork):
        shared += _turn(f"S{t:02d}")
    histories = {"A": list(shared), "B": list(shared)}
    for step in range(steps):
        for name in ("A", "B"):
            histories[name] += _turn(f"{name}{step:02d}")
            if only in (None, name):
                await lines.send(name, histories[name])


@pytest.mark.parametrize(("fmt", "fork"), [("messages", 5), ("messages", 8), ("chat", 8),
                                           ("responses", 8)])  # fmt: skip
async def test_two_lines_sharing_a_prefix_each_keep_their_own(
    make_standin: MakeStandIn, make_compacting_proxy: MakeProxy, fmt: str, fork: int
) -> None:
    """Finding 2: two lines that share their first turns, then alternate, in one
    conversation. Each must go upstream exactly as it would alone (its own prefix,
    changed only at its own crossings, its own summaries), and neither may ever carry
    the other's text."""
    standin = await make_standin(StandInOptions(windows={"*": SMALL_WINDOW}, max_recorded=None))
    proxy = await make_compacting_proxy(standin.url, **{"upstream.openai_url": standin.url})
    together = Lines(proxy, standin, uuid.uuid4().hex, fmt)
    await _alternate(together, fork, 11)
    calls_together = len(together.summary_calls())
    alone: dict[str, Lines] = {}
    calls_alone = 0
    for name in ("A", "B"):
        start = len(standin.recorded)
        alone[name] = Lines(proxy, standin, uuid.uuid4().hex, fmt)
        await _alternate(alone[name], fork, 11, only=name)
        calls_alone += len(alone[name].summary_calls(start))
    for name, other in (("A", "B"), ("B", "A")):
        assert any("summary" in s for s in together.strategies[name]), "no fold: tested nothing"
        for body in together.sent[name]:
            assert f"answer {other}".encode() not in body.lower()
            assert f" {other.lower()}0".encode() not in body  # the other line's words
        assert together.strategies[name] == alone[name].strategies[name]
        assert together.sent[name] == alone[name].sent[name]
    assert calls_together == calls_alone
    for lines in (together, *alone.values()):
        await lines.close()


async def test_lines_beyond_the_bound_evict_the_least_recently_used(
    make_standin: MakeStandIn, make_compacting_proxy: MakeProxy
) -> None:
    """With store.max_lines = 2, a third line of one first message evicts the least
    recently used one, which crosses again at its next request; the metrics count the
    lines found and the checkpoints evicted."""
    standin = await make_standin(StandInOptions(windows={"*": SMALL_WINDOW}, max_recorded=None))
    proxy = await make_compacting_proxy(standin.url, **{"store.max_lines": 2})
    lines = Lines(proxy, standin, uuid.uuid4().hex)
    histories = {}
    for name in ("A", "B", "C"):
        history = synthetic_history(12)
        for message in history[2::2]:
            message["content"][0]["content"] = f"{name} " + message["content"][0]["content"]
        histories[name] = history
    more = [{"role": "assistant", "content": "Read them."}, {"role": "user", "content": "Go on."}]
    for name in ("A", "B"):
        await lines.send(name, histories[name])
    await lines.send("A", [*histories["A"], *more])  # A is now the most recent: B goes
    await lines.send("C", histories["C"])
    await lines.send("A", [*histories["A"], *more, *more])
    await lines.send("B", [*histories["B"], *more])
    assert lines.strategies["A"] == ["offload", "checkpoint", "checkpoint"]
    assert lines.strategies["B"] == ["offload", "offload"]  # evicted: it crossed again
    assert lines.strategies["C"] == ["offload"]
    samples = await scrape(proxy)
    assert samples[("compaction_proxy_checkpoints_evicted_total", ())] == 2  # B, then C
    assert samples[("compaction_proxy_conversation_lines_count", ())] == 6
    assert samples[("compaction_proxy_conversation_lines_sum", ())] == 0 + 1 + 2 + 2 + 2 + 2
    await lines.close()
