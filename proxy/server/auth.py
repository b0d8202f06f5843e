"""Proxy-issued keys: who is calling, and with which upstream credential.

With `auth.keys = "off"` (the default) nothing happens here: the caller's own credential
goes upstream and its hash is the tenant. With `"required"`, every request except the
health and metrics routes must carry a proxy key (in `x-api-key` or `authorization:
Bearer`); a missing, unknown, revoked or wrong key gets 401 `authentication_error`. A good
key is replaced, before any handler sees the request, by the upstream credential its
record names (an environment variable of this replica), so the Messages and Chat
handlers, pass-through routes and the summariser all forward that credential and never
the proxy key. The request then carries a `Caller`: the key's tenant, team, context
policy override and the scopes (key, team) whose budgets apply.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

from aiohttp import web
from multidict import CIMultiDict, CIMultiDictProxy

from proxy.core import proxy_keys
from proxy.core.budget import limits_of, policy_override
from proxy.core.identity import credential
from proxy.server import errors, observe
from proxy.server.fleet import FLEET
from proxy.server.routing import upstream_for
from proxy.server.state import SETTINGS
from proxy.store import StoreUnavailable
from proxy.store.accounts import Scope

OPEN_PATHS = frozenset({"/healthz", "/readyz", "/metrics"})
# The admin API and the dashboard check the admin key themselves (proxy/server/admin).
ADMIN_PREFIXES = ("/admin/", "/dashboard/")


def is_admin_path(path: str) -> bool:
    return path in ("/admin", "/dashboard") or path.startswith(ADMIN_PREFIXES)


@dataclass(frozen=True, slots=True)
class Caller:
    tenant: str | None = None  # None: derived from the forwarded credential
    key_id: str | None = None
    team: str | None = None
    policy: dict[str, int] | None = None  # window/trigger/target over the model's policy
    scopes: tuple[Scope, ...] = ()  # scopes with limits, the key's first
    limits_unknown: bool = False  # Redis was unreachable and nothing was cached


ANONYMOUS = Caller()
CALLER = web.RequestKey("compaction_proxy_caller", Caller)


def caller_of(request: web.Request) -> Caller:
    caller: Caller = request.get(CALLER, ANONYMOUS)
    return caller


def shaped(request: web.Request, response: web.Response) -> web.Response:
    """The proxy's own error in the caller's API shape: OpenAI's on OpenAI routes."""
    if upstream_for(request.path, request.headers) != "openai":
        return response
    converted = errors.as_openai(response)
    if "retry-after" in response.headers:
        converted.headers["retry-after"] = response.headers["retry-after"]
    return converted


def _reject(request: web.Request, message: str, reason: str) -> web.Response:
    count_rejection(request.app, reason)
    return shaped(request, errors.error_response(401, "authentication_error", message))


def count_rejection(app: web.Application, reason: str) -> None:
    observe.rejected(reason)
    try:
        from proxy.server.metrics import count_budget_rejection
    except ImportError:  # metrics not part of this build
        return
    with contextlib.suppress(KeyError):  # an app built without metrics
        count_budget_rejection(app, reason)


def _with_credential(headers: CIMultiDictProxy[str], secret: str, scheme: str) -> CIMultiDict[str]:
    out = CIMultiDict(
        (name, value)
        for name, value in headers.items()
        if name.lower() not in ("x-api-key", "authorization")
    )
    if scheme == "bearer":
        out["Authorization"] = f"Bearer {secret}"
    else:
        out["x-api-key"] = secret
    return out


Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


@web.middleware
async def authenticate(request: web.Request, handler: Handler) -> web.StreamResponse:
    app = request.app
    path = request.path
    if app[SETTINGS].auth.keys != "required" or path in OPEN_PATHS or is_admin_path(path):
        return await handler(request)
    text = credential(request.headers)
    key_id = proxy_keys.key_id_of(text)
    if key_id is None:
        message = "invalid x-api-key" if text else "x-api-key header is required"
        return _reject(request, message, "key")
    fleet = app[FLEET]
    accounts = fleet.accounts()
    if accounts is None:
        return shaped(
            request,
            errors.error_response(
                503,
                "api_error",
                "compaction-proxy has no key store to check keys against",
                retry=True,
            ),
        )
    try:
        record = await fleet.key_record(accounts, key_id)
    except StoreUnavailable:
        count_rejection(app, "store_unavailable")
        response = errors.error_response(
            503,
            "api_error",
            "compaction-proxy cannot check keys right now (its store is"
            " unreachable); retry shortly",
            retry=True,
        )
        response.headers["retry-after"] = "2"
        return shaped(request, response)
    if (
        record is None
        or record.get("revoked") == "1"
        or not proxy_keys.matches(text, record.get("digest", ""))
    ):
        return _reject(request, "invalid x-api-key", "key")
    refused = proxy_keys.refusal(record, path, upstream_for(path, request.headers))
    if refused is not None:
        count_rejection(app, "scope")
        return shaped(request, errors.error_response(403, "permission_error", refused))
    secret = os.environ.get(record.get("upstream_env", ""), "").strip()
    if not secret:
        return _reject(
            request,
            f"this key's upstream credential ({record.get('upstream_env')}) is not set on"
            " this compaction-proxy replica",
            "key",
        )
    team = record.get("team") or None
    observe.caller(key_id, team)
    key_scope = Scope("key", key_id)
    team_scope = Scope("team", team) if team else None
    confs: list[dict[str, str]] = []
    scopes: list[Scope] = []
    unknown = False
    for scope in (key_scope, team_scope):
        if scope is None:
            continue
        try:
            conf = await fleet.conf(accounts, scope)
        except StoreUnavailable:
            unknown = True
            continue
        confs.append(conf)
        if limits_of(conf):
            scopes.append(scope)
    confs.reverse()  # the team's policy first, the key's over it
    caller = Caller(
        tenant=proxy_keys.tenant_for(key_id, record.get("tenant", "")),
        key_id=key_id,
        team=team,
        policy=policy_override(*confs) or None,
        scopes=tuple(scopes),
        limits_unknown=unknown,
    )
    headers = _with_credential(request.headers, secret, record.get("upstream_scheme", ""))
    forwarded = request.clone(headers=CIMultiDictProxy(headers))
    forwarded[CALLER] = caller
    from proxy.server.budgets import TICKET, admission

    async with admission(forwarded, caller) as ticket:
        forwarded[TICKET] = ticket
        return await handler(forwarded)
