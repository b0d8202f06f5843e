"""The proxy's decisions for saved requests, without calling anything.

`Simulator.step(body)` runs the same compaction driver the server runs
(proxy/core/driver.py) for one request of its wire format, with an executor on dicts
instead of Redis and the upstream: the conversation's lines (checkpoints, several per
first message, proxy/core/lines.py), the stored summaries (a placeholder text of the
summary's cap in size stands in for the summariser's answer), the offloaded blobs. Steps on one
Simulator form one conversation, as the replica fleet would see it. Calibration is fixed
(factor 1.0 unless given, no sampling): the local count is taken as the real one, and
every request is counted (the server's byte-size shortcut only skips counts that could
not change the decision).

`Simulator.read_rounds(step, model)` replays a step's read_result rounds with the same
generator the server runs (proxy/core/rounds.py): `model` answers each round (a script,
or answers recorded), the slices come from the blobs the steps offloaded, and no budget
refuses a round; what the model received, round by round, is what the server would send.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any, assert_never

import orjson

from proxy.core.checkpoint import Checkpoint, Line, root_of
from proxy.core.commands import (
    Answered,
    Command,
    GetSummary,
    LoadConversation,
    Loaded,
    PreparedSummary,
    PrepareSummary,
    ReadResults,
    Reply,
    Results,
    RoundCommand,
    RoundReply,
    SaveCrossing,
    Saved,
    SendRound,
    Started,
    SummaryReply,
    ToppedUp,
    TopUp,
    TouchLine,
)
from proxy.core.counting import count_request, count_tokens
from proxy.core.driver import CompactionRequest, compaction, run
from proxy.core.exact_json import ClientJSON
from proxy.core.lines import best_line
from proxy.core.model_facts import takes_tool_search
from proxy.core.offload import ref_for
from proxy.core.outcome import Refuse, Rewrite, Untouched
from proxy.core.policy import Policy, policy_for
from proxy.core.reuse import Seen
from proxy.core.rounds import RoundsRequest, read_rounds
from proxy.core.segments import Stubbed, StubbedMemo, Summary, Verbatim
from proxy.core.strategy import Strategy
from proxy.core.tokens import TokenCounter
from proxy.core.wire_format import Dialect, WireFormat
from proxy.wire import ANTHROPIC
from proxy.wire.anthropic import searches_tools


@dataclass(frozen=True, slots=True)
class Offloaded:
    ref: str
    tool: str  # the name of the tool whose result it was
    tokens: int


@dataclass(frozen=True, slots=True)
class Summarise:
    """A summary the step needed: made (a summariser call) or reused from the store."""

    messages: int  # client messages folded into it
    summary_tokens: int  # the output cap, tokens
    reused: bool
    input_tokens: int  # the summariser call's whole input
    request: dict[str, Any] | None = None  # the summariser's request (priced with a cache)


@dataclass(slots=True)
class Step:
    body: dict[str, Any]  # what would go upstream
    policy: Policy
    kind: str  # "untouched", "rewrite" or "refuse"
    strategy: Strategy | None = None  # the rewrite's (CHECKPOINT: a frozen one reapplied)
    reason: str = ""  # why the outcome is not what the policy aimed at (outcome.REASONS)
    tokens_before: int = 0  # history, as the client sent it
    tokens_after: int = 0  # history, as sent
    fixed_tokens: int = 0  # system prompt and tools (read_result's definition included)
    offloaded: list[Offloaded] = field(default_factory=list)  # newly offloaded results
    stubs: int = 0  # offloaded results in the history sent (new and earlier)
    folded: int = 0  # client messages behind the summary
    dropped: int = 0  # client messages behind a drop note
    summary: Summarise | None = None
    made_ahead: Summarise | None = None  # a summary this request had made in the background
    pack_fallback: Rewrite | Refuse | None = None  # what a failed summariser would give
    refusal: str = ""
    tool: str | None = None  # read_result was offered under this name
    refs: frozenset[str] = frozenset()  # the refs the history sent names (all it may read)
    encoded: bytes = b""  # a rewrite's bytes as the driver encoded them for upstream


# A round as the model receives it (parsed) -> its whole answer, in the step's format.
Model = Callable[[dict[str, Any]], dict[str, Any]]


@dataclass(frozen=True, slots=True)
class ReadReplay:
    """A step's read_result rounds replayed against a model."""

    sent: list[dict[str, Any]]  # what the model received, round by round (1: the step's body)
    answer: dict[str, Any]  # the one message the client gets (the rounds' answers merged)
    outcome: str  # how the rounds ended (the server's read_outcome)
    rounds: int  # read rounds after the first (the server's x-compaction-read-rounds)


def placeholder_summary(summary_tokens: int, key: str) -> str:
    """Text of about `summary_tokens` tokens (one per word) standing in for a real summary."""
    words = max(1, summary_tokens - 12)
    return f"[placeholder summary {key[:12]}] " + "note " * words


def _tool_names(messages: Sequence[Mapping[str, Any]]) -> dict[str, str]:
    """call id -> tool name: Anthropic tool_use blocks, Chat tool_calls, Responses calls
    (the items of a unit)."""
    names = {}
    for m in messages:
        items = m.get("items")
        for item in items if isinstance(items, list) else []:
            if isinstance(item, dict) and "call_id" in item and "name" in item:
                names[str(item["call_id"])] = str(item["name"])
        calls = m.get("tool_calls")
        for call in calls if isinstance(calls, list) else []:
            if isinstance(call, dict):
                function = call.get("function")
                name = function.get("name", "?") if isinstance(function, dict) else "?"
                names[str(call.get("id"))] = str(name)
        content = m.get("content")
        for b in content if isinstance(content, list) else []:
            if isinstance(b, dict) and b.get("type") == "tool_use":
                names[str(b.get("id"))] = str(b.get("name", "?"))
    return names


def _result_owners(messages: Sequence[Mapping[str, Any]], dialect: Dialect) -> dict[str, str]:
    """ref -> tool name, for every tool result in the history (the results as the
    format's dialect finds them: tool_result blocks, or Chat `tool` messages)."""
    names = _tool_names(messages)
    owners = {}
    for m in messages:
        for result in dialect.tool_results(m):
            text = result.text
            if text is not None:
                owners[ref_for(text)] = names.get(str(result.call_id), "?")
    return owners


class MemoryExecutor:
    """The driver's commands on dicts: what a fleet's Redis would hold for one
    conversation (every line of each first message, and the notes of summaries made
    ahead, as proxy/store/redis.py keeps them). A summary that is not stored yet is
    "made" as a placeholder."""

    def __init__(self, counter: TokenCounter) -> None:
        self.counter = counter
        self.lines: dict[str, dict[str, Line]] = {}  # root -> line -> line, as stored
        self.summaries: dict[str, str] = {}  # key -> text, as the store would keep them
        self.blobs: dict[str, str] = {}  # ref -> the offloaded text
        self.notes: dict[str, dict[str, PreparedSummary]] = {}  # root -> seen -> note
        self.asked: GetSummary | None = None  # the last request's summary, if any
        self.ahead: GetSummary | None = None  # ... and the one it had made ahead
        self.evicted = 0  # lines dropped beyond the bound

    @property
    def checkpoints(self) -> dict[str, Checkpoint]:
        """root -> its most recently used line's checkpoint."""
        return {
            root: max(lines.values(), key=lambda line: line.used).checkpoint
            for root, lines in self.lines.items()
            if lines
        }

    def copy(self) -> MemoryExecutor:
        other = MemoryExecutor(self.counter)
        other.lines = {root: dict(lines) for root, lines in self.lines.items()}
        other.notes = {root: dict(notes) for root, notes in self.notes.items()}
        return other

    def __call__(self, command: Command) -> Reply:
        match command:
            case LoadConversation():
                root = command.root
                lines = tuple(self.lines.get(root, {}).values())
                return Loaded(lines=lines, notes=tuple(self.notes.get(root, {}).values()))
            case GetSummary():
                self.asked = command
                stored = self.summaries.get(command.key)
                if stored is not None:
                    return SummaryReply(stored, reused=True)
                made = placeholder_summary(command.summary_tokens, command.key)
                return SummaryReply(command.finished(made, self.counter.count_text))
            case PrepareSummary():
                # Made at once here: the next request finds it ready, as it would in a
                # session whose turns are further apart than the summariser takes.
                ask = command.ask
                self.ahead = ask
                text = self.summaries.setdefault(
                    ask.key, placeholder_summary(ask.summary_tokens, ask.key)
                )
                notes = self.notes.setdefault(command.root, {})
                for seen in command.evict_notes:
                    notes.pop(seen, None)
                if command.note is not None:
                    notes[command.note.seen] = replace(command.note, text=text)
                return Started()
            case TouchLine():
                line = self.lines.get(command.root, {}).get(command.line)
                if line is not None:
                    self.lines[command.root][command.line] = replace(line, used=command.used)
                return Started()
            case SaveCrossing():
                return self._save(command)
            case _:
                assert_never(command)

    def _save(self, command: SaveCrossing) -> Saved:
        kept = self.lines.setdefault(command.root, {})
        for name in command.evict:
            self.evicted += kept.pop(name, None) is not None
        for seen in command.evict_notes:
            self.notes.get(command.root, {}).pop(seen, None)
        if command.checkpoint is not None:
            checkpoint = command.checkpoint
            kept[checkpoint.prefix_hash] = Line(checkpoint, command.used)
        for ref, text in command.blobs:
            self.blobs[ref] = text
        return Saved(ok=True)


class RoundsExecutor:
    """The read rounds' commands on dicts: slices from the blobs the steps offloaded,
    budgets that never refuse, every round answered by `model`."""

    def __init__(self, blobs: Mapping[str, str], wire: WireFormat, tool: str, model: Model):
        self.blobs = blobs
        self.wire = wire
        self.tool = tool
        self.model = model
        self.sent: list[dict[str, Any]] = []
        self.answers: list[dict[str, Any]] = []

    def __call__(self, command: RoundCommand) -> RoundReply:
        match command:
            case SendRound():
                received = orjson.loads(command.body)
                self.sent.append(received)
                self.answers.append(self.model(received))
                return Answered(self.wire.split(self.answers[-1], self.tool))
            case ReadResults():
                texts = tuple(self.blobs.get(ref) for ref in command.refs)
                return Results(texts, (False,) * len(texts))
            case TopUp():
                return ToppedUp(True)
            case _:
                assert_never(command)


def _applied(memory: MemoryExecutor, digests: Sequence[bytes]) -> Checkpoint | None:
    """The checkpoint a request of these messages took (its line's, the longest)."""
    line = best_line(memory.lines.get(root_of(digests), {}).values(), digests)
    return line.checkpoint if line is not None else None


class Simulator:
    def __init__(
        self,
        policies: Sequence[Policy],
        counter: TokenCounter,
        *,
        factor: float = 1.0,
        fmt: WireFormat = ANTHROPIC,
        betas: str = "",
    ) -> None:
        self.policies = list(policies)
        self.betas = betas  # the requests' anthropic-beta (the context-1m window)
        self.counter = counter
        self.factor = factor
        self.format = fmt
        self.memory = MemoryExecutor(counter)
        self.stubbed: StubbedMemo = {}  # as the Compactor keeps it

    @property
    def checkpoints(self) -> dict[str, Checkpoint]:
        return self.memory.checkpoints

    def step(self, body: dict[str, Any], seen: Seen | None = None) -> Step:
        """`seen`: what was kept of the request's line when `body` was parsed by
        `Reuse.parse` (proxy/core/reuse.py), as the server passes it."""
        wire = self.format
        messages = wire.messages(body)
        model = str(body.get("model", ""))
        policy = policy_for(model, self.policies, betas=self.betas)
        tool_search = searches_tools(self.betas)
        may_defer = takes_tool_search(model)
        counted = count_request(wire, self.counter, body, messages, seen, tool_search or may_defer)
        counter = wire.counter(self.counter)
        source = ClientJSON.written(body, seen.written if seen is not None else None)
        request = CompactionRequest(
            wire, body, messages, counted, counter, policy, self.factor, source,
            stubbed=self.stubbed,
            built=seen.built if seen is not None else None,
            validated=seen.validated if seen is not None else None,
            tool_search=tool_search,
            may_defer=may_defer,  # (an upstream that takes it, as the server's)
        )  # fmt: skip
        memory = self.memory
        memory.asked = memory.ahead = None
        known = set(memory.summaries)
        before = memory.copy()
        decision = run(compaction(request), memory)
        history, fixed = counted.history, counted.fixed
        ahead = self._summarise(memory.ahead, reused=False)
        outcome = decision.outcome
        if isinstance(outcome, Untouched):
            return Step(body, policy, "untouched", tokens_before=history, tokens_after=history,
                        fixed_tokens=fixed, made_ahead=ahead)  # fmt: skip
        if isinstance(outcome, Refuse):
            return Step(body, policy, "refuse", tokens_before=history, fixed_tokens=fixed,
                        refusal=outcome.message)  # fmt: skip
        rewrite = outcome
        assert decision.sent is not None
        summary, fallback = None, None
        asked = memory.asked
        if asked is not None and rewrite.summary:
            reused = asked.key in known
            memory.summaries[asked.key] = memory.summaries.get(
                asked.key, placeholder_summary(asked.summary_tokens, asked.key)
            )
            summary = self._summarise(asked, reused)
            fallback = self._without_summary(request, before)
        stored = rewrite.checkpoint or _applied(memory, counted.digests)
        step = self._rewritten(body, decision.sent, rewrite, stored, policy, decision.estimate,
                               summary, fallback)  # fmt: skip
        step.made_ahead = ahead
        step.encoded = decision.body or b""
        return step

    def read_rounds(self, step: Step, model: Model) -> ReadReplay:
        """The step's answer with its read_result rounds, as the server would run them
        (proxy/core/rounds.py) against `model`."""
        if step.tool is None:
            raise ValueError("read_result was not offered in this step")
        wire, body = self.format, step.body
        request = RoundsRequest(
            wire, body, orjson.dumps(body), step.refs, self.counter,
            step.policy, self.factor,
        )  # fmt: skip
        rounds = RoundsExecutor(self.memory.blobs, wire, step.tool, model)
        ended = run(read_rounds(request), rounds)
        answer = wire.merge(rounds.answers, step.tool, ended.note)
        return ReadReplay(rounds.sent, answer, ended.outcome, ended.rounds)

    def _summarise(self, asked: GetSummary | None, reused: bool) -> Summarise | None:
        if asked is None:
            return None
        wire = self.format
        prompt = count_tokens(wire, self.counter, asked.body, wire.messages(asked.body)).total
        return Summarise(0, asked.summary_tokens, reused, prompt, asked.body)

    def _without_summary(
        self, request: CompactionRequest, before: MemoryExecutor
    ) -> Rewrite | Refuse:
        """What the request would have got had the summariser failed: the same driver on
        a copy of the state before this step, so nothing of it is kept."""
        shadow = before.copy()

        def failing(command: Command) -> Reply:
            if isinstance(command, GetSummary):
                return SummaryReply(None, failure="simulated")
            return shadow(command)

        decision = run(compaction(request), failing)
        outcome = decision.outcome
        return Refuse("") if isinstance(outcome, Untouched) else outcome

    def _rewritten(
        self,
        body: dict[str, Any],
        sent: dict[str, Any],
        rewrite: Rewrite,
        checkpoint: Checkpoint | None,
        policy: Policy,
        estimate: int,
        summary: Summarise | None,
        fallback: Rewrite | Refuse | None,
    ) -> Step:
        segments = checkpoint.segments if checkpoint is not None else ()
        kept = sum(1 for s in segments if isinstance(s, (Verbatim, Stubbed)))
        folded = sum(s.folded for s in segments if isinstance(s, Summary))
        total = checkpoint.covers if checkpoint is not None else 0
        owners = _result_owners(self.format.messages(body), self.format)
        offloaded = [
            Offloaded(ref, owners.get(ref, "?"), self.counter.count_text(text))
            for ref, text in rewrite.blobs
        ]
        if summary is not None:
            summary = Summarise(
                folded,
                summary.summary_tokens,
                summary.reused,
                summary.input_tokens,
                summary.request,
            )
        return Step(
            sent,
            policy,
            "rewrite",
            strategy=rewrite.strategy,
            reason=rewrite.reason,
            tokens_before=rewrite.tokens_before,
            tokens_after=rewrite.tokens_after,
            fixed_tokens=estimate - rewrite.estimate,
            offloaded=offloaded,
            stubs=len(rewrite.refs),
            folded=folded,
            dropped=max(0, total - kept - folded),
            summary=summary,
            pack_fallback=fallback,
            tool=rewrite.tool,
            refs=frozenset(rewrite.refs),
        )
