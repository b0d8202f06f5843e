"""What happened to the request being handled, noted from anywhere below the handler.

The metrics middleware opens a `RequestRecord` per request and makes it current (a
context variable, so it follows the handler's task and the tasks it spawns). The
middlewares and the handlers read it and hand it to what is below them (the exchange,
the compactor and its executor: docs/design.md#state); with no record current
(benchmarks, the replay command) `current()` is None. The record
holds the request's one `UsageMeter`: the relay and the read_result rounds feed it, and
metrics, calibration and budgets read it. Only numbers and fixed words are recorded,
never prompt text or credentials.
"""

from __future__ import annotations

import os
import random
import time
from collections.abc import Callable
from contextvars import ContextVar, Token
from dataclasses import dataclass, field

from proxy.core.strategy import Strategy, strategy_word
from proxy.core.usage import UsageMeter, UsageScan


@dataclass(slots=True)
class RequestRecord:
    request_id: str
    route: str
    method: str
    started: float = field(default_factory=time.perf_counter)
    upstream_sent: float | None = None  # perf_counter when the upstream request went out
    upstream_answered: float | None = None  # ... and when its response headers came
    interception_seconds: float = 0.0  # read_result work between rounds
    meter: UsageMeter = field(default_factory=UsageMeter)  # every upstream answer's usage
    model: str = ""  # the request's model, when it names one
    read_rounds: int = 0
    read_outcome: str = ""  # how read_result rounds ended: complete, limit, window, budget,
    # upstream_error, broken ("" when the answer was relayed as bytes)
    strategy: Strategy | None = None  # the rewrite's; None: untouched, or refused
    refused: bool = False  # refused as too long: nothing fits the window
    reason: str = ""  # why the outcome differs from what the policy aimed at
    tokens_before: int = 0
    tokens_after: int = 0
    offloaded: int = 0  # results newly offloaded by this request
    summary: str = ""  # outcome.SUMMARY_STATES, or ""
    summariser_calls: int = 0
    summariser_failures: int = 0
    upstream_request_id: str = ""
    # For the admin stats (proxy/server/admin/stats.py): ids and fixed words only.
    conversation: str = ""  # the conversation id, when the compactor made it
    key_id: str = ""  # the proxy key's id and team
    team: str = ""
    rejected: str = ""  # why a key or budget check refused the request ("tokens", ...)
    trace_id: str = ""  # the request's trace (hex) when it is traced and sampled
    # Told once, when the upstream answer starts (a summary made ahead waits for it: the
    # request's prefix is in the provider's cache from then on).
    on_answer: Callable[[], None] | None = None

    def reads_answers_as(self, scan: UsageScan | None) -> None:
        """The wire format whose answers this request relays (how usage is read)."""
        self.meter.scan = scan

    def own_seconds(self, ended: float) -> float:
        """The proxy's own time: before the upstream request went out, plus the work
        between read_result rounds (all of it when nothing was sent upstream)."""
        before = (self.upstream_sent if self.upstream_sent is not None else ended) - self.started
        return before + self.interception_seconds

    def compaction_fields(self) -> dict[str, str | int]:
        """What compaction did, for the request's log line and its span (under
        `compaction.`): the strategy always; the rest only when it happened."""
        out: dict[str, str | int] = {"strategy": self.strategy_word or "none"}
        if self.reason:
            out["reason"] = self.reason
        if self.strategy is not None:
            out["tokens_before"] = self.tokens_before
            out["tokens_after"] = self.tokens_after
        if self.offloaded:
            out["offloaded"] = self.offloaded
        if self.summary:
            out["summary"] = self.summary
        if self.read_rounds:
            out["read_rounds"] = self.read_rounds
        if self.read_outcome:
            out["read_outcome"] = self.read_outcome
        return out

    @property
    def strategy_word(self) -> str:
        """What compaction did, for the log line and the span (`strategy.strategy_word`)."""
        return strategy_word(self.strategy, self.refused)

    def sending(self) -> None:
        if self.upstream_sent is None:
            self.upstream_sent = time.perf_counter()

    def answered(self, request_id: str = "") -> None:
        if self.upstream_answered is None:
            self.upstream_answered = time.perf_counter()
            self.upstream_request_id = request_id[:64]
        told, self.on_answer = self.on_answer, None
        if told is not None:
            told()


# A request's id only ties its log line, span and admin stats together: it need not be
# unguessable, so it comes from a generator seeded once rather than a system call each.
_IDS = random.Random(os.urandom(16))
os.register_at_fork(after_in_child=lambda: _IDS.seed(os.urandom(16)))


def new_record_id() -> str:
    return f"{_IDS.getrandbits(64):016x}"


_current: ContextVar[RequestRecord | None] = ContextVar("compaction_proxy_request", default=None)


def begin(record: RequestRecord) -> Token[RequestRecord | None]:
    return _current.set(record)


def end(token: Token[RequestRecord | None]) -> None:
    _current.reset(token)


def current() -> RequestRecord | None:
    return _current.get()


def current_or_throwaway() -> RequestRecord:
    """The current record, or a throwaway one outside a request (benchmarks, tools)."""
    record = _current.get()
    return record if record is not None else RequestRecord("", "", "")
