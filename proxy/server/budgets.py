"""Budget admission for one request: reserve before forwarding, settle after.

The key-check middleware (proxy/server/auth.py) wraps every handler of a key's request
in a `Ticket`; a request's `Budget` (`budget_of`) is what its exchange is given. Every
route that makes the upstream spend tokens makes one call after it has read the request
and before forwarding, which raises `BudgetRefused` (429) or `StoreUnavailable` (503,
failing closed) when the request may not go:

    await budget.reserve(estimated_input, output_tokens, sent)

The conversation routes (proxy/server/exchange.py) call it after compaction; the metered
pass-through calls (proxy/server/passthrough.py: /v1/complete, /v1/completions,
/v1/embeddings, /v1/responses while it passes through, message batches) call it with an
estimate of their body. `output_tokens` comes from `output_reservation` (the request's
largest output cap times its choices), so any route reserving through here is counted the
same way.

The relay, the read_result rounds and the summariser report what the upstream used to the
request's meter (proxy/server/record.py), which the ticket reads at the end. When the
handler ends, however it ends (an answer, an upstream error, an exception, a client that
disconnects and cancels it), the reservation is settled to the metered usage in a
background task that cancellation cannot stop. An upstream error reports no usage, so it
settles to nothing: a refund. A batch is charged its whole reservation once the upstream
accepted it (its usage comes later, in its results).
"""

from __future__ import annotations

import asyncio
import logging
import re
import time
from collections.abc import Callable
from functools import partial
from types import TracebackType

from aiohttp import web

from proxy.core.budget import DEFAULT_MAX_OUTPUT, Amounts, over_limit_message, reservation
from proxy.core.errors import BudgetRefused
from proxy.core.errors import StoreUnavailable as CannotCheck
from proxy.core.usage import Usage, UsageMeter
from proxy.server.caller import Caller, caller_of, count_rejection
from proxy.server.fleet import FLEET, Fleet
from proxy.server.record import current_or_throwaway
from proxy.server.state import SETTINGS
from proxy.server.summariser import FREE_SUMMARIES, SummaryBudget
from proxy.store import StoreUnavailable
from proxy.store.accounts import Held, Refused

log = logging.getLogger(__name__)

STORE_DOWN_RETRY_AFTER = 2  # seconds a fail-closed refusal asks the client to wait


class Ticket:
    """One request's budgets, reserved and settled, given what it uses: the caller, the
    fleet's accounts and settlements, what to do while the store is down (the
    `budgets.on_store_down` setting), how a refusal is counted (`rejected(reason)`), and
    the request's one meter (the usage its answer reports)."""

    def __init__(
        self,
        caller: Caller,
        fleet: Fleet,
        on_store_down: str,
        rejected: Callable[[str], None],
        meter: UsageMeter,
    ) -> None:
        self.caller = caller
        self._fleet = fleet
        self._on_store_down = on_store_down
        self._rejected = rejected
        self.meter = meter
        self.held: list[Held] = []
        self.reserved = Amounts()  # summed over the reservation and its top-ups
        self.one_hour_cache = False
        self.uncounted = False  # admitted (in part) without a reservation: Redis was away
        self.charge_reserved = False  # charge the reservation whole (a batch)
        self.gate = Amounts()  # held by the gate, part of the request's reservation

    async def reserve(
        self, estimated_input: int, max_tokens: int, *, one_hour_cache: bool = False
    ) -> None:
        """Hold the estimate in every budget of the caller, or raise the refusal
        (BudgetRefused over budget, StoreUnavailable when failing closed or past the
        outage allowance)."""
        caller = self.caller
        if not caller.scopes and not caller.limits_unknown:
            return
        want = reservation(estimated_input, max_tokens, one_hour_cache=one_hour_cache)
        self.one_hour_cache = one_hour_cache
        # What the gate already holds for this request is part of it: only the rest.
        want, self.gate = _at_least_zero(want.minus(self.gate)), Amounts()
        if want == Amounts():
            return
        refusal = await self._hold(want, give_back_all=True)
        if refusal is not None:
            raise refusal

    async def admit(self, max_tokens: int, *, one_hour_cache: bool = False) -> None:
        """The gate, before any work for the request that costs the upstream money
        (compaction's summaries, the forward, read rounds): hold what the request is
        sure to cost (its output cap and one input token), or raise the refusal. A key
        already at a limit is refused here, before anything is spent for it."""
        caller = self.caller
        if not caller.scopes and not caller.limits_unknown:
            return
        want = reservation(1, max_tokens, one_hour_cache=one_hour_cache)
        self.one_hour_cache = one_hour_cache
        refusal = await self._hold(want, give_back_all=True)
        if refusal is not None:
            raise refusal
        self.gate = want

    async def hold_apart(self, estimated_input: int, max_tokens: int) -> Apart | None:
        """Reserve work done for the caller that outlives the request (a summary made
        ahead) on its own, apart from the request's reservation (which may be topped up
        meanwhile): None when a budget refuses it, else what settles it."""
        caller = self.caller
        if not caller.scopes and not caller.limits_unknown:
            return Apart(self, [], uncounted=False)
        want = reservation(estimated_input, max_tokens, one_hour_cache=False)
        refusal, held, uncounted = await self._attempt(want, counts_rejection=False)
        return None if refusal is not None else Apart(self, held, uncounted=uncounted)

    async def top_up(self, estimated_input: int, max_tokens: int) -> bool:
        """Hold one more upstream call of this request (a read_result round: its whole
        input and up to `max_tokens` of output) on top of what is held; False when a
        budget refuses it (what was held before stays held until settled)."""
        caller = self.caller
        if not caller.scopes and not caller.limits_unknown:
            return True
        want = reservation(estimated_input, max_tokens, one_hour_cache=self.one_hour_cache)
        return await self._hold(want, give_back_all=False) is None

    async def _hold(
        self, want: Amounts, *, give_back_all: bool
    ) -> BudgetRefused | CannotCheck | None:
        refusal, held, uncounted = await self._attempt(want)
        if refusal is None and not uncounted:
            self.held.extend(held)
            self.reserved = self.reserved.plus(want)
            return None
        if give_back_all and self.held:
            earlier, self.held = self.held, []
            self._settle(earlier, Amounts())  # in the background: the answer does not wait
        if refusal is None:  # admitted uncounted: Redis is away
            self.uncounted = True
            self.reserved = self.reserved.plus(want)
        return refusal

    async def _attempt(
        self, want: Amounts, *, counts_rejection: bool = True
    ) -> tuple[BudgetRefused | CannotCheck | None, list[Held], bool]:
        """Reserve `want` in every budget of the caller, changing nothing of the ticket:
        (the refusal or None, what is held, whether it was admitted uncounted)."""
        caller = self.caller
        fleet = self._fleet
        accounts = fleet.accounts()
        if accounts is None or caller.limits_unknown:
            refusal = self._store_down(want)
            return refusal, [], refusal is None
        now = time.time()
        # The key's and the team's scripts run at once (one slot each): a refusal by
        # either gives back what the other took, so neither is ever over-admitted.
        outcomes = await asyncio.gather(
            *(fleet.call(lambda s=s: accounts.reserve(s, want, now)) for s in caller.scopes),  # type: ignore[misc]
            return_exceptions=True,
        )
        held = [o for o in outcomes if isinstance(o, Held)]
        refused = next((o for o in outcomes if isinstance(o, Refused)), None)
        failed = next((o for o in outcomes if isinstance(o, BaseException)), None)
        if refused is None and failed is None:
            return None, held, False
        if held:  # in the background: the answer (429 or 503) does not wait for it
            self._settle(held, Amounts())
        if refused is not None:
            return self._over_budget(refused, want, counts_rejection), [], False
        if not isinstance(failed, StoreUnavailable):
            raise failed  # type: ignore[misc]
        refusal = self._store_down(want)
        return refusal, [], refusal is None

    def _over_budget(self, refused: Refused, want: Amounts, counts: bool = True) -> BudgetRefused:
        if counts:
            self._rejected("tokens")
        wanted = dict(zip(("input", "output", "weighted"), want.as_tuple(), strict=True))
        message = over_limit_message(
            refused.scope.label,
            refused.period,
            refused.metric,
            refused.used,
            wanted[refused.metric],
            refused.limit,
        )
        return BudgetRefused(message, retry_after=refused.retry_after)

    def _store_down(self, want: Amounts) -> CannotCheck | None:
        """Redis cannot hold the reservation: admit it uncounted ("open", within this
        replica's allowance for the key) or say why not."""
        fleet = self._fleet
        key_id = self.caller.key_id or ""
        if self._on_store_down == "open":
            if fleet.admit_uncounted(key_id, want, new=not self.uncounted):
                return None
            self._rejected("outage_allowance")
            return CannotCheck(
                "compaction-proxy cannot check budgets right now (its store is unreachable)"
                " and this key has used what may go uncounted meanwhile; retry shortly",
                retry_after=STORE_DOWN_RETRY_AFTER,
            )
        self._rejected("store_unavailable")
        return CannotCheck(
            "compaction-proxy cannot check budgets right now (its store is unreachable);"
            " retry shortly",
            retry_after=STORE_DOWN_RETRY_AFTER,
        )

    def _settle(self, held: list[Held], actual: Amounts) -> None:
        """Replace what `held` reserved by `actual`. A scope holds several reservations
        once read_result rounds topped it up: its first takes the whole usage, the
        others are given back (to their own buckets, should a period have turned)."""
        charged: set[object] = set()
        for h in held:
            first = h.scope not in charged
            charged.add(h.scope)
            self._fleet.settle_later(h.counters, (actual if first else Amounts()).minus(h.amounts))

    def _used(self) -> Amounts:
        if self.charge_reserved:
            return self.reserved if self.meter.seen_answer else Amounts()
        return self.meter.cost(self.reserved)

    # -- the block -----------------------------------------------------------------------

    async def __aenter__(self) -> Ticket:
        return self

    async def __aexit__(
        self,
        kind: type[BaseException] | None,
        error: BaseException | None,
        trace: TracebackType | None,
    ) -> None:
        if self.held:
            held, self.held = self.held, []
            self._settle(held, self._used())
        elif self.uncounted:
            self._fleet.owe(self.caller.charged, self._used())
        elif self.meter.extra and self.caller.scopes:
            # Nothing was reserved (refused, or a compaction refusal) but a summary was
            # made for the request: charge it to the caller anyway.
            self._fleet.spawn(self._charge_only(self.meter.cost(Amounts())))

    async def _charge_only(self, amounts: Amounts) -> None:
        fleet = self._fleet
        accounts = fleet.accounts()
        if accounts is None:
            return
        for scope in self.caller.scopes:
            try:
                await fleet.charge(accounts, scope, amounts)
            except StoreUnavailable:
                return


def _at_least_zero(amounts: Amounts) -> Amounts:
    return Amounts(max(0, amounts.input), max(0, amounts.output), max(0, amounts.weighted))


class Apart:
    """A reservation of its own for work done for the caller after its request ends (a
    summary made ahead): `settle` it once, with the usage the work reported (None: it
    made no call, a refund)."""

    def __init__(self, ticket: Ticket | None, held: list[Held], *, uncounted: bool) -> None:
        self.ticket = ticket
        self.held = held
        self.uncounted = uncounted
        self.done = False

    def settle(self, usage: Usage | None) -> None:
        ticket = self.ticket
        if self.done or ticket is None:
            return
        self.done = True
        used = usage.cost() if usage is not None else Amounts()
        if self.held:
            ticket._settle(self.held, used)
        elif self.uncounted:
            ticket._fleet.owe(ticket.caller.charged, used)
        elif used != Amounts() and ticket.caller.scopes:
            ticket._fleet.spawn(ticket._charge_only(used))


TICKET = web.RequestKey("compaction_proxy_ticket", Ticket)


class KeySummaryBudget:
    """What the summaries made for a request may spend, reserved before each call to the
    summariser and charged to the caller (proxy/server/summariser.py asks it): at a
    crossing, a top-up of the request's own reservation (settled with it, the
    summariser's usage on the request's meter); made ahead, a reservation of its own,
    settled when the call returns. A refusal means no summary (the crossing packs)."""

    def __init__(self, budget: Budget) -> None:
        self.budget = budget

    async def at_crossing(self, estimated_input: int, max_tokens: int) -> bool:
        return await self.budget.top_up(estimated_input, max_tokens)

    async def ahead(self, estimated_input: int, max_tokens: int) -> Apart | None:
        assert self.budget.ticket is not None
        return await self.budget.ticket.hold_apart(estimated_input, max_tokens)


_ONE_HOUR = re.compile(rb'"ttl"\s*:\s*"1h"')


def admission(request: web.Request, caller: Caller) -> Ticket:
    """The ticket of a request the app serves: its dependencies read here, once, from the
    app (the fleet, the setting, the metrics a refusal counts on) and the request's
    current record (its meter)."""
    app, record = request.app, current_or_throwaway()
    on_store_down = app[SETTINGS].budgets.on_store_down
    rejected = partial(count_rejection, app, record=record)
    return Ticket(caller, app[FLEET], on_store_down, rejected, record.meter)


class Budget:
    """A request's budgets as its exchange uses them (its ticket's, given in): the gate,
    the reservation, read rounds' top-ups and what summaries may spend. Everything is
    free for a caller without budgets."""

    __slots__ = ("ticket",)

    def __init__(self, ticket: Ticket | None) -> None:
        has = ticket is not None and bool(ticket.caller.scopes or ticket.caller.limits_unknown)
        self.ticket = ticket if has else None

    @property
    def applies(self) -> bool:
        """Whether the caller has budgets to reserve against (they must read the body)."""
        return self.ticket is not None

    async def admit(self, output_tokens: int, sent: bytes) -> None:
        """The gate of a metered route, before any work for the request that costs the
        upstream money (compaction's summaries among them): raises the refusal when the
        caller's budgets cannot take even what the request is sure to cost; the later
        `reserve` of the same request holds only what this did not."""
        if self.ticket is not None:
            await self.ticket.admit(output_tokens, one_hour_cache=_one_hour(sent))

    async def reserve(
        self,
        estimated_input: int,
        output_tokens: int,
        sent: bytes,
        *,
        charge_reserved: bool = False,
    ) -> None:
        """Every metered route's one budget hook, before forwarding: returns to go on,
        raises the refusal otherwise. `estimated_input` is the calibrated estimate of what
        goes upstream, `output_tokens` what it may generate (proxy/core/budget.py
        `output_reservation`), `sent` its bytes (1-hour cache writes are weighted 2x).
        `charge_reserved`: the call's usage will not be reported in its answer (a batch):
        charge the whole reservation once it succeeds."""
        if self.ticket is not None:
            self.ticket.charge_reserved = charge_reserved
            await self.ticket.reserve(
                estimated_input, output_tokens, one_hour_cache=_one_hour(sent)
            )

    async def top_up(self, estimated_input: int, max_tokens: int | None) -> bool:
        """Before a read_result round goes upstream: hold its input (the whole body it
        sends) and its output cap too, so the rounds stay inside the caller's budgets.
        False when a budget refuses it: the rounds must stop there."""
        if self.ticket is None:
            return True
        return await self.ticket.top_up(estimated_input, max_tokens or DEFAULT_MAX_OUTPUT)

    def summaries(self) -> SummaryBudget:
        """What the summaries made for the request may spend."""
        if self.ticket is None:
            return FREE_SUMMARIES
        return KeySummaryBudget(self)


def _one_hour(sent: bytes) -> bool:
    return _ONE_HOUR.search(sent) is not None


def budget_of(request: web.Request) -> Budget:
    # A ticket is only ever admitted for a key's caller: without one there is none to
    # look for (a miss raises a KeyError inside aiohttp's request, 1.4 us).
    if caller_of(request).key_id is None:
        return Budget(None)
    return Budget(request.get(TICKET))
