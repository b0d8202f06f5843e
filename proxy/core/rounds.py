"""The read_result rounds of one answer, as a generator of commands (the driver's style).

When a rewritten request carried `read_result`, the proxy answers the model's calls itself:
`read_rounds(request)` walks the rounds and decides, and does no I/O. It yields a command
(proxy/core/commands.py) whenever it needs the outside world and is resumed with the
reply; it returns how the rounds `Ended`. The server's executor sends the rounds upstream
and relays them (whole or streamed, over HTTP or a WebSocket: proxy/server/read_rounds.py),
the ops simulator's answers them from a script on dicts (proxy/ops/simulate.py).

    SendRound 1 (the request the route sent) ─► Answered ─┬─ no reads asked ──► complete
                 ▲                                        ├─ rounds used up ──► limit
                 │                                        ▼
                 │                               ReadResults (the slices)
                 │                         fit to the window (longest first) ─► window
                 │                                        ▼
                 └──────── SendRound n ◄── ToppedUp ◄── TopUp ──────── refused ► budget
    Failed (at any SendRound) ─────────────────────────────────────────────────► its outcome

Every round is counted before it goes upstream: slices are shortened (the longest first,
each saying so and where to go on) until the round fits the model's window. When the
rounds stop while the model still wanted to read (the round limit, the window, a budget),
`Ended.note` is one short text saying why, which ends the client's message.
"""

from __future__ import annotations

import math
from collections.abc import Generator, Iterable, Mapping
from dataclasses import dataclass, replace
from typing import Any

from proxy.core.commands import (
    REFUSED,
    Answered,
    Failed,
    ReadResults,
    Results,
    RoundCommand,
    RoundReply,
    SendRound,
    ToppedUp,
    TopUp,
)
from proxy.core.counting import count_tokens
from proxy.core.exact_json import ClientJSON
from proxy.core.offload import STOP_NOTES, ReadRequest, parse_read_args, read_slice, unknown_ref
from proxy.core.policy import Policy
from proxy.core.tokens import TokenCounter
from proxy.core.wire_format import JSON, ReadCall, Round, WireFormat

UNAVAILABLE = "The offload store is not available right now."
WINDOW_MARGIN = 0.02  # of the window kept free: the local count is an estimate
MIN_SLICE = 200  # characters a shortened slice keeps; below that the round is not sent
FIT_ATTEMPTS = 4


@dataclass(frozen=True, slots=True)
class RoundsRequest:
    """One rewritten request whose answer may take read_result rounds."""

    wire: WireFormat
    sent: Mapping[str, Any]  # the rewritten request, parsed
    body: bytes  # ... as sent (round 1)
    refs: frozenset[str]  # the refs its history names: all it may read
    counter: TokenCounter
    policy: Policy  # its window, max_read_rounds, and read_length (a read naming none)
    factor: float = 1.0  # calibration (real / estimated), looked up once for the request
    # read_result's name where it went deferred by the proxy's choice (Decision.relists):
    # should the upstream refuse round 1, it goes once more with it listed, and every
    # later round is built from that form (None: a refusal is the client's answer).
    relist: str | None = None


@dataclass(frozen=True, slots=True)
class Ended:
    """How the rounds ended (the record's read_outcome: complete, limit, window, budget,
    or a Failed reply's), the note ending the client's message when the model still wanted
    to read, and how many read rounds were sent after the first."""

    outcome: str
    rounds: int = 0
    note: str | None = None
    failed: bool = False  # a round's answer failed: nothing more goes to the client
    # Round 1 was refused deferred and answered listed: the upstream does not take the
    # deferral (the shell remembers it for the model there).
    relisted: bool = False


Rounds = Generator[RoundCommand, RoundReply, Ended]


@dataclass(slots=True)
class Fetched:
    """One read_result call and what the store had for it."""

    call_id: str
    request: ReadRequest | None = None
    text: str | None = None  # the whole offloaded result
    error: str = ""  # what to tell the model instead

    def result(self, length: int) -> tuple[str, str, bool]:
        if self.text is None or self.request is None:
            return self.call_id, self.error, True
        asked = self.request
        cut = length < asked.length
        request = ReadRequest(asked.ref, asked.start, length) if cut else asked
        return self.call_id, read_slice(self.text, request, cut=cut), False

    @property
    def slice_length(self) -> int:
        if self.text is None or self.request is None:
            return 0
        return max(0, min(self.request.length, len(self.text) - self.request.start))


def read_rounds(request: RoundsRequest) -> Rounds:
    ended = yield from _rounds(request, relisting := _Relisting())
    return replace(ended, relisted=True) if relisting.answered else ended


@dataclass(slots=True)
class _Relisting:
    """Round 1 went again listed (`tried`), and that was answered (`answered`)."""

    tried: bool = False
    answered: bool = False


def _rounds(request: RoundsRequest, relisting: _Relisting) -> Rounds:
    wire, sent = request.wire, dict(request.sent)
    messages: list[JSON] = list(wire.messages(sent))
    body, used = request.body, 0
    # Round 1's bytes hold each part of `sent` as sent (what it kept of the client's
    # request as the client's bytes): later rounds write those parts the same way.
    source = ClientJSON(body, request.sent)
    while True:
        reply = yield SendRound(body, used + 1)
        refused = isinstance(reply, Failed) and reply.outcome == REFUSED and used == 0
        if refused and request.relist is not None and not relisting.tried:
            # Refused with read_result deferred: once more listed, the same plan (a
            # refusal of that too is the client's answer: it was about something else).
            sent = wire.listed(sent, request.relist)
            messages = list(wire.messages(sent))
            body, relisting.tried = source.encode(sent), True
            continue
        if isinstance(reply, Failed):
            return Ended(reply.outcome, used, failed=True)
        assert isinstance(reply, Answered)
        relisting.answered = relisting.tried
        round_ = reply.round
        if not round_.wants_reads_only:
            return Ended("complete", used)
        if used >= request.policy.max_read_rounds:
            return _stopped("limit", used, request)
        fetched = yield from _fetch(request, round_.reads)
        fitted = _fitted(request, sent, messages, round_, fetched)
        if fitted is None:
            return _stopped("window", used, request)
        messages, fields, tokens = fitted
        topped = yield TopUp(tokens, wire.max_output({**sent, **fields}))
        assert isinstance(topped, ToppedUp)
        if not topped.ok:
            return _stopped("budget", used, request)
        used += 1
        body = source.encode({**sent, **fields})


def _stopped(why: str, used: int, request: RoundsRequest) -> Ended:
    return Ended(why, used, STOP_NOTES[why].format(rounds=request.policy.max_read_rounds))


def _fetch(
    request: RoundsRequest, reads: Iterable[ReadCall]
) -> Generator[RoundCommand, RoundReply, list[Fetched]]:
    """Each call checked, and the slices it may read asked of the store at once."""
    fetched: list[Fetched] = []
    asked: list[tuple[Fetched, str]] = []  # the calls the store is asked for, and their refs
    for call in reads:
        read = parse_read_args(call.input, request.policy.read_length)
        if isinstance(read, str):
            fetched.append(Fetched(call.id, error=read))
        elif read.ref not in request.refs:
            # Blobs are kept once per tenant; a conversation reads only the refs its own
            # history names (a ref copied from elsewhere reads as missing).
            fetched.append(Fetched(call.id, error=unknown_ref(read.ref)))
        else:
            fetched.append(Fetched(call.id, read))
            asked.append((fetched[-1], read.ref))
    if not asked:
        return fetched
    got = yield ReadResults(tuple(ref for _, ref in asked))
    assert isinstance(got, Results)
    for (one, ref), text, unavailable in zip(asked, got.texts, got.unavailable, strict=True):
        if unavailable:
            one.error = UNAVAILABLE
        elif text is None:
            one.error = unknown_ref(ref)
        else:
            one.text = text
    return fetched


def _fitted(
    request: RoundsRequest,
    sent: dict[str, Any],
    messages: list[JSON],
    round_: Round,
    fetched: list[Fetched],
) -> tuple[list[JSON], JSON, int] | None:
    """The next round's history, its top-level fields and its calibrated estimate, the
    slices shortened until it fits the window; None when even the shortest would not."""
    wire = request.wire
    factor = max(1.0, request.factor)
    limit = math.floor(request.policy.window * (1 - WINDOW_MARGIN))
    lengths = [f.slice_length for f in fetched]
    for _ in range(FIT_ATTEMPTS):
        results = [f.result(n) for f, n in zip(fetched, lengths, strict=True)]
        following = wire.continue_messages(messages, round_, results)
        fields = wire.with_history(sent, following, None)
        payload = {**sent, **fields}
        counted = count_tokens(wire, request.counter, payload, wire.messages(payload))
        real = math.ceil(counted.total * factor)
        if real <= limit:
            return following, fields, real
        # What the slices must give up, in characters at their own density.
        chars = sum(lengths)
        tokens = max(1, sum(counted.counts[len(messages) + 1 :]))
        over = math.ceil((real - limit) / factor)
        if not shorten(lengths, math.ceil(over * max(1.0, chars / tokens) * 1.1)):
            return None
    return None


def shorten(lengths: list[int], chars: int) -> bool:
    """Take up to `chars` characters off the longest slices first, none below MIN_SLICE;
    False when none could give anything (the round cannot get smaller)."""
    cut = False
    for i in sorted(range(len(lengths)), key=lambda n: -lengths[n]):
        take = min(max(0, lengths[i] - MIN_SLICE), chars)
        if take > 0:
            lengths[i] -= take
            chars -= take
            cut = True
    return cut
