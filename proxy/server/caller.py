"""Who is calling: what the key check found out about a request, for every later step."""

from __future__ import annotations

import contextlib
from dataclasses import dataclass

from aiohttp import web

from proxy.core.identity import tenant_of
from proxy.server.metrics import count_budget_rejection
from proxy.server.record import RequestRecord, current_or_throwaway
from proxy.store.accounts import Scope


@dataclass(frozen=True, slots=True)
class Caller:
    tenant: str | None = None  # None: derived from the forwarded credential
    key_id: str | None = None
    team: str | None = None
    policy: dict[str, int] | None = None  # window/trigger/target over the model's policy
    scopes: tuple[Scope, ...] = ()  # scopes with limits, the key's first
    limits_unknown: bool = False  # Redis was unreachable and nothing was cached
    provider: str | None = None  # the key's API ("anthropic", "openai", "gemini"); None: keys off

    @property
    def charged(self) -> tuple[Scope, ...]:
        """Every scope usage is charged to (the key's and its team's, limited or not)."""
        if self.key_id is None:
            return ()
        team = (Scope("team", self.team),) if self.team else ()
        return (Scope("key", self.key_id), *team)


ANONYMOUS = Caller()
CALLER = web.RequestKey("compaction_proxy_caller", Caller)


def caller_of(request: web.Request) -> Caller:
    caller: Caller = request.get(CALLER, ANONYMOUS)
    return caller


def tenant_of_request(request: web.Request) -> str:
    """The tenant calibration and budgets are kept for: the key's, or the credential's."""
    return caller_of(request).tenant or tenant_of(request.headers)


def count_rejection(app: web.Application, reason: str, record: RequestRecord | None = None) -> None:
    """Count a request refused by a key or budget check (`reason`: a fixed word) on its
    record (`record`, else the current one) and in the app's metrics."""
    (record if record is not None else current_or_throwaway()).rejected = reason
    with contextlib.suppress(KeyError):  # an app built without metrics
        count_budget_rejection(app, reason)
