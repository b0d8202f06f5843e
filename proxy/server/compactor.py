"""Compaction for one request: count it, run the driver, say what was done.

The order of work keeps the common case cheap: when the body's size alone proves the
history under the trigger, nothing is counted (nor when the cached counts of the
messages seen before and the bytes of the new ones prove it); when the count (cached per
message) is under it, no checkpoint can apply (one is only made when the history crossed), so the
original bytes go out without a Redis call. Only above the trigger does the driver
(proxy/core/driver.py) ask for the conversation's state, a summary, and the writes of a
crossing, which the executor (proxy/server/executor.py) carries out.
"""

from __future__ import annotations

import asyncio
import contextvars
import functools
import logging
import time
from collections.abc import Callable, Coroutine, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, assert_never

from proxy import tracing
from proxy.core.counting import (
    Counted,
    cannot_cross,
    count_request,
    count_tokens,
    count_unless_quiet,
)
from proxy.core.driver import CompactionRequest, Decision, compaction
from proxy.core.errors import ContextTooLong, ProxyError
from proxy.core.exact_json import ClientJSON
from proxy.core.identity import identities, tenant_of
from proxy.core.lines import DEFAULT_MAX_LINES
from proxy.core.model_facts import UNKNOWN_SOURCE, wants_1m
from proxy.core.outcome import Refuse, Rewrite, Untouched
from proxy.core.policy import DEFAULT_POLICIES, Policy, parse_policies, policy_for
from proxy.core.reuse import Reuse, Seen
from proxy.core.segments import StubbedMemo
from proxy.core.tokens import TokenCounter, default_counter
from proxy.core.wire_format import Request, WireFormat
from proxy.server.calibration import Calibration
from proxy.server.executor import StoreExecutor, drive
from proxy.server.record import RequestRecord, current_or_throwaway
from proxy.server.summariser import FREE_SUMMARIES, SummariserSettings, SummaryBudget, post_summary
from proxy.server.tasks import stop_tasks
from proxy.server.upstream import Upstream
from proxy.store import Store

log = logging.getLogger(__name__)

COUNT_OFF_LOOP_BYTES = 256 * 1024


@dataclass(slots=True)
class Prepared:
    """What goes upstream for one request, and what the rest of its handling needs."""

    body: bytes  # the bytes to send
    sent: Mapping[str, Any] | None  # ... parsed (the client's payload when untouched)
    model: str = ""
    estimate: int = 0  # estimated input tokens of what is sent (0: not counted)
    headers: tuple[tuple[str, str], ...] = ()  # x-compaction-* for the client
    refusal: ProxyError | None = None  # answer with this, send nothing
    tool: str | None = None  # read_result was injected under this name
    refs: frozenset[str] = frozenset()  # the refs the history sent names: all it may read
    tenant: str = ""
    conversation: str = ""
    policy: Policy = field(default_factory=Policy)
    sample: bool = False  # feed calibration with the first round's usage
    # Calibration (real / estimated), looked up once for the request and carried to its
    # budget reservation and its read rounds; None: not looked up (nothing was counted).
    factor: float | None = None

    @property
    def intercepts(self) -> bool:
        return self.tool is not None


POLICY_MEMO_SIZE = 4096
# Memory for what was computed for each conversation line's last request (its body
# bytes counted PARSED_FACTOR times): 1.2 MB for a 500 KB history.
DEFAULT_REUSE_BYTES = 256 * 1024 * 1024


def calibrated_as(wire: Request, model: str) -> str:
    """The name a model's calibration factor is kept under: per format as well (the
    same model's Chat and Responses requests are counted with different errors)."""
    return f"{wire.name}:{model}"


def factor_of(calibration: Calibration, wire: WireFormat, prepared: Prepared, tenant: str) -> float:
    """The request's calibration factor: the one its preparation looked up, else looked
    up now (a request compaction never counted), so a request looks it up once."""
    if prepared.factor is None:
        prepared.factor = calibration.factor(calibrated_as(wire, prepared.model), None, tenant)
    return prepared.factor


def _ignore(ok: bool) -> None:
    return None


RENEW_EVERY = 600  # seconds: at most this late is an evicted blob found by a renewal


def renew_every(store: Store | None) -> int:
    """How often a conversation renews the TTLs of the refs it names: every 10 minutes,
    or a quarter of the TTL when that is shorter (a ref then always has 3/4 of it left)."""
    if store is None:
        return 0
    return max(1, min(RENEW_EVERY, store.default_ttl // 4))


def betas_of(headers: Mapping[str, str]) -> str:
    """Every `anthropic-beta` value of the request, as one comma list."""
    return ",".join(v for k, v in headers.items() if k.lower() == "anthropic-beta")


def _ignore_number(value: float) -> None:
    return None


def _written_by_orjson(seen: Seen | None, body: Mapping[str, Any]) -> bool | None:
    """True when the reuse cache knows the body is orjson's writing of what it parsed
    (where each message lies: `Seen.layout`); None: not known, to be found if needed."""
    return True if seen is not None and seen.payload is body and seen.layout else None


def _new_bytes(seen: Seen | None, size: int) -> int:
    """Bytes of a body not parsed before: all of it, unless its line's last request was
    kept (then only what follows the messages it repeats is counted afresh)."""
    if seen is None or seen.layout is None or not seen.reused:
        return size
    return size - seen.layout.ends[seen.reused - 1]


SUMMARY_AHEAD = "compaction.summary_ahead"  # the span of background work's trace


class Compactor:
    """Per-process compaction state: policies, the counter, calibration."""

    def __init__(
        self,
        raw_policies: Sequence[Mapping[str, Any]] = (),
        *,
        counter: TokenCounter | None = None,
        summariser: SummariserSettings | None = None,
        max_lines: int = DEFAULT_MAX_LINES,
        reuse_bytes: int = DEFAULT_REUSE_BYTES,
    ) -> None:
        self.max_lines = max_lines
        # What was computed for each conversation line's last request (core/reuse.py).
        self.reuse = Reuse(reuse_bytes)
        self.policies = [*parse_policies(raw_policies), *DEFAULT_POLICIES]
        self.counter = counter or default_counter()
        self.summariser = summariser or SummariserSettings()
        self.calibration = Calibration()
        self._background: set[asyncio.Task[None]] = set()
        # (model, 1M beta asked) -> its policy (a glob match and a table lookup each)
        self._policy_of: dict[tuple[str, bool], Policy] = {}
        self._warned: set[str] = set()  # models not in the model table, warned of once
        self.stubbed: StubbedMemo = {}  # stubbed messages built, shared by all requests
        # Told of each summariser call made in the background (metrics count them).
        self.on_background_summary: Callable[[bool], None] = _ignore
        # Told how many lines each load found, and how many lines a crossing evicted.
        self.on_lines: Callable[[float], None] = _ignore_number
        self.on_evicted: Callable[[float], None] = _ignore_number

    def spawn(self, work: Coroutine[Any, Any, None]) -> None:
        """Work that outlives the request that started it (a summary made ahead), in a
        context of its own: nothing of the request's record or meter is touched."""
        context = contextvars.Context()
        active = tracing.ACTIVE
        # With tracing on: a trace of its own, linked to the request's span.
        ended = active.detached(SUMMARY_AHEAD, active.here(), context) if active else None
        task = asyncio.get_running_loop().create_task(work, context=context)
        self._background.add(task)
        task.add_done_callback(self._background.discard)
        if ended is not None:
            task.add_done_callback(ended)

    async def settled(self) -> None:
        """Wait for the background work started so far (tests, benchmarks, replay)."""
        while self._background:
            await asyncio.gather(*self._background, return_exceptions=True)

    async def close(self) -> None:
        """Stop the background work (summaries made ahead), within a deadline."""
        await stop_tasks(list(self._background), what="summary made ahead")
        await self.calibration.close()

    def policy(
        self, model: str, override: Mapping[str, int] | None = None, betas: str = ""
    ) -> Policy:
        """The model's policy; `betas` is the request's `anthropic-beta` (a model that
        reaches 1M only with `context-1m-...` gets that window when it is asked for)."""
        if override:
            return policy_for(model, self.policies, override, betas=betas)
        beta = wants_1m(betas)
        found = self._policy_of.get((model, beta))
        if found is None:
            found = policy_for(model, self.policies, betas=betas)
            if len(self._policy_of) >= POLICY_MEMO_SIZE:
                self._policy_of.clear()  # model names are bounded; a flood only resets it
            self._policy_of[(model, beta)] = found
            unknown = found.window_source.startswith(UNKNOWN_SOURCE)
            if unknown and model not in self._warned and len(self._warned) < POLICY_MEMO_SIZE:
                self._warned.add(model)
                log.warning(
                    "model %r is not in the model table: a window of %d tokens applies"
                    " (set one with a [[policy]] window)",
                    model[:100],
                    found.window,
                )
        return found

    async def count(
        self,
        wire: Request,
        body: Mapping[str, Any],
        size: int,
        *,
        digests: bool = True,
        seen: Seen | None = None,
    ) -> Counted:
        """The request counted (`count_request`; `digests=False`: `count_tokens`, the
        counts alone); `seen`: what was kept of the request's line (proxy/core/reuse.py)."""
        messages = wire.messages(body)
        how = count_request if digests else count_tokens
        if size > COUNT_OFF_LOOP_BYTES and _new_bytes(seen, size) > COUNT_OFF_LOOP_BYTES:
            # A cold count of a big history takes tens of ms: keep the loop free meanwhile
            # (tiktoken encodes without the GIL).
            return await asyncio.to_thread(how, wire, self.counter, body, messages, seen)
        return how(wire, self.counter, body, messages, seen)

    async def count_unless_quiet(
        self,
        wire: Request,
        body: Mapping[str, Any],
        size: int,
        policy: Policy,
        factor: float,
        seen: Seen | None = None,
    ) -> Counted | None:
        """`count`, or None when a bound proves the history quiet (counting.py)."""
        messages = wire.messages(body)
        args = (wire, self.counter, body, messages, policy, factor, seen)
        if size > COUNT_OFF_LOOP_BYTES and _new_bytes(seen, size) > COUNT_OFF_LOOP_BYTES:
            return await asyncio.to_thread(count_unless_quiet, *args)
        return count_unless_quiet(*args)

    async def prepare(
        self,
        body_bytes: bytes,
        body: Mapping[str, Any],
        headers: Mapping[str, str],
        *,
        wire: WireFormat,
        store: Store | None,
        upstream: Upstream,
        path: str,
        upstream_headers: Sequence[tuple[str, str]],
        tenant: str | None = None,
        policy_override: Mapping[str, int] | None = None,
        spend: SummaryBudget = FREE_SUMMARIES,
        read_result: bool = True,
        seen: Seen | None = None,
    ) -> Prepared:
        """`tenant` and `policy_override` come from a proxy key when keys are required
        (else the tenant is the hash of the forwarded credential); `spend` reserves the
        summaries made for the caller in its budgets; `read_result` False: the request
        may not be offered read_result (the planner then writes no stub naming it);
        `seen`: what was kept of the request's line, when its body was parsed by
        `Reuse.parse` (what was computed for its messages before is not made again)."""
        model = str(body.get("model", ""))
        messages = wire.messages(body)
        if not messages:
            return Prepared(body_bytes, body, model)
        policy = self.policy(model, policy_override, betas_of(headers))
        # Calibration is per tenant: one tenant's requests never skew another's counts.
        calibrated_for = tenant or tenant_of(headers)
        # ... and per format: each format's counting errs its own way.
        calibrated = calibrated_as(wire, model)
        factor = self.calibration.factor(calibrated, store, calibrated_for)
        sample = self.calibration.wants_sample(calibrated, calibrated_for)
        if not sample and cannot_cross(body_bytes, policy, factor):
            return Prepared(body_bytes, body, model, policy=policy, factor=factor)  # not counted
        if sample:  # calibration wants this request's counts
            counted: Counted | None = await self.count(wire, body, len(body_bytes), seen=seen)
        else:
            counted = await self.count_unless_quiet(
                wire, body, len(body_bytes), policy, factor, seen
            )
        if counted is None:  # its new messages' bytes alone prove it under every threshold
            return Prepared(body_bytes, body, model, policy=policy, factor=factor)  # uncounted
        counter = wire.counter(self.counter)
        request = CompactionRequest(
            wire,
            body,
            messages,
            counted,
            counter,
            policy,
            factor,
            ClientJSON(body_bytes, body, _written_by_orjson(seen, body)),
            stubbed=self.stubbed,
            built=seen.built if seen is not None else None,
            now=int(time.time()),
            renew_every=renew_every(store),
            max_lines=self.max_lines,
            read_result=read_result,
        )
        executor = StoreExecutor(
            store,
            functools.partial(identities, wire, body, headers, calibrated_for),  # tenant known
            summariser=self.summariser,
            summarise=functools.partial(
                post_summary,
                upstream=upstream,
                path=path,
                headers=upstream_headers,
                wire=wire,
                seconds=self.summariser.timeout,
            ),
            background=self.spawn,
            count=self.counter.count_text,
            spend=spend,
            on_background_call=self.on_background_summary,
            on_lines=self.on_lines,
            on_evicted=self.on_evicted,
        )
        # Planning a huge history takes seconds of pure work: off the event loop.
        off_loop = len(body_bytes) > COUNT_OFF_LOOP_BYTES
        try:
            decision = await drive(compaction(request), executor, off_loop=off_loop)
        finally:
            await executor.close()
        prepared = Prepared(
            body_bytes, body, model, decision.estimate, policy=policy, sample=sample, factor=factor
        )
        if executor.identified:
            prepared.tenant, prepared.conversation = executor.identity
            current_or_throwaway().conversation = prepared.conversation  # for the admin stats
        return self._finish(prepared, decision, policy)

    def _finish(self, prepared: Prepared, decision: Decision, policy: Policy) -> Prepared:
        record = current_or_throwaway()
        if decision.summary_failure:
            log.info("no summary (%s); packing instead", decision.summary_failure)
        outcome = decision.outcome
        match outcome:
            case Refuse():
                record.refused, record.reason = True, outcome.reason
                prepared.refusal = ContextTooLong(outcome.message)
            case Untouched():
                if outcome.reason:  # over the trigger, its summary still being made ahead
                    record.reason = outcome.reason
                    prepared.headers = (("x-compaction-reason", outcome.reason),)
            case Rewrite():
                assert decision.body is not None and decision.sent is not None
                prepared.body, prepared.sent = decision.body, decision.sent
                _rewritten(prepared, outcome, policy, record)
            case _:
                assert_never(outcome)
        return prepared


def _rewritten(prepared: Prepared, rewrite: Rewrite, policy: Policy, record: RequestRecord) -> None:
    """Say what a rewrite did: on the record, in a trace event, in the client's headers."""
    strategy = rewrite.strategy
    record.strategy = strategy
    record.reason = rewrite.reason
    record.tokens_before, record.tokens_after = rewrite.tokens_before, rewrite.tokens_after
    record.offloaded = len(rewrite.blobs)
    record.summary = rewrite.summary if strategy.crossing else ""
    if strategy.folded:
        tracing.event(
            "compaction.fold" if strategy.summarised else "compaction.pack",
            {
                "compaction.strategy": strategy.value,
                "compaction.tokens_before": rewrite.tokens_before,
                "compaction.tokens_after": rewrite.tokens_after,
                "compaction.summary": rewrite.summary or "none",
                "compaction.reason": rewrite.reason or "none",
            },
        )
    if strategy.crossing and rewrite.tokens_after > policy.trigger_tokens:
        log.warning(
            "history still %d tokens after compaction, above the trigger %d (%s)",
            rewrite.tokens_after,
            policy.trigger_tokens,
            rewrite.reason or "target_unreachable",
        )
    headers = [
        ("x-compaction-strategy", strategy.value),
        ("x-compaction-tokens-before", str(rewrite.tokens_before)),
        ("x-compaction-tokens-after", str(rewrite.tokens_after)),
        ("x-compaction-offloaded", str(len(rewrite.refs))),
        ("x-compaction-summary", rewrite.summary or "none"),
    ]
    if rewrite.reason:
        headers.append(("x-compaction-reason", rewrite.reason))
    prepared.headers = tuple(headers)
    prepared.tool = rewrite.tool
    prepared.refs = frozenset(rewrite.refs)
