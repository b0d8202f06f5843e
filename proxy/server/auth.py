"""Proxy-issued keys: who is calling, what it may reach, and with which upstream credential.

With `auth.keys = "off"` (the default) nothing happens here: the caller's own credential
goes upstream and its hash is the tenant. With `"required"`, every request except the
health and metrics routes must carry a proxy key (in `x-api-key`, Gemini's
`x-goog-api-key` or `authorization: Bearer`); a missing, unknown, revoked or wrong key gets 401
`authentication_error`. A good key then reaches only what it may (403 `permission_error`
otherwise, in the route's API shape; proxy/core/proxy_keys.py has the rules): the API of
its provider, never the other's, and beyond the metered routes only the path families of
its scopes. It is replaced, before any handler sees the request, by the upstream
credential its record names (an environment variable of this replica), so the Messages
and Chat handlers, pass-through routes and the summariser all forward that credential
and never the proxy key. The request then carries a `Caller`: the key's tenant, team,
provider, context policy override and the scopes (key, team) whose budgets apply.
"""

from __future__ import annotations

import os
from collections.abc import Awaitable, Callable

from aiohttp import web
from multidict import CIMultiDict, CIMultiDictProxy

from proxy.core import proxy_keys
from proxy.core.budget import limits_of, policy_override
from proxy.core.errors import Forbidden, NotAuthenticated
from proxy.core.errors import StoreUnavailable as CannotCheck
from proxy.core.identity import credential
from proxy.server.budgets import TICKET, admission
from proxy.server.caller import ANONYMOUS, CALLER, Caller, count_rejection
from proxy.server.fleet import FLEET
from proxy.server.passthrough import API_PREFIX, handle_passthrough
from proxy.server.record import current_or_throwaway
from proxy.server.routing import OPENAI_UPSTREAM, OWN_CREDENTIAL, provider_of_path
from proxy.server.state import SETTINGS
from proxy.store import StoreUnavailable
from proxy.store.accounts import Scope

OPEN_PATHS = frozenset({"/healthz", "/readyz", "/metrics"})
# The admin API and the dashboard check the admin key themselves (proxy/server/admin).
ADMIN_PREFIXES = ("/admin/", "/dashboard/")
STORE_DOWN_RETRY_AFTER = 2
API_NAMES = {"anthropic": "Anthropic", "openai": "OpenAI", "gemini": "Gemini"}
CREDENTIAL_HEADERS = ("x-api-key", "authorization", "x-goog-api-key")


def is_admin_path(path: str) -> bool:
    return path in ("/admin", "/dashboard") or path.startswith(ADMIN_PREFIXES)


def _reject(request: web.Request, message: str, reason: str) -> NotAuthenticated:
    count_rejection(request.app, reason)
    return NotAuthenticated(message)


def _forbid(request: web.Request, message: str, reason: str) -> Forbidden:
    count_rejection(request.app, reason)
    return Forbidden(message)


def _with_credential(headers: CIMultiDictProxy[str], secret: str, scheme: str) -> CIMultiDict[str]:
    out = CIMultiDict(
        (name, value) for name, value in headers.items() if name.lower() not in CREDENTIAL_HEADERS
    )
    if scheme == "bearer":
        out["Authorization"] = f"Bearer {secret}"
    elif scheme == "x-goog-api-key":
        out["x-goog-api-key"] = secret
    else:
        out["x-api-key"] = secret
    return out


def check_reach(
    request: web.Request, record: dict[str, str], provider: str, openai_set: bool
) -> None:
    """Raise Forbidden unless the key may make this request: its provider's API only
    (`openai_set`: the proxy has an OpenAI upstream), and beyond the proxy's own
    (metered) routes only the families of its scopes."""
    path = request.path
    other = provider_of_path(path)
    if other is not None and other != provider:
        raise _forbid(
            request,
            f"This key is for the {API_NAMES[provider]} API; {path} is part of the"
            f" {API_NAMES[other]} API.",
            "provider",
        )
    if provider == "openai" and not openai_set:
        raise _forbid(
            request,
            "This compaction-proxy has no OpenAI upstream (upstream.openai_url is not set).",
            "provider",
        )
    if request.match_info.handler is not handle_passthrough:
        return  # a route the proxy handles (and meters) itself
    if not path.startswith(API_PREFIX):
        return  # not an API path: the pass-through answers 404, nothing goes upstream
    rule = proxy_keys.passthrough_rule(request.method, path)
    if not proxy_keys.may_reach(rule, proxy_keys.scopes_of(record)):
        raise _forbid(
            request,
            f"This key may not use {path}: that needs the scope '{rule.scope}', given when"
            f" the key is made (compaction-proxy keys create --scope {rule.scope}).",
            "scope",
        )


Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


@web.middleware
async def authenticate(request: web.Request, handler: Handler) -> web.StreamResponse:
    app = request.app
    path = request.path
    if app[SETTINGS].auth.keys != "required" or path in OPEN_PATHS or is_admin_path(path):
        request[CALLER] = ANONYMOUS  # (said, so that reading it raises no KeyError)
        return await handler(request)
    text = credential(request.headers)
    key_id = proxy_keys.key_id_of(text)
    if key_id is None:
        message = "invalid x-api-key" if text else "x-api-key header is required"
        raise _reject(request, message, "key")
    fleet = app[FLEET]
    accounts = fleet.accounts()
    if accounts is None:
        raise CannotCheck("compaction-proxy has no key store to check keys against")
    try:
        record = await fleet.key_record(accounts, key_id)
    except StoreUnavailable:
        count_rejection(app, "store_unavailable")
        raise CannotCheck(
            "compaction-proxy cannot check keys right now (its store is unreachable);"
            " retry shortly",
            retry_after=STORE_DOWN_RETRY_AFTER,
        ) from None
    if (
        record is None
        or record.get("revoked") == "1"
        or not proxy_keys.matches(text, record.get("digest", ""))
    ):
        raise _reject(request, "invalid x-api-key", "key")
    provider = proxy_keys.provider_of(record)
    check_reach(request, record, provider, app[OPENAI_UPSTREAM].configured)
    env = record.get("upstream_env", "")
    if proxy_keys.upstream_env_problem(env, app[SETTINGS].auth.admin_key_env, None):
        # A record naming the admin key's variable (or a setting's) is never served.
        raise _reject(request, "this key's upstream credential variable is not allowed", "key")
    # Bedrock and Vertex get the proxy's own credential (their upstream's signer drops
    # the key): the key's upstream credential is not needed there.
    own = path.startswith(OWN_CREDENTIAL)
    secret = os.environ.get(env, "").strip()
    if not secret and not own:
        raise _reject(
            request,
            f"this key's upstream credential ({record.get('upstream_env')}) is not set on"
            " this compaction-proxy replica",
            "key",
        )
    team = record.get("team") or None
    noted = current_or_throwaway()  # for the admin stats
    noted.key_id, noted.team = key_id, team or ""
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
        provider=provider,
    )
    headers = (
        CIMultiDict(request.headers)
        if own
        else _with_credential(request.headers, secret, record.get("upstream_scheme", ""))
    )
    forwarded = request.clone(headers=CIMultiDictProxy(headers))
    forwarded[CALLER] = caller
    async with admission(forwarded, caller) as ticket:
        forwarded[TICKET] = ticket
        return await handler(forwarded)
