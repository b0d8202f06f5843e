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
from dataclasses import dataclass, field, replace
from typing import Any, assert_never

from proxy import tracing
from proxy.core.calibration import calibrates
from proxy.core.commands import GetSummary
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
from proxy.core.policy import DEFAULT_POLICIES, Policy, PolicyError, parse_policies, policy_for
from proxy.core.rounds import RoundsRequest
from proxy.core.segments import StubbedMemo
from proxy.core.tokens import TokenCounter, default_counter
from proxy.core.usage import Usage
from proxy.core.wire_format import Request, WireFormat
from proxy.server.bodies import Incoming, off_loop
from proxy.server.calibration import Calibration
from proxy.server.executor import StoreExecutor, drive
from proxy.server.record import RequestRecord
from proxy.server.summariser import (
    FREE_SUMMARIES,
    SummariserFailed,
    SummariserSettings,
    SummaryBudget,
    SummaryCall,
)
from proxy.server.tasks import stop_tasks
from proxy.store import Store

log = logging.getLogger(__name__)

DEFAULT_OFF_LOOP_BYTES = 256 * 1024


@dataclass(frozen=True, slots=True)
class Prepared:
    """What goes upstream for one request, and what the rest of its exchange needs."""

    body: bytes  # the bytes to send
    sent: Mapping[str, Any] | None  # ... parsed (the client's payload when untouched)
    model: str = ""
    estimate: int = 0  # estimated input tokens of what is sent (0: not counted)
    headers: tuple[tuple[str, str], ...] = ()  # x-compaction-* for the client
    refusal: ProxyError | None = None  # answer with this, send nothing
    tool: str | None = None  # read_result was injected under this name
    rounds: RoundsRequest | None = None  # ... and its answer's read rounds start from this
    tenant: str = ""
    conversation: str = ""
    policy: Policy = field(default_factory=Policy)
    sample: bool = False  # feed calibration with the first round's usage
    # Calibration (real / estimated), looked up once for the request and carried to its
    # budget reservation and its read rounds (1.0 for a body never read).
    factor: float = 1.0


POLICY_MEMO_SIZE = 4096


def calibrated_as(wire: Request, model: str) -> str:
    """The name a model's calibration factor is kept under: per format as well (the
    same model's Chat and Responses requests are counted with different errors)."""
    return f"{wire.name}:{model}"


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


SUMMARY_AHEAD = "compaction.summary_ahead"  # the span of background work's trace


async def _no_summariser(need: GetSummary) -> tuple[str, Usage | None]:
    raise SummariserFailed("no summariser given for this request")


@dataclass(frozen=True, slots=True)
class Asked:
    """Who asks for a request's compaction, and with what: what an exchange knows of its
    caller and its upstream when it asks."""

    headers: Mapping[str, str]  # the client's (conversation ids, the credential)
    model: str  # the model asked for (its envelope's: in the body, or in the path)
    betas: str = ""  # its betas, one comma list
    tenant: str | None = None  # a proxy key's; None: the hash of the forwarded credential
    policy_override: Mapping[str, int] | None = None  # a key's or team's numbers
    spend: SummaryBudget = FREE_SUMMARIES  # what summaries made for it may spend
    summarise: SummaryCall = _no_summariser  # the summariser call, through its upstream


class Compactor:
    """Per-process compaction state: policies, the counter, calibration. `on_*`: told of
    each summariser call made in the background (True: it answered), of how many lines
    each load found, and of how many lines a crossing evicted (metrics count them)."""

    def __init__(
        self,
        raw_policies: Sequence[Mapping[str, Any]] = (),
        *,
        counter: TokenCounter | None = None,
        summariser: SummariserSettings | None = None,
        max_lines: int = DEFAULT_MAX_LINES,
        off_loop_bytes: int = DEFAULT_OFF_LOOP_BYTES,
        on_background_summary: Callable[[bool], None] = _ignore,
        on_lines: Callable[[float], None] = _ignore_number,
        on_evicted: Callable[[float], None] = _ignore_number,
    ) -> None:
        self.max_lines = max_lines
        self.off_loop_bytes = off_loop_bytes
        self.policies = [*parse_policies(raw_policies), *DEFAULT_POLICIES]
        self.counter = counter or default_counter()
        self.summariser = summariser or SummariserSettings()
        self.calibration = Calibration()
        self._background: set[asyncio.Task[None]] = set()
        # (model, 1M beta asked) -> its policy (a glob match and a table lookup each)
        self._policy_of: dict[tuple[str, bool], Policy] = {}
        self._warned: set[str] = set()  # models not in the model table, warned of once
        self.stubbed: StubbedMemo = {}  # stubbed messages built, shared by all requests
        self.on_background_summary = on_background_summary
        self.on_lines = on_lines
        self.on_evicted = on_evicted

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

    def factor(self, wire: Request, model: str, store: Store | None, tenant: str) -> float:
        """The tenant's calibration factor for the model, in this format."""
        return self.calibration.factor(calibrated_as(wire, model), store, tenant)

    async def count(
        self, wire: Request, body: Mapping[str, Any], size: int, *, digests: bool = True
    ) -> Counted:
        """The request counted (`count_request`; `digests=False`: `count_tokens`, the
        counts alone); a cold count of a big history takes tens of ms: off the loop then
        (tiktoken encodes without the GIL)."""
        how = count_request if digests else count_tokens
        return await off_loop(
            size, self.off_loop_bytes, how, wire, self.counter, body, wire.messages(body)
        )

    async def reservation(self, wire: Request, prepared: Prepared) -> int:
        """The calibrated estimate of what is sent, for budgets (counted now when the
        body's size proved it small and nothing was counted)."""
        sent = prepared.sent
        assert sent is not None  # a body budgets cannot read was refused when read
        estimate = prepared.estimate
        if estimate == 0:
            estimate = (await self.count(wire, sent, len(prepared.body), digests=False)).total
        return int(estimate * max(1.0, prepared.factor) + 0.999)

    def calibrate(
        self,
        wire: Request,
        prepared: Prepared,
        reported: Usage | None,
        store: Store | None,
        tenant: str,
    ) -> None:
        """Feed the tenant's calibration with what the upstream `reported` for the first
        round against the estimate of what was sent (not from requests with media
        blocks, whose estimate is a flat guess)."""
        if not prepared.sample or prepared.estimate <= 0 or not prepared.model:
            return
        if reported is None or reported.total_input <= 0:
            return
        if prepared.sent is None or not calibrates(prepared.sent):
            return
        self.calibration.record(
            calibrated_as(wire, prepared.model),
            prepared.estimate,
            reported.total_input,
            store,
            tenant,
        )

    async def prepare(
        self,
        incoming: Incoming,
        wire: WireFormat,
        store: Store | None,
        asked: Asked,
        record: RequestRecord,
    ) -> Prepared:
        """What goes upstream for `incoming`: rewritten over its trigger, else as it came.
        Never raises for the proxy's own parts: on any failure of compaction the request
        goes out untouched (degrade, never fail); a key's policy override that does not
        fit the model (the config may have changed since it was set) gives way to the
        model's own policy."""
        payload = incoming.payload
        if payload is None:
            return Prepared(incoming.body, None)
        model = asked.model
        tenant = asked.tenant or tenant_of(asked.headers)
        factor = self.factor(wire, model, store, tenant)
        untouched = Prepared(incoming.body, payload, model, factor=factor)
        if incoming.encoded:
            return untouched
        override = asked.policy_override
        for attempt in (1, 2):
            try:
                return await self._prepare(
                    incoming, payload, wire, store, asked, override, tenant, factor, record
                )
            except PolicyError as e:
                if override is None or attempt == 2:
                    log.exception("compaction failed; forwarding the request untouched")
                    return untouched
                log.warning("the key's policy override does not fit this model (%s); ignored", e)
                override = None
            except Exception:
                log.exception("compaction failed; forwarding the request untouched")
                return untouched
        return untouched

    async def _prepare(
        self,
        incoming: Incoming,
        body: Mapping[str, Any],
        wire: WireFormat,
        store: Store | None,
        asked: Asked,
        override: Mapping[str, int] | None,
        tenant: str,
        factor: float,
        record: RequestRecord,
    ) -> Prepared:
        body_bytes = incoming.body
        model = asked.model
        messages = wire.messages(body)
        if not messages:
            return Prepared(body_bytes, body, model, factor=factor)
        policy = self.policy(model, override, asked.betas)
        # Calibration is per tenant (one tenant's requests never skew another's counts),
        # and per format: each format's counting errs its own way.
        sample = self.calibration.wants_sample(calibrated_as(wire, model), tenant)
        uncounted = Prepared(body_bytes, body, model, policy=policy, factor=factor)
        if not sample and cannot_cross(body_bytes, policy, factor):
            return uncounted
        size = len(body_bytes)
        args = (wire, self.counter, body, messages)
        if sample:  # calibration wants this request's counts
            counted: Counted | None = await off_loop(
                size, self.off_loop_bytes, count_request, *args
            )
        else:
            counted = await off_loop(
                size, self.off_loop_bytes, count_unless_quiet, *args, policy, factor
            )
        if counted is None:  # its new messages' bytes alone prove it under every threshold
            return uncounted
        request = CompactionRequest(
            wire,
            body,
            messages,
            counted,
            wire.counter(self.counter),
            policy,
            factor,
            ClientJSON(body_bytes, body),
            stubbed=self.stubbed,
            now=int(time.time()),
            renew_every=renew_every(store),
            max_lines=self.max_lines,
            read_result=incoming.read_result,
            model=model,
        )
        executor = StoreExecutor(
            store,
            functools.partial(identities, wire, body, asked.headers, tenant),  # tenant known
            summariser=self.summariser,
            summarise=asked.summarise,
            background=self.spawn,
            count=self.counter.count_text,
            spend=asked.spend,
            on_background_call=self.on_background_summary,
            on_lines=self.on_lines,
            on_evicted=self.on_evicted,
        )
        # Planning a huge history takes seconds of pure work: off the event loop.
        off = size > self.off_loop_bytes
        try:
            decision = await drive(compaction(request), executor, off_loop=off)
        finally:
            await executor.close()
        prepared = Prepared(
            body_bytes,
            body,
            model,
            decision.estimate,
            policy=policy,
            sample=sample,
            factor=factor,
            tenant=executor.tenant if executor.identified else "",
            conversation=executor.conversation if executor.identified else "",
        )
        if executor.identified:
            record.conversation = prepared.conversation  # for the admin stats
        return self._finish(prepared, decision, wire, record)

    def _finish(
        self, prepared: Prepared, decision: Decision, wire: WireFormat, record: RequestRecord
    ) -> Prepared:
        if decision.summary_failure:
            log.info("no summary (%s); packing instead", decision.summary_failure)
        outcome = decision.outcome
        match outcome:
            case Refuse():
                record.refused, record.reason = True, outcome.reason
                return replace(prepared, refusal=ContextTooLong(outcome.message))
            case Untouched():
                if not outcome.reason:
                    return prepared
                # Over the trigger, its summary still being made ahead.
                record.reason = outcome.reason
                return replace(prepared, headers=(("x-compaction-reason", outcome.reason),))
            case Rewrite():
                assert decision.body is not None and decision.sent is not None
                _recorded(outcome, prepared.policy, record)
                rounds = None
                if outcome.tool is not None:
                    rounds = RoundsRequest(
                        wire,
                        decision.sent,
                        decision.body,
                        frozenset(outcome.refs),
                        self.counter,
                        prepared.policy,
                        prepared.factor,
                    )
                return replace(
                    prepared,
                    body=decision.body,
                    sent=decision.sent,
                    headers=_told(outcome),
                    tool=outcome.tool,
                    rounds=rounds,
                )
            case _:
                assert_never(outcome)


def _recorded(rewrite: Rewrite, policy: Policy, record: RequestRecord) -> None:
    """Say what a rewrite did: on the record and in a trace event."""
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


def _told(rewrite: Rewrite) -> tuple[tuple[str, str], ...]:
    """What the client's headers say of a rewrite."""
    headers = [
        ("x-compaction-strategy", rewrite.strategy.value),
        ("x-compaction-tokens-before", str(rewrite.tokens_before)),
        ("x-compaction-tokens-after", str(rewrite.tokens_after)),
        ("x-compaction-offloaded", str(len(rewrite.refs))),
        ("x-compaction-summary", rewrite.summary or "none"),
    ]
    if rewrite.reason:
        headers.append(("x-compaction-reason", rewrite.reason))
    return tuple(headers)
