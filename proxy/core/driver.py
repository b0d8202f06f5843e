"""The compaction driver: one request's decision, as a generator of commands.

`compaction(request)` walks the steps every compacting request takes
(docs/design.md#over-the-thresholds):
count check, load the conversation's lines and take the checkpoint with the longest
prefix this history begins with (proxy/core/lines.py), plan, get a summary when a fold
needs one, save what a crossing made, and encode what goes upstream. It does no I/O: it
yields a command (proxy/core/commands.py) whenever it needs the outside world and is
resumed with the reply, then returns a `Decision`: the outcome (proxy/core/outcome.py)
and what goes upstream, which the shell matches on by the outcome's type. `run` drives it
with any executor; the server's runs the commands on Redis and the upstream, the ops
simulator's on dicts.

    request fits ────────────────────────────────────────────► forward (original bytes)
        │ over
        ▼
    LoadConversation ─► plan ─┬─ untouched ──────────────────► forward
                              ├─ refuse ─────────────────────► refuse (400)
                              ├─ fold ─► GetSummary ─► fold ─┐
                              └─ rewrite ────────────────────┴► SaveCrossing ─► rewrite
                                                                  │ failed, with blobs
                                                                  └► replan without blobs

    Near the trigger, the next fold's summary is made ahead: a PrepareSummary command
    (fire and forget) before the decision; at the fold, a summary made ahead is used
    (whole, or for the oldest groups it covers), and one still in the making is not
    waited for while the window has room; past the wait point, the crossing waits for
    that call (GetSummary.ahead) rather than have a second summary made.
"""

from __future__ import annotations

from collections.abc import Callable, Generator, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any, TypeVar

from proxy.core.checkpoint import Line, root_of
from proxy.core.commands import (
    Command,
    GetSummary,
    LoadConversation,
    Loaded,
    PreparedSummary,
    PrepareSummary,
    Reply,
    SaveCrossing,
    Saved,
    Started,
    SummaryReply,
    TouchLine,
)
from proxy.core.counting import Counted
from proxy.core.digests import chain_hash
from proxy.core.duplicate_keys import duplicated
from proxy.core.estimate import margin
from proxy.core.exact_json import ClientJSON
from proxy.core.lines import (
    DEFAULT_MAX_LINES,
    best_line,
    best_note,
    evicted,
    evicted_notes,
    is_most_recent,
    next_tick,
    renewal,
)
from proxy.core.outcome import FoldPlan, Outcome, Planned, Recount, Refuse, Rewrite, Untouched
from proxy.core.planner import ESTIMATED_OFFLOAD_SHARE, plan, without_blobs
from proxy.core.policy import Policy
from proxy.core.request_view import request_view
from proxy.core.rewrites import fold, recovered_blobs
from proxy.core.segments import StubbedMemo
from proxy.core.validated import Validated
from proxy.core.wire_format import MessageCounter, WireFormat
from proxy.core.working import BuiltMemo, PlanInput, real

Message = Mapping[str, Any]
T = TypeVar("T")
C = TypeVar("C")  # a generator's commands (the driver's, or the read rounds')
R = TypeVar("R")  # ... and their replies


@dataclass(frozen=True, slots=True)
class CompactionRequest:
    wire: WireFormat
    body: Mapping[str, Any]  # the client's request, parsed
    messages: Sequence[Message]  # its history (wire.messages(body))
    counted: Counted
    counter: MessageCounter  # the wire's counter (wire.counter(base))
    policy: Policy
    factor: float  # calibration: real tokens / estimated
    source: ClientJSON  # the body's bytes, written back exactly where a rewrite keeps them
    stubbed: StubbedMemo | None = None  # the shell's memo of stubbed messages (planner)
    built: BuiltMemo | None = None  # what the line's earlier requests built (planner)
    # The shell's clock (seconds) and how often the TTLs of the refs a conversation names
    # are renewed at most; 0: at every crossing.
    now: int = 0
    renew_every: int = 0
    # Checkpoints kept per conversation (its lines: proxy/core/lines.py), at least 1.
    max_lines: int = DEFAULT_MAX_LINES
    # False: the shell answers no read_result for this request (its answer is a summary:
    # nothing of it may be held back), so the planner writes no stub naming it.
    read_result: bool = True
    # The model asked for; "": the body's `model` (an envelope may carry it elsewhere,
    # as Bedrock's and Vertex's URL paths do).
    model: str = ""
    # What the line's earlier validations kept (proxy/core/validated.py); None: every
    # message is validated.
    validated: Validated | None = None
    # Tool search is on for the client's requests (its betas say so: the shell reads
    # them), so read_result may join deferred, loaded by a stub (Dialect.with_history).
    tool_search: bool = False
    # read_result may join deferred where the client did not turn tool search on: its
    # model is one tool search is documented for (model_facts.takes_tool_search) and its
    # upstream has not refused a deferral (the shell remembers). A rewrite so deferred
    # says so (Decision.relists): it goes listed should the upstream refuse it.
    may_defer: bool = False

    @property
    def defers(self) -> bool:
        """Whether read_result joins this request deferred (where the format defers)."""
        return self.tool_search or self.may_defer


@dataclass(frozen=True, slots=True)
class Decision:
    """What goes upstream, as the outcome says: the client's bytes (`Untouched`), a
    rewrite (`Rewrite`: `sent` and `body`), or nothing (`Refuse`). The shell matches on
    the outcome's type."""

    outcome: Outcome
    estimate: int  # estimated input tokens of what is sent (system, tools, history)
    sent: dict[str, Any] | None = None  # the rewritten body (read_result rounds go on)
    body: bytes | None = None  # ... encoded
    summary_failure: str = ""  # why a wanted summary could not be had
    # Why compaction was declined (the API's rule a request or a rewrite broke: sent as
    # the client wrote it, or refused as the API would), for the shell's warning.
    declined: str = ""
    # read_result went deferred in `sent` by the proxy's choice (CompactionRequest.may_defer),
    # the client not having turned tool search on: should the upstream refuse it, `sent`
    # goes again with it listed (Request.listed: the same plan, built only then).
    relists: bool = False

    @property
    def rewrite(self) -> Rewrite | None:
        return self.outcome if isinstance(self.outcome, Rewrite) else None

    @property
    def reason(self) -> str:
        """A REASONS key when the outcome is not what the policy aimed at, else ""."""
        return self.outcome.reason


Driver = Generator[Command, Reply, Decision]


def compaction(request: CompactionRequest) -> Driver:
    counted = request.counted
    policy, factor = request.policy, request.factor
    if counted.margin and _exact_decides(counted, policy, factor, counted.margin):
        # Counted exactly until the estimates left cannot change what the window or a fold
        # threshold says (the offload trigger is the estimate's: proxy/core/planner.py).
        def decided(now: Counted, rest: int) -> bool:
            return not _exact_decides(now, policy, factor, rest)

        counted = _exact_until(counted, counted.estimated, decided)
        request = replace(request, counted=counted)
    if not request.messages or counted.fits(policy, factor):
        return Decision(Untouched(real(counted.history, factor)), counted.total)
    root = root_of(counted.digests)
    read_result = _read_result(request)  # (what the planner writes stubs for)
    loaded = yield LoadConversation(root)
    assert isinstance(loaded, Loaded)
    lines = _lines_of(loaded)
    notes = _notes_of(loaded)
    line = best_line(lines, counted.digests)
    inp = _plan_input(request, loaded, line, best_note(notes, counted.digests), read_result)
    crossed = False
    outcome: Planned = plan(inp)
    while isinstance(outcome, Recount):
        request = _recounted(request, outcome.indices)
        inp = replace(inp, counts=request.counted.counts, uncertain=request.counted.uncertain)
        outcome = plan(inp)
    # Nothing is rewritten or summarised from a history the API would refuse: it goes up
    # as it came, and the API's own error reaches the client. A rewrite's request is
    # checked with the rewrite (`_checked`); a summary's before it is asked for.
    client_checked = _acts(outcome) and not isinstance(outcome, Rewrite)
    if client_checked:
        invalid = _checked(request, outcome).client_error
        if invalid is not None:
            tokens = real(counted.history, factor)
            return Decision(Untouched(tokens, reason="invalid_request"), counted.total,
                            declined=invalid)  # fmt: skip
    failure = ""
    made: tuple[str, str] | None = None  # a summary this request paid for: (key, text)
    known: tuple[str, str] | None = None  # the summary it folded with: (key, text)
    if isinstance(outcome, FoldPlan):
        got = yield _summary_request(request, outcome)
        assert isinstance(got, SummaryReply)
        failure = got.failure
        text = got.text
        if text is not None and text.strip():
            if not got.reused:  # finished with its facts by the executor (GetSummary)
                made = (outcome.key, text)
            known = (outcome.key, text)
        # A summary being made ahead that was stored by the time this request asked for
        # it was made ahead for this fold, not found from an earlier crossing.
        found = "ahead" if outcome.ahead else "reused"
        had = "waited" if got.waited else found if got.reused else "made"
        if got.unread:
            # The store could not be read for the summary (it may well be stored): the
            # crossing is planned as one without the store, and stores nothing, so its
            # pack never takes the place of the conversation's line.
            outcome = plan(replace(inp, store_ok=False))
            while isinstance(outcome, Recount):
                request = _recounted(request, outcome.indices)
                counts, uncertain = request.counted.counts, request.counted.uncertain
                inp = replace(inp, counts=counts, uncertain=uncertain)
                outcome = plan(replace(inp, store_ok=False))
        else:
            outcome = fold(outcome, text, summary=had)
    checked: _Checked | None = None
    if isinstance(outcome, Rewrite):
        checked = _checked(request, outcome, client=not client_checked)
        if checked.client_error is not None:
            tokens = real(counted.history, factor)
            return Decision(Untouched(tokens, reason="invalid_request"), counted.total,
                            declined=checked.client_error)  # fmt: skip
        outcome = checked.outcome
    if isinstance(outcome, Rewrite) and outcome.checkpoint is not None:
        new = {ref for ref, _ in outcome.blobs}
        kept = tuple(ref for ref in outcome.refs if ref not in new)
        before = line.checkpoint if line is not None else None
        checkpoint, touch = renewal(
            before, outcome.checkpoint, kept, request.now, request.renew_every
        )
        saved = yield SaveCrossing(
            root,
            checkpoint,
            tuple(outcome.blobs),
            touch,
            made if outcome.summary == "made" else None,
            used=next_tick(lines),
            evict=evicted(lines, checkpoint.prefix_hash, request.max_lines),
            evict_notes=evicted_notes(notes, request.max_lines),
        )
        crossed = True
        assert isinstance(saved, Saved)
        if saved.ok and saved.lost:
            # Refs it names whose blobs were evicted or expired: the client still sent
            # their texts, so they are stored again (else their stubs read as gone).
            again = recovered_blobs(inp, saved.lost)
            if again:
                resaved = yield SaveCrossing(root, None, tuple(again), ())
                assert isinstance(resaved, Saved)
        if not saved.ok and outcome.blobs:
            # A stub whose blob was not kept could never be read: plan again without
            # offloading, folding with the summary already paid for when it still fits.
            outcome = without_blobs(inp)
            while isinstance(outcome, Recount):
                request = _recounted(request, outcome.indices)
                counts, uncertain = request.counted.counts, request.counted.uncertain
                inp = replace(inp, counts=counts, uncertain=uncertain)
                outcome = without_blobs(inp)
            if isinstance(outcome, FoldPlan):
                paid = known[1] if known is not None and known[0] == outcome.key else None
                outcome = fold(outcome, paid, summary="reused" if made is None else "made")
            if isinstance(outcome, Rewrite):
                outcome = replace(outcome, checkpoint=None, reason="store_unavailable")
                checked = _checked(request, outcome, client=False)
                outcome = checked.outcome
    if isinstance(outcome, (Rewrite, Untouched)) and outcome.prepare is not None:
        # The next fold's summary, made in the background: no turn waits for it. Its
        # note says what its call sees (this whole history): only a history that begins
        # with exactly that may use it.
        ahead = outcome.prepare
        digests = counted.digests
        note = PreparedSummary(ahead.key, folds=ahead.folds, covers=len(digests),
                               seen=chain_hash(digests), made=next_tick(lines))  # fmt: skip
        started = yield PrepareSummary(
            root,
            _summary_request(request, ahead),
            note,
            evicted_notes(notes, request.max_lines, note.seen),
        )
        assert isinstance(started, Started)
    if not crossed and line is not None and not is_most_recent(line, lines):
        # Another line's request came between: this one is the most recent again, so
        # the least recently used line is the one a new line evicts.
        touched = yield TouchLine(root, line.name, next_tick(lines))
        assert isinstance(touched, Started)
    declined = checked.declined if checked is not None else ""
    return replace(_decision(request, inp, outcome, failure, checked), declined=declined)


def _acts(outcome: Planned) -> bool:
    """Whether the plan sends anything but the client's bytes, or asks for a summary."""
    return not isinstance(outcome, Untouched) or outcome.prepare is not None


@dataclass(frozen=True, slots=True)
class _Checked:
    """A plan as the API would answer it: `client_error`, why it would refuse the
    client's own request (nothing is then rewritten or summarised); else for a rewrite,
    `outcome` the rewrite itself, with the body it sends (`sent`, and `body` encoded:
    built, checked and encoded once), or what stands in for it, and why (`declined`)."""

    outcome: Planned
    declined: str = ""
    sent: dict[str, Any] | None = None
    body: bytes | None = None
    client_error: str | None = None
    relists: bool = False  # (Decision.relists)


def _checked(request: CompactionRequest, planned: Planned, client: bool = True) -> _Checked:
    """The client's request checked (`client`: not checked yet) with the API's rules and
    for duplicate keys; then, for a rewrite, the rewrite with what it sends when the API
    would take it, else (a planner's fault: the request itself keeps the rules) what the
    API would answer the client's own request: the client's bytes, or within the window's
    refusal when they exceed it. Never an empty history or one the API refuses in place
    of the client's. The rewrite's body is built first, so the format is asked for it and
    for both checks in one go."""
    rewrite = planned if isinstance(planned, Rewrite) else None
    sent, relists = _sent(request, rewrite) if rewrite is not None else (None, False)
    wire, source = request.wire, request.source
    if client:  # (a body orjson writes back as sent has no duplicate key)
        refused = wire.request_error(request.body, request.model, request.validated) or (
            None if source.canonical else duplicated(source.raw, request.body)
        )
        if refused is not None:
            return _Checked(planned, client_error=refused)
    if sent is None or rewrite is None:
        return _Checked(planned)
    invalid = wire.request_error(sent, request.model, request.validated)
    if invalid is None:
        return _Checked(rewrite, sent=sent, body=source.encode_kept(sent), relists=relists)
    counted, policy = request.counted, request.policy
    tokens = real(counted.history, request.factor)
    declined = f"invalid_rewrite: {invalid}"
    if (counted.history + counted.fixed) * request.factor > policy.window:
        told = f"prompt is too long: about {tokens} tokens of history > {policy.window} maximum"
        return _Checked(Refuse(told, reason="invalid_rewrite"), declined)
    return _Checked(Untouched(tokens, reason="invalid_rewrite"), declined)


def _sent(request: CompactionRequest, rewrite: Rewrite) -> tuple[dict[str, Any], bool]:
    """The body a rewrite sends (decoded), and whether it relists: read_result went
    deferred by the proxy's choice alone (the client did not turn tool search on), so a
    refusal of it is answered by the listed form (`_summary_request` decides alike; the
    calls inline: a helper between them would lengthen the walk, bench/walk.py)."""
    messages = _with_proxy_breakpoint(request, rewrite)
    wire, body, tool = request.wire, request.body, rewrite.tool
    sent = {**body, **wire.with_history(body, messages, tool, request.defers)}
    chosen = tool is not None and request.may_defer and not request.tool_search
    return sent, chosen and tool is not None and wire.deferred(sent, tool)


def _recounted(request: CompactionRequest, indices: Sequence[int]) -> CompactionRequest:
    """The request with the messages at `indices` counted exactly (Counted.exactly)."""
    return replace(request, counted=request.counted.exactly(indices))


def _exact_decides(counted: Counted, policy: Policy, factor: float, slack: int) -> bool:
    """Whether the window, or the first threshold of the policy (`Policy.quiet_tokens`),
    lies within `slack` tokens of the count: there, whether it fits is the exact count's
    to say, unless that threshold is the offload trigger, far enough below where folds
    are planned for the estimate to decide it (as the planner does)."""
    near = slack * factor
    if abs(counted.total * factor - policy.window) <= near:
        return True
    quiet = policy.quiet_tokens
    if abs(counted.history * factor - quiet) > near:
        return False
    folds_from = policy.prepare_tokens * ESTIMATED_OFFLOAD_SHARE
    return quiet < policy.offload_tokens or (counted.history + slack) * factor > folds_from


def _exact_until(
    counted: Counted, indices: Sequence[int], decided: Callable[[Counted, int], bool]
) -> Counted:
    """`counted` with the messages at `indices` counted exactly one by one, in their
    order, until `decided` (given the counts so far and the margin of the estimates still
    left among them) says the rest's exact counts could not change the decision."""
    left = list(indices)
    while left:
        counted = counted.exactly(left[:1])
        del left[0]
        rest = margin(sum(counted.uncertain[n] for n in left)) if counted.uncertain else 0
        if decided(counted, rest):
            break
    return counted


def _lines_of(loaded: Loaded) -> list[Line]:
    lines = list(loaded.lines)
    single = loaded.checkpoint
    if single is not None and all(line.name != single.prefix_hash for line in lines):
        lines.append(Line(single, 0))
    return lines


def _notes_of(loaded: Loaded) -> list[PreparedSummary]:
    notes = list(loaded.notes)
    if loaded.prepared is not None:
        notes.append(loaded.prepared)
    return notes


def _summary_request(request: CompactionRequest, fold: FoldPlan) -> GetSummary:
    """In place when the summariser is the conversation's own model (its prefix is then
    read from the prompt cache), else a request of its own holding the transcript."""
    own = request.model or str(request.body.get("model", ""))
    model = fold.model or own
    body = relist = None
    transcript = request.wire.summary_request(
        request.body,
        model=model,
        summary_tokens=fold.summary_tokens,
        prompt=fold.transcript,
        history=None,
    )
    assert transcript is not None
    if model == own and fold.in_place.fits:
        place = fold.in_place
        history = _marked(request, place.history, place.breakpoint_at)
        # The conversation's request as it goes upstream (read_result among its tools;
        # should it go deferred by the proxy's choice, listed if that is refused: `_sent`).
        wire, tool = request.wire, place.tool
        sent = {**request.body, **wire.with_history(request.body, history, tool, request.defers)}
        chosen = tool is not None and request.may_defer and not request.tool_search
        relists = chosen and tool is not None and wire.deferred(sent, tool)
        body = request.wire.summary_request(
            sent,
            model=model,
            summary_tokens=fold.summary_tokens,
            prompt=place.prompt,
            history=history,
        )
        if body is not None and request.wire.request_error(body, request.model) is not None:
            body = None  # (a planner's fault) the transcript's call instead: one that can succeed
        if relists:
            relist = place.tool
        # What it keeps of the conversation's request goes as the client's bytes (and so
        # reads the prompt cache the conversation's own requests wrote).
        encoded = request.source.encode(body) if body is not None else b""
    facts, budget = fold.facts, fold.facts_budget  # applied by GetSummary.finished
    ask = GetSummary(
        fold.key, transcript, fold.summary_tokens, model, fold.ahead, None, facts, budget
    )
    if body is None:
        return ask
    return replace(ask, body=body, encoded=encoded, fallback=transcript, relist=relist)


def _read_result(request: CompactionRequest) -> tuple[str | None, int]:
    """read_result's name in this request (None: the shell answers none for it, or the
    client's tools leave no name free) and what adding its tool adds to the request's
    tokens, as counting found them (`Counted.view`)."""
    view = request.counted.view
    if view is None or view.tool_search != request.defers:  # (counted without it)
        counted = request.counted
        view = request_view(
            request.wire, request.counter, request.body, counted.fixed, request.defers
        )
    if not request.read_result or not view.tool:
        return None, 0
    return view.tool, view.tool_tokens


def _plan_input(
    request: CompactionRequest,
    loaded: Loaded,
    line: Line | None,
    prepared: PreparedSummary | None,
    read_result: tuple[str | None, int],
) -> PlanInput:
    tool, tool_tokens = read_result
    return PlanInput(
        messages=request.messages,
        counts=request.counted.counts,
        digests=request.counted.digests,
        checkpoint=line.checkpoint if line is not None else None,
        policy=request.policy,
        counter=request.counter,
        dialect=request.wire,
        fixed_tokens=request.counted.fixed,
        tool_tokens=tool_tokens,
        tool=tool,
        factor=request.factor,
        store_ok=loaded.store_ok,
        prepared=prepared,
        forms=request.counted.forms,
        stubbed=request.stubbed,
        uncertain=request.counted.uncertain,
        built=request.built,
    )


def _decision(
    request: CompactionRequest,
    inp: PlanInput,
    outcome: Planned,
    failure: str,
    checked: _Checked | None = None,
) -> Decision:
    if isinstance(outcome, Untouched):
        return Decision(outcome, request.counted.total, summary_failure=failure)
    if isinstance(outcome, Refuse):
        return Decision(outcome, request.counted.total)
    assert isinstance(outcome, Rewrite), "a store-less plan never folds"
    estimate = inp.fixed_tokens + (inp.tool_tokens if outcome.tool else 0) + outcome.estimate
    # Every rewrite is checked before it is decided: what the check built and encoded.
    assert checked is not None and checked.outcome is outcome
    return Decision(
        outcome,
        estimate,
        sent=checked.sent,
        body=checked.body,
        summary_failure=failure,
        relists=checked.relists,
    )


# The API takes at most this many cache breakpoints in a request.
MAX_BREAKPOINTS = 4


def _with_proxy_breakpoint(request: CompactionRequest, rewrite: Rewrite) -> list[dict[str, Any]]:
    """The rewritten messages, with one cache breakpoint of the proxy's at the end of the
    stubbed region when the request has room for it (fewer than four). The client's own
    are never moved, and removed only from the newest result the next request stubs
    (`Rewrite.uncached_tail`); the region's end moves only as it grows."""
    return _marked(request, rewrite.messages, rewrite.breakpoint_at, rewrite.uncached_tail)


def _marked(
    request: CompactionRequest,
    messages: list[dict[str, Any]],
    at: int | None,
    uncached_tail: bool = False,
) -> list[dict[str, Any]]:
    if at is None:
        return messages
    client = request.counted.breakpoints
    if client >= MAX_BREAKPOINTS:
        return messages
    marked = request.wire.with_breakpoint(messages, at, uncached_tail)
    return messages if marked is None else marked


def run(driver: Generator[C, R, T], execute: Callable[[C], R]) -> T:
    """Drive a generator to its end with a synchronous executor (tests, the simulator):
    the driver, or the read rounds (proxy/core/rounds.py)."""
    reply: R | None = None
    while True:
        try:
            command = driver.send(reply) if reply is not None else next(driver)
        except StopIteration as stop:
            result: T = stop.value
            return result
        reply = execute(command)


def commands_of(driver: Generator[C, R, T], execute: Callable[[C], R]) -> tuple[list[C], T]:
    """The commands a driver yields, in order, and its result (Playbook-style tests)."""
    seen: list[C] = []

    def record(command: C) -> R:
        seen.append(command)
        return execute(command)

    return seen, run(driver, record)
