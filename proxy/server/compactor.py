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
from typing import Any

import orjson

from proxy import tracing
from proxy.config import ServerSettings
from proxy.core.commands import GetSummary
from proxy.core.counting import (
    BOUNDED_FORMATS,
    Counted,
    cannot_cross,
    count_request,
    count_tokens,
    count_unless_quiet,
    history_quiet,
    text_system,
)
from proxy.core.deep_json import ORJSON_DEPTH, too_deep
from proxy.core.driver import CompactionRequest, compaction
from proxy.core.exact_json import ClientJSON
from proxy.core.identity import identities, tenant_of
from proxy.core.lines import DEFAULT_MAX_LINES
from proxy.core.model_facts import UNKNOWN_SOURCE, takes_tool_search, wants_1m
from proxy.core.per_request import per_request
from proxy.core.policy import DEFAULT_POLICIES, Policy, PolicyError, policy_for
from proxy.core.reuse import Reuse, Seen
from proxy.core.segments import StubbedMemo
from proxy.core.tokens import TokenCounter, default_counter
from proxy.core.usage import Usage
from proxy.core.wire_format import Request, WireFormat
from proxy.server.bodies import Incoming
from proxy.server.calibration import Calibration, calibrated_as
from proxy.server.driving import drive
from proxy.server.executor import StoreExecutor
from proxy.server.off_loop import off_loop
from proxy.server.prepared import Prepared, decided
from proxy.server.record import RequestRecord
from proxy.server.summariser import (
    FREE_SUMMARIES,
    SummariserFailed,
    SummariserSettings,
    SummaryBudget,
    SummaryCall,
)
from proxy.server.tasks import spawn_watched, stop_tasks
from proxy.store import Store
from proxy.wire.anthropic import searches_tools

log = logging.getLogger(__name__)

# A compactor built without settings (tests, benchmarks) takes the settings' defaults:
# server.off_loop_bytes, and server.reuse_max_bytes (bodies counted PARSED_FACTOR times
# their bytes: 1.2 MB for a 500 KB history).
DEFAULT_OFF_LOOP_BYTES = ServerSettings().off_loop_bytes
DEFAULT_REUSE_BYTES = ServerSettings().reuse_max_bytes


POLICY_MEMO_SIZE = 4096
# A body of up to this many times the quiet tokens (calibrated) has its history written
# out to be measured when the reuse cache has not laid it out (Claude Code's tools and
# system prompt alone are some 40 KB: its first turn, 49 KB with 10.6 KB of messages, is
# four times the default offload trigger, 12,000); a larger one is counted.
HISTORY_WRITTEN_SHARE = 8


def _ignore(ok: bool) -> None:
    return None


RENEW_EVERY = 600  # seconds: at most this late is an evicted blob found by a renewal


def renew_every(store: Store | None) -> int:
    """How often a conversation renews the TTLs of the refs it names: every 10 minutes,
    or a quarter of the TTL when that is shorter (a ref then always has 3/4 of it left)."""
    if store is None:
        return 0
    return max(1, min(RENEW_EVERY, store.default_ttl // 4))


def _ignore_number(value: float) -> None:
    return None


def _written_by_orjson(seen: Seen | None, body: Mapping[str, Any]) -> bool | None:
    """True when the reuse cache knows the body is orjson's writing of what it parsed
    (where each message lies: `Seen.layout`); None: not known, to be found if needed."""
    return True if seen is not None and seen.payload is body and seen.layout else None


def _history_bytes(
    seen: Seen | None,
    body: bytes,
    messages: Sequence[Mapping[str, Any]],
    policy: Policy,
    factor: float,
) -> tuple[int, bytes, int] | None:
    """The bytes of orjson's writing of the history: its size, and where to look for a
    `source` in it (bytes, start, end). Where the reuse cache laid the body out, read
    off its layout (the body itself is searched, in place); else written, when the body
    is small enough that its history may prove it quiet (None: not known)."""
    if seen is not None and seen.layout is not None and seen.raw is body:
        layout = seen.layout
        if len(layout.ends) == len(messages):
            end = layout.ends[-1] if layout.ends else layout.head
            return end - layout.head + 2, body, layout.head  # (+2: its brackets)
    if len(body) * factor > HISTORY_WRITTEN_SHARE * policy.quiet_tokens:
        return None  # a history this large is rarely quiet: counting decides
    try:
        written = orjson.dumps(messages)
    except orjson.JSONEncodeError:
        return None
    return len(written), written, 0


_SOURCE = b'"source"'


def _quiet_by_bytes(
    wire: Request,
    body_bytes: bytes,
    body: Mapping[str, Any],
    history: tuple[int, bytes, int],
    messages: int,
    policy: Policy,
    factor: float,
    seen: Seen | None,
) -> bool:
    """history_quiet, the `source` searched for (in the history's bytes, and the system
    prompt's blocks) only once the sizes say quiet. In a line's body (`seen`), the bytes
    its last request's search found without one (its messages this one repeats) are not
    searched again; what this search finds without one is noted for the next."""
    size, where, start = history
    if not history_quiet(wire, len(body_bytes), size, messages, False, policy, factor):
        return False
    end = start + size
    mine = seen is not None and where is seen.raw
    at = start
    if mine:
        assert seen is not None
        # (from a `source` that would start before the known end and finish after it)
        at = max(start, seen.unsourced - len(_SOURCE) + 1)
    if where.find(_SOURCE, at, end) >= 0:
        return False
    if mine:
        assert seen is not None
        seen.unsourced = max(seen.unsourced, end)
    return text_system(body)


def _new_bytes(seen: Seen | None, size: int) -> int:
    """Bytes of a body not parsed before: all of it, unless its line's last request was
    kept (then only what follows the messages it repeats is counted afresh)."""
    if seen is None or seen.layout is None or not seen.reused:
        return size
    return size - seen.layout.ends[seen.reused - 1]


SUMMARY_AHEAD = "compaction.summary_ahead"  # the span of background work's trace


def declined_for(error: Exception | None) -> str:
    """The DECLINED reason of a compaction that raised: "too_deep" for a body nested
    deeper than JSON is written, else "failed" (a fault of the proxy's)."""
    return "too_deep" if too_deep(error) else "failed"


async def _no_summariser(need: GetSummary) -> tuple[str, Usage | None]:
    raise SummariserFailed("no summariser given for this request")


@per_request
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
    # Set once the request's answer starts (or it ends): a summary made ahead goes up only
    # then, its prefix cached by this request (None: at once).
    answer_started: asyncio.Event | None = None
    upstream: str = ""  # where it goes (its URL): deferral refused is remembered per upstream


class Compactor:
    """Per-process compaction state: policies, the counter, calibration. `on_*`: told of
    each summariser call made in the background (True: it answered), of how many lines
    each load found, and of how many lines a crossing evicted (metrics count them)."""

    def __init__(
        self,
        policies: Sequence[Policy] = tuple(DEFAULT_POLICIES),
        *,
        counter: TokenCounter | None = None,
        summariser: SummariserSettings | None = None,
        max_lines: int = DEFAULT_MAX_LINES,
        off_loop_bytes: int = DEFAULT_OFF_LOOP_BYTES,
        reuse_bytes: int = DEFAULT_REUSE_BYTES,
        on_background_summary: Callable[[bool], None] = _ignore,
        on_lines: Callable[[float], None] = _ignore_number,
        on_evicted: Callable[[float], None] = _ignore_number,
    ) -> None:
        self.max_lines = max_lines
        self.off_loop_bytes = off_loop_bytes
        # What was computed for each conversation line's last request (core/reuse.py).
        self.reuse = Reuse(reuse_bytes)
        self.policies = list(policies)  # Settings.model_policies: parsed there, once
        self.counter = counter or default_counter()
        self.summariser = summariser or SummariserSettings()
        self.calibration = Calibration()
        self._background: set[asyncio.Task[None]] = set()
        # (model, 1M beta asked) -> its policy (a glob match and a table lookup each)
        self._policy_of: dict[tuple[str, bool], Policy] = {}
        self._wants_1m: dict[str, bool] = {}  # betas -> whether they ask for the 1M window
        self._tool_search: dict[str, bool] = {}  # betas -> whether they turn tool search on
        self._takes_deferral: dict[str, bool] = {}  # model -> takes_tool_search(model)
        # (upstream, model) where a deferred read_result was refused and the listed form
        # taken: this replica's memory (docs/compaction.md says why not the fleet's).
        self._refuses_deferral: set[tuple[str, str]] = set()
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
        task = spawn_watched(self._background, work, "compaction", context=context)
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

    def _searches_tools(self, betas: str) -> bool:
        """Whether tool search is on for requests with these betas, so read_result may join
        them deferred (memoised as `_wants_1m`: a client sends the same betas every time)."""
        found = self._tool_search.get(betas)
        if found is None:
            found = searches_tools(betas)
            if len(self._tool_search) >= POLICY_MEMO_SIZE:
                self._tool_search.clear()
            self._tool_search[betas] = found
        return found

    def may_defer(self, upstream: str, model: str) -> bool:
        """Whether read_result may join this model's requests deferred where the client
        did not turn tool search on: a model tool search is documented for, unless its
        upstream refused a deferral of it before (`deferral_refused`)."""
        takes = self._takes_deferral.get(model)
        if takes is None:
            takes = takes_tool_search(model)
            if len(self._takes_deferral) >= POLICY_MEMO_SIZE:
                self._takes_deferral.clear()
            self._takes_deferral[model] = takes
        return takes and (upstream, model) not in self._refuses_deferral

    def deferral_refused(self, upstream: str, model: str) -> None:
        """The upstream refused a request with read_result deferred and took it listed:
        this model's requests there go listed from now on (until the process restarts:
        an upstream that learns tool search is found again then)."""
        if (upstream, model) in self._refuses_deferral:
            return
        if len(self._refuses_deferral) >= POLICY_MEMO_SIZE:
            self._refuses_deferral.clear()  # (model names are bounded; a flood only resets it)
        self._refuses_deferral.add((upstream, model))
        log.warning(
            "upstream %s refused read_result deferred (tool search) for model %r and took"
            " it listed: its requests there go listed from now on",
            upstream,
            model[:100],
        )

    def policy(
        self, model: str, override: Mapping[str, int] | None = None, betas: str = ""
    ) -> Policy:
        """The model's policy; `betas` is the request's `anthropic-beta` (a model that
        reaches 1M only with `context-1m-...` gets that window when it is asked for)."""
        if override:
            return policy_for(model, self.policies, override, betas=betas)
        beta = self._wants_1m.get(betas)
        if beta is None:  # (a client sends the same betas with every request)
            beta = wants_1m(betas)
            if len(self._wants_1m) >= POLICY_MEMO_SIZE:
                self._wants_1m.clear()
            self._wants_1m[betas] = beta
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

    async def prepare(
        self,
        incoming: Incoming,
        wire: WireFormat,
        store: Store | None,
        asked: Asked,
        record: RequestRecord,
    ) -> Prepared:
        """What goes upstream for `incoming` (read: its payload parsed): rewritten over its
        trigger, else as it came. Never raises for the proxy's own parts: on any failure
        of compaction the request goes out untouched (degrade, never fail); a key's
        policy override that does not fit the model (the config may have changed since
        it was set) gives way to the model's own policy."""
        override = asked.policy_override
        failure: Exception | None = None
        for attempt in (1, 2):
            try:
                return await self._prepare(incoming, wire, store, asked, override, record)
            except PolicyError as e:
                failure = e
                if override is None or attempt == 2:
                    break
                log.warning("the key's policy override does not fit this model (%s); ignored", e)
                override = None
            except Exception as e:
                failure = e
                break
        reason = declined_for(failure)
        if reason == "too_deep":
            log.warning(
                "compaction declined (too_deep): the body nests values deeper than the"
                " proxy writes JSON (%d levels); forwarding the request untouched",
                ORJSON_DEPTH,
            )
        else:
            log.error("compaction failed; forwarding the request untouched", exc_info=failure)
        record.reason = reason
        tenant = asked.tenant or tenant_of(asked.headers)
        factor = self.factor(wire, asked.model, store, tenant)
        return Prepared(
            incoming.body,
            incoming.payload,
            asked.model,
            headers=(("x-compaction-reason", reason),),
            factor=factor,
            tenant=tenant,
        )

    async def _prepare(
        self,
        incoming: Incoming,
        wire: WireFormat,
        store: Store | None,
        asked: Asked,
        override: Mapping[str, int] | None,
        record: RequestRecord,
    ) -> Prepared:
        body_bytes, body, model = incoming.body, incoming.payload, asked.model
        assert body is not None
        policy = self.policy(model, override, asked.betas)
        tenant = asked.tenant or tenant_of(asked.headers)
        messages = wire.messages(body)
        # Calibration is per tenant (one tenant's requests never skew another's counts),
        # and per format: each format's counting errs its own way.
        calibrated = calibrated_as(wire, model)
        factor = self.calibration.factor(calibrated, store, tenant)
        untouched = Prepared(body_bytes, body, model, policy=policy, factor=factor, tenant=tenant)
        if incoming.encoded or not messages:  # an encoded body is never rewritten
            return untouched
        sample = self.calibration.wants_sample(calibrated, tenant)
        if not sample and cannot_cross(body_bytes, policy, factor):
            return untouched  # not counted: its size proves it under every threshold
        seen = incoming.seen
        if seen is not None and seen.payload is not body:
            seen = None  # (kept for another body than the one compacted)
        if not sample and wire.name in BOUNDED_FORMATS:
            history = _history_bytes(seen, body_bytes, messages, policy, factor)
            if history is not None and _quiet_by_bytes(
                wire, body_bytes, body, history, len(messages), policy, factor, seen
            ):
                return untouched  # not counted: its history's bytes prove it quiet
        # Off the loop when what is new to count is large (what the line's last request
        # repeats is counted already: proxy/core/reuse.py).
        size = _new_bytes(seen, len(body_bytes))
        args = (wire, self.counter, body, messages)
        tool_search = self._searches_tools(asked.betas)
        may_defer = self.may_defer(asked.upstream, model)
        defers = tool_search or may_defer  # (read_result's tokens counted as it will join)
        if sample:  # calibration wants this request's counts
            counted: Counted | None = await off_loop(
                size, self.off_loop_bytes, count_request, *args, seen, defers
            )
        else:
            counted = await off_loop(
                size,
                self.off_loop_bytes,
                count_unless_quiet,
                *args,
                policy,
                factor,
                seen,
                defers,
            )
        if counted is None:  # its new messages' bytes alone prove it under every threshold
            return untouched
        request = CompactionRequest(
            wire,
            body,
            messages,
            counted,
            wire.counter(self.counter),
            policy,
            factor,
            ClientJSON(
                body_bytes,
                body,
                _written_by_orjson(seen, body),
                seen.written if seen is not None else None,
            ),
            stubbed=self.stubbed,
            built=seen.built if seen is not None else None,
            now=int(time.time()),
            renew_every=renew_every(store),
            max_lines=self.max_lines,
            read_result=incoming.read_result,
            model=model,
            validated=seen.validated if seen is not None else None,
            tool_search=tool_search,
            may_defer=may_defer,
        )
        executor = StoreExecutor(
            store,
            functools.partial(identities, wire, body, asked.headers, tenant),  # tenant known
            summariser=self.summariser,
            summarise=asked.summarise,
            background=self.spawn,
            answer_started=asked.answer_started,
            count=self.counter.count_text,
            spend=asked.spend,
            on_background_call=self.on_background_summary,
            on_lines=self.on_lines,
            on_evicted=self.on_evicted,
            record=record,
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
            tenant=tenant,
            conversation=executor.conversation if executor.identified else "",
        )
        if executor.identified:
            record.conversation = prepared.conversation  # for the admin stats
        return decided(prepared, decision, wire, self.counter, record)
