"""Lines of conversations, driven by a Hypothesis state machine (issue 22): agents that
branch, rewind, retry, run in parallel and drop their own old turns, over Anthropic
Messages, OpenAI Chat and Responses, through a real proxy (its own thread and loop) to
the stand-in, with a unique marker `<LnTm>` in every message.

Requests go streamed or not. Invariants, after every request:
- everything that went upstream for it (the agent's request and its read_result rounds,
  the summariser calls it made or had made ahead) holds only markers of the messages the
  client itself sent in that request: nothing of another line, in any form (verbatim, a
  stub, a summary, a read answer, a transcript);
- a request that reused its line's checkpoint (no crossing) begins with exactly what the
  line's previous request began with: a line's prefix changes only at its own crossings;
- identical requests sent at once go upstream as identical bodies.
"""

from __future__ import annotations

import concurrent.futures
import dataclasses
import re
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import anthropic
import openai
import orjson
import pytest
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    RuleBasedStateMachine,
    initialize,
    invariant,
    rule,
    run_state_machine_as_test,
)

from proxy.core.offload import ref_for
from proxy.server.state import COMPACTOR
from proxy.testing.standin import StandInOptions
from tests.plugins.standin import RunningStandIn
from tests.server.conftest import SMALL_WINDOW, ThreadedProxy, proxy_settings

PURPOSE = "x-compaction-proxy-purpose"
MARKER = re.compile(rb"<L(\d+)T(\d+)>")
FORMATS = ("messages", "chat", "responses")
# Small thresholds, so a line folds within a few turns: offload from 1,500 tokens, fold
# at 3,000 down to 1,500, the next fold's summary made ahead from 2,700.
POLICY: dict[str, Any] = {
    "match": "*",
    "window": SMALL_WINDOW,
    "trigger": 3_000,
    "target": 1_500,
    "offload_trigger": 1_500,
    "keep_last": 2,
    "keep_results": 1,
    "offload_threshold": 150,
    "stub_head_chars": 120,
    "summary_max_tokens": 600,
}
TOOL_SCHEMA = {"type": "object", "properties": {"cmd": {"type": "string"}}}


def marked(marker: str, words: int, kind: str) -> str:
    filler = " ".join(f"{kind}{i}" for i in range(words))
    return f"{marker} {filler} {marker}"


def first_message(fmt: str, marker: str) -> dict[str, Any]:
    text = f"Start {marker}: fix the build."
    if fmt == "responses":
        return {
            "type": "message",
            "role": "user",
            "content": [{"type": "input_text", "text": text}],
        }
    return {"role": "user", "content": text}


def turn(fmt: str, marker: str, paste: str = "") -> list[dict[str, Any]]:
    """One turn: a tool call, its (offloadable) result, and a user note (which may hold
    a ref the client typed)."""
    call_id = f"call_{marker[1:-1]}"
    result, note = marked(marker, 200, "log"), marked(marker, 50, "note")
    if paste:
        note = f'See read_result(ref="{paste}", start=0, length=300) from before. {note}'

    said = f"Step {marker}."
    if fmt == "messages":
        return [
            {"role": "assistant", "content": [
                {"type": "text", "text": said},
                {"type": "tool_use", "id": f"toolu_{marker[1:-1]}", "name": "Bash",
                 "input": {"cmd": marker}},
            ]},
            {"role": "user", "content": [
                {"type": "tool_result", "tool_use_id": f"toolu_{marker[1:-1]}", "content": result},
                {"type": "text", "text": note},
            ]},
        ]  # fmt: skip
    if fmt == "chat":
        return [
            {"role": "assistant", "content": said, "tool_calls": [
                {"id": call_id, "type": "function",
                 "function": {"name": "Bash", "arguments": orjson.dumps({"cmd": marker}).decode()}},
            ]},
            {"role": "tool", "tool_call_id": call_id, "content": result},
            {"role": "user", "content": note},
        ]  # fmt: skip
    return [
        {"type": "function_call", "call_id": call_id, "name": "Bash",
         "arguments": orjson.dumps({"cmd": marker}).decode()},
        {"type": "function_call_output", "call_id": call_id, "output": result},
        {"type": "message", "role": "user", "content": [{"type": "input_text", "text": note}]},
    ]  # fmt: skip


def result_of(fmt: str, turn: list[dict[str, Any]]) -> str:
    """The text of a turn's tool result (what its ref is the hash of)."""
    if fmt == "messages":
        return str(turn[1]["content"][0]["content"])
    return str(turn[1]["content" if fmt == "chat" else "output"])


@dataclass
class Line:
    name: int
    turns: list[list[dict[str, Any]]]
    first: dict[str, Any]
    last_sent: list[Any] | None = None  # the messages its previous request went up with
    pasted: str | None = None  # a ref of another line the client typed: the model reads it
    last_tokens: tuple[int, int] | None = None  # its previous rewrite: tokens before, after

    def history(self) -> list[dict[str, Any]]:
        return [self.first, *(m for t in self.turns for m in t)]


@dataclass
class Sent:
    strategy: str
    first_round: list[Any]
    bodies: list[bytes] = field(default_factory=list)


class Client:
    """One format's requests through the proxy, answered by the stand-in."""

    def __init__(self, fmt: str, proxy_url: str, conversation: str) -> None:
        self.fmt = fmt
        self.headers = {"x-conversation-id": conversation}
        self.tokens = (0, 0)  # the last answer's x-compaction-tokens-before and -after
        if fmt == "messages":
            self.anthropic = anthropic.Anthropic(
                base_url=proxy_url, api_key="sk-machine", max_retries=0
            )
        else:
            self.openai = openai.OpenAI(
                base_url=proxy_url + "/v1", api_key="sk-machine", max_retries=0
            )

    def send(
        self,
        history: list[dict[str, Any]],
        reads: bool,
        stream: bool = False,
        read_ref: str | None = None,
    ) -> str:
        """Send it (streamed or not, read to its end); the answer's x-compaction-strategy
        and -reason ("offload/"). `reads`: the model reads the history's stubs;
        `read_ref`: it reads that ref, round after round."""
        wanted: dict[str, Any] = {"text": "ok", "read_result": reads}
        if read_ref is not None:
            read = {"ref": read_ref, "start": 0, "length": 300}
            wanted = {"text": "ok", "tool": {"name": "read_result", "input": read}}
        script = orjson.dumps(wanted).decode()
        request: dict[str, Any] = {"extra_headers": {**self.headers, "x-stand-in": script}}
        if stream:
            request["stream"] = True
        if self.fmt == "messages":
            tools = [{"name": "Bash", "description": "Run.", "input_schema": TOOL_SCHEMA}]
            request.update(model="claude-test-1", max_tokens=64, messages=history, tools=tools)
            api: Any = self.anthropic.messages
        elif self.fmt == "chat":
            function = {"name": "Bash", "description": "Run.", "parameters": TOOL_SCHEMA}
            tools = [{"type": "function", "function": function}]
            request.update(
                model="gpt-test-1", max_completion_tokens=64, messages=history, tools=tools
            )
            api = self.openai.chat.completions
        else:
            tool = {"type": "function", "name": "Bash", "description": "Run.",
                    "parameters": TOOL_SCHEMA, "strict": False}  # fmt: skip
            request.update(
                model="gpt-test-1", max_output_tokens=64, input=history, tools=[tool], store=False
            )
            api = self.openai.responses
        with api.with_streaming_response.create(**request) as raw:
            assert raw.status_code == 200
            headers = raw.headers
            body = b"".join(raw.iter_bytes())
        assert body and (not stream or b"data:" in body)
        strategy = headers.get("x-compaction-strategy", "untouched")
        self.tokens = (
            int(headers.get("x-compaction-tokens-before", "0")),
            int(headers.get("x-compaction-tokens-after", "0")),
        )
        return f"{strategy}/{headers.get('x-compaction-reason', '')}"

    def first_round(self, body: bytes) -> list[Any]:
        sent = orjson.loads(body)
        return list(sent["input"] if self.fmt == "responses" else sent["messages"])


def lines_machine(
    proxy: ThreadedProxy, standin: RunningStandIn, fmt: str, seen: list[str]
) -> type[RuleBasedStateMachine]:
    def settle() -> None:
        """Wait for the proxy's background work (summaries made ahead, line marks)."""
        proxy.call(proxy.running.app[COMPACTOR].settled())

    class Lines(RuleBasedStateMachine):
        def __init__(self) -> None:
            super().__init__()
            self.lines: list[Line] = []
            self.next_name = 0
            self.turns = 0
            self.client = Client(fmt, proxy.running.url, uuid.uuid4().hex)
            self.fmt = fmt

        def _marker(self, line: int) -> str:
            self.turns += 1
            return f"<L{line}T{self.turns}>"

        def _new_line(self, turns: list[list[dict[str, Any]]], first: dict[str, Any]) -> Line:
            name = self.next_name
            self.next_name += 1
            line = Line(name, [*turns, turn(self.fmt, self._marker(name))], first)
            self.lines.append(line)
            return line

        def _send(self, line: Line, reads: bool = True, stream: bool = False) -> Sent:
            history = line.history()
            allowed = set(MARKER.findall(orjson.dumps(history)))
            settle()
            before = len(standin.recorded)
            strategy = self.client.send(history, reads, stream, line.pasted if reads else None)
            settle()
            made = standin.recorded[before:]
            for r in made:  # the agent's rounds, summaries made for it or ahead
                found = set(MARKER.findall(r.body))
                assert found <= allowed, (line.name, r.headers.get(PURPOSE), found - allowed)
            agent = [r for r in made if not r.headers.get(PURPOSE)]
            assert agent, "nothing went upstream"
            first = self.client.first_round(agent[0].body)
            before, after = self.client.tokens
            if "summary" in strategy and line.last_tokens is not None:
                # A fold at a line's own crossing: its history, as the line's previous
                # rewrite left it plus what it grew since, went over the trigger (not a
                # fold because another line's crossing took its checkpoint away).
                was_before, was_after = line.last_tokens
                grown = was_after + (before - was_before)
                assert grown > 0.9 * POLICY["trigger"], (line.name, line.last_tokens, before)
            line.last_tokens = (before, after) if after else None
            if strategy.startswith("checkpoint/") and line.last_sent is not None:
                # No crossing: the line's prefix is what it was.
                assert first[: len(line.last_sent)] == line.last_sent, line.name
            line.last_sent = first
            seen.append(strategy)
            return Sent(strategy, first, [r.body for r in agent])

        @initialize()
        def start(self) -> None:
            self._send(self._new_line([], first_message(fmt, "<L0T0>")))

        def _pick(self, pick: int) -> Line:
            return self.lines[pick % len(self.lines)]

        @rule(pick=st.integers(0, 99), times=st.integers(1, 4), stream=st.booleans())
        def grow(self, pick: int, times: int, stream: bool) -> None:
            line = self._pick(pick)
            for _ in range(times):
                line.turns.append(turn(self.fmt, self._marker(line.name)))
                self._send(line, stream=stream)

        @rule(pick=st.integers(0, 99), cut=st.integers(0, 99))
        def branch(self, pick: int, cut: int) -> None:
            """A fork or a rewind: the history up to a turn, then a turn of its own."""
            parent = self._pick(pick)
            n = len(parent.turns)
            # Mostly a rewind of the newest turns (an edit of the last message), else a
            # fork anywhere.
            kept = parent.turns[: max(0, n - 1 - cut % 3) if cut % 4 else cut % (n + 1)]
            self._send(self._new_line(list(kept), parent.first))

        @rule(pick=st.integers(0, 99), stream=st.booleans())
        def retry(self, pick: int, stream: bool) -> None:
            self._send(self._pick(pick), stream=stream)

        @rule(pick=st.integers(0, 99))
        def parallel(self, pick: int) -> None:
            """Three identical requests at once (a fan-out, a client's retries)."""
            line = self._pick(pick)
            line.turns.append(turn(self.fmt, self._marker(line.name)))
            history = line.history()
            allowed = set(MARKER.findall(orjson.dumps(history)))
            settle()
            before = len(standin.recorded)
            client = self.client
            with concurrent.futures.ThreadPoolExecutor(3) as pool:
                list(pool.map(lambda _: client.send(history, False), range(3)))
            settle()
            made = standin.recorded[before:]
            for r in made:
                assert set(MARKER.findall(r.body)) <= allowed
            bodies = {r.body for r in made if not r.headers.get(PURPOSE)}
            assert len(bodies) == 1, "identical requests went up differently"
            asked = [r.body for r in made if r.headers.get(PURPOSE) == "summary"]
            assert len(asked) == len(set(asked)), "one summary was paid for twice"
            line.last_sent = line.last_tokens = None  # which of them crossed is not known

        @rule(pick=st.integers(0, 99), other=st.integers(0, 99))
        def paste_a_foreign_ref(self, pick: int, other: int) -> None:
            """The client types the ref of another line's result (its stub copied) into a
            new message; from then on the model reads that ref, also once the message is
            folded and the summary quotes it. It must read as missing: its text (the
            other line's markers) never goes upstream."""
            line, source = self._pick(pick), self._pick(other)
            own = set(MARKER.findall(orjson.dumps(line.history())))
            foreign = [t for t in source.turns if not set(MARKER.findall(orjson.dumps(t))) <= own]
            if not foreign:
                return
            # The oldest: most likely offloaded (stored) by now.
            ref = ref_for(result_of(self.fmt, foreign[0]))
            line.turns.append(turn(self.fmt, self._marker(line.name), paste=ref))
            line.pasted = ref
            self._send(line)

        @rule(pick=st.integers(0, 99))
        def drop_own_turns(self, pick: int) -> None:
            """The client drops its own oldest turn and goes on: a line of its own."""
            parent = self._pick(pick)
            if len(parent.turns) >= 2:
                self._send(self._new_line(parent.turns[1:], parent.first))

        @invariant()
        def bounded(self) -> None:
            assert len(self.lines) <= 64

    return Lines


@pytest.mark.parametrize("fmt", FORMATS)
def test_lines_never_mix(
    fmt: str,
    make_standin_thread: Callable[[StandInOptions], RunningStandIn],
    redis_url: str,
    redis_key_prefix: str,
) -> None:
    standin = make_standin_thread(StandInOptions(windows={"*": SMALL_WINDOW}, max_recorded=None))
    base = proxy_settings(
        standin.url,
        redis_url,
        # Lines enough that none is evicted: what is checked is that lines never meet
        # (eviction beyond the bound: test_provenance.py).
        **{
            "store.key_prefix": redis_key_prefix,
            "upstream.openai_url": standin.url,
            "store.max_lines": 64,
        },
    )
    proxy = ThreadedProxy(dataclasses.replace(base, policies=(POLICY,)))
    try:
        run = settings(
            max_examples=12,
            stateful_step_count=25,
            deadline=None,
            derandomize=True,
            database=None,
            suppress_health_check=[HealthCheck.too_slow],
        )
        seen: list[str] = []  # every request's strategy
        run_state_machine_as_test(lines_machine(proxy, standin, fmt, seen), settings=run)
        # It tested something: lines folded, with summaries, and offloaded.
        assert any("summary" in s for s in seen) and any("offload" in s for s in seen), seen
        assert any(r.headers.get(PURPOSE) == "summary" for r in standin.recorded)
        # ... and the model read offloaded results (the tool, then a call of it).
        assert any(r.body.count(b'"read_result"') >= 2 for r in standin.recorded)
        # ... and read a ref the client typed: as missing.
        assert any(b"No offloaded result 'r_" in r.body for r in standin.recorded)
    finally:
        proxy.stop()
