"""Budget admission for one request: reserve before forwarding, settle after.

The key-check middleware (proxy/server/auth.py) wraps every handler of a key's request
in a `Ticket`; the Messages and Chat handlers make one call, after compaction and before
forwarding, which raises `BudgetRefused` (429) or `StoreUnavailable` (503, failing
closed) when the request may not go:

    await budgets.reserve(request, prepared, estimate)

The relay, the read_result rounds and the summariser report what the upstream used to the
request's meter (proxy/server/record.py), which the ticket reads at the end. When the
handler ends, however it ends (an answer, an upstream error, an exception, a client that
disconnects and cancels it), the reservation is settled to the metered usage in a
background task that cancellation cannot stop. An upstream error reports no usage, so it
settles to nothing: a refund.
"""

from __future__ import annotations

import asyncio
import logging
import re
import time
from collections.abc import Callable
from types import TracebackType

from aiohttp import web

from proxy.core.budget import Amounts, over_limit_message, reservation
from proxy.core.errors import BudgetRefused
from proxy.core.errors import StoreUnavailable as CannotCheck
from proxy.core.usage import Usage, UsageMeter
from proxy.server.caller import Caller, count_rejection
from proxy.server.fleet import FLEET, Fleet
from proxy.server.record import detached
from proxy.server.state import SETTINGS
from proxy.store import StoreUnavailable
from proxy.store.accounts import Held, Refused

log = logging.getLogger(__name__)

STORE_DOWN_RETRY_AFTER = 2  # seconds a fail-closed refusal asks the client to wait


class Ticket:
    def __init__(self, request: web.Request, caller: Caller) -> None:
        self.request = request
        self.caller = caller
        self.meter: UsageMeter = detached().meter  # the request's one meter
        self.held: list[Held] = []
        self.reserved = Amounts()  # summed over the reservation and its top-ups
        self.one_hour_cache = False

    @property
    def _fleet(self) -> Fleet:
        return self.request.app[FLEET]

    async def reserve(
        self, estimated_input: int, max_tokens: int, *, one_hour_cache: bool = False
    ) -> None:
        """Hold the estimate in every budget of the caller, or raise the refusal
        (BudgetRefused over budget, StoreUnavailable when failing closed)."""
        caller = self.caller
        if not caller.scopes and not caller.limits_unknown:
            return
        want = reservation(estimated_input, max_tokens, one_hour_cache=one_hour_cache)
        self.one_hour_cache = one_hour_cache
        refusal = await self._hold(want, give_back_all=True)
        if refusal is not None:
            raise refusal

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
        caller = self.caller
        fleet = self._fleet
        accounts = fleet.accounts()
        if accounts is None or caller.limits_unknown:
            return self._store_down()
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
        if refused is not None or failed is not None:
            if give_back_all:
                held, self.held = [*self.held, *held], []
            if held:  # in the background: the answer (429 or 503) does not wait for it
                self._settle(held, Amounts())
            if refused is not None:
                return self._over_budget(refused, want)
            if not isinstance(failed, StoreUnavailable):
                raise failed  # type: ignore[misc]
            return self._store_down()
        self.held.extend(held)
        self.reserved = self.reserved.plus(want)
        return None

    def _over_budget(self, refused: Refused, want: Amounts) -> BudgetRefused:
        count_rejection(self.request.app, "tokens")
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

    def _store_down(self) -> CannotCheck | None:
        fleet = self._fleet
        if self.request.app[SETTINGS].budgets.on_store_down == "open":
            fleet.unaccounted += 1
            return None
        count_rejection(self.request.app, "store_unavailable")
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
            self._settle(held, self.meter.cost(self.reserved))
        elif self.meter.extra and self.caller.scopes:
            # Nothing was reserved (refused, or a compaction refusal) but a summary was
            # made for the request: charge it to the caller anyway.
            self._fleet.spawn(self._charge_only(self.meter.cost(Amounts())))

    async def _charge_only(self, amounts: Amounts) -> None:
        fleet = self._fleet
        accounts = fleet.accounts()
        if accounts is None:
            return
        now = time.time()
        for scope in self.caller.scopes:
            try:
                held = await fleet.call(lambda s=scope: accounts.reserve(s, Amounts(), now))  # type: ignore[misc]
                if isinstance(held, Held):
                    await fleet.call(lambda h=held: accounts.settle(h, amounts))  # type: ignore[misc]
            except StoreUnavailable:
                return


TICKET = web.RequestKey("compaction_proxy_ticket", Ticket)


def late_charge(request: web.Request) -> Callable[[Usage], None]:
    """How to charge the caller for upstream work done for it after its request ended (a
    summary made ahead in the background): a no-op for callers without budgets."""
    ticket: Ticket | None = request.get(TICKET)
    if ticket is None or not ticket.caller.scopes:
        return _nothing

    def charge(usage: Usage) -> None:
        ticket._fleet.spawn(ticket._charge_only(usage.cost()))

    return charge


def _nothing(usage: Usage) -> None:
    return None


DEFAULT_MAX_OUTPUT = 4_096  # reserved when a Chat request names no output cap
_ONE_HOUR = re.compile(rb'"ttl"\s*:\s*"1h"')


def admission(request: web.Request, caller: Caller) -> Ticket:
    return Ticket(request, caller)


async def reserve(
    request: web.Request, estimated_input: int, max_tokens: int | None, sent: bytes
) -> None:
    """The handlers' one budget hook, after compaction and before forwarding: returns to
    go on, raises the refusal otherwise. Free for callers without budgets.
    `estimated_input` is the calibrated estimate of what goes upstream."""
    ticket: Ticket | None = request.get(TICKET)
    if ticket is None or not (ticket.caller.scopes or ticket.caller.limits_unknown):
        return
    await ticket.reserve(
        estimated_input,
        max_tokens or DEFAULT_MAX_OUTPUT,
        one_hour_cache=_ONE_HOUR.search(sent) is not None,
    )


def applies(request: web.Request) -> bool:
    """Whether the request's caller has budgets to reserve against."""
    ticket: Ticket | None = request.get(TICKET)
    return ticket is not None and bool(ticket.caller.scopes or ticket.caller.limits_unknown)


async def top_up(request: web.Request, estimated_input: int, max_tokens: int | None) -> bool:
    """Before a read_result round goes upstream: hold its input (the whole body it
    sends) and its output cap too, so the rounds stay inside the caller's budgets.
    False when a budget refuses it: the rounds must stop there. Free for callers
    without budgets."""
    ticket: Ticket | None = request.get(TICKET)
    if ticket is None or not (ticket.caller.scopes or ticket.caller.limits_unknown):
        return True
    return await ticket.top_up(estimated_input, max_tokens or DEFAULT_MAX_OUTPUT)
