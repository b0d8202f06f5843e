"""Key and budget management on the shared Redis: what the admin API and the CLI do.

Both go through these functions, so a key made from the dashboard and one made with
`compaction-proxy keys create` are the same record, and a budget reads the same either
way (the shapes are in proxy/core/management.py). Raises `ValueError` for a bad request,
`LookupError` for a key that does not exist, `StoreUnavailable` when Redis is away.
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from typing import Any

from proxy.core import management
from proxy.core.budget import override_problem, policy_override
from proxy.core.management import KeyRequest
from proxy.core.policy import DEFAULT_POLICIES, Policy
from proxy.store.accounts import Accounts, Scope


async def create_key(accounts: Accounts, request: KeyRequest) -> dict[str, Any]:
    """The new key's record with its text under "key": the only time it is shown."""
    text, record = await accounts.create_key(
        team=request.team,
        upstream_env=request.upstream_env,
        upstream_scheme=request.upstream_scheme,
        name=request.name,
        tenant=request.tenant,
        provider=request.provider,
        scopes=request.scopes,
    )
    if request.policy:
        await accounts.set_conf(Scope("key", record["id"]), dict(request.policy))
    return {"key": text, **management.shown(record)}


async def list_keys(accounts: Accounts) -> list[dict[str, str]]:
    return [management.shown(r) for r in await accounts.list_keys()]


async def _existing(accounts: Accounts, kind: str, name: str) -> Scope:
    kind, name = management.check_scope(kind, name)
    if kind == "key" and await accounts.get_key(name) is None:
        raise LookupError(f"no key {name}")
    return Scope(kind, name)


async def _report(accounts: Accounts, scope: Scope, now: float) -> dict[str, Any]:
    conf, used = await asyncio.gather(accounts.get_conf(scope), accounts.usage(scope, now))
    return management.budget_report(scope.kind, scope.name, conf, used)


async def budget(accounts: Accounts, kind: str, name: str, now: float) -> dict[str, Any]:
    return await _report(accounts, await _existing(accounts, kind, name), now)


async def set_budget(
    accounts: Accounts,
    kind: str,
    name: str,
    changes: dict[str, int | None],
    now: float,
    policies: Sequence[Policy] = DEFAULT_POLICIES,
) -> dict[str, Any]:
    """Apply conf changes (proxy/core/management.py `budget_changes`) after checking
    that the policy they leave is coherent, and that every model's policy in `policies`
    (the configured ones, then the built-in ones) can take it."""
    scope = await _existing(accounts, kind, name)
    conf = management.merged(await accounts.get_conf(scope), changes)
    management.check_policy(conf)
    await _check_override(accounts, scope, conf, policies)
    await accounts.set_conf(scope, changes)
    return await _report(accounts, scope, now)


async def _check_override(
    accounts: Accounts, scope: Scope, conf: dict[str, str], policies: Sequence[Policy]
) -> None:
    """Refuse a window/trigger/target some model's policy could not take: every request
    of that model would go without compaction. A key's is checked over its team's, a
    team's under each of its keys'."""
    pairs: list[tuple[dict[str, str], dict[str, str]]] = []
    if scope.kind == "key":
        team = (await accounts.get_key(scope.name) or {}).get("team")
        pairs.append((await accounts.get_conf(Scope("team", team)) if team else {}, conf))
    else:
        pairs.append((conf, {}))
        for record in await accounts.list_keys():
            if record.get("team") == scope.name:
                pairs.append((conf, await accounts.get_conf(Scope("key", record["id"]))))
    for team_conf, key_conf in pairs:
        override = policy_override(team_conf, key_conf)
        problem = override_problem(override, policies) if override else None
        if problem is not None:
            given = ", ".join(f"{k} {v}" for k, v in override.items())
            raise ValueError(
                f"the policy ({given}) does not fit {problem}; give the other fields too"
                " (window, trigger, target) or a [[policy]] for those models"
            )


async def all_budgets(accounts: Accounts, now: float) -> list[dict[str, Any]]:
    """Every key's budget and every team's that has a key, keys first."""
    records = await accounts.list_keys()
    teams = sorted({r["team"] for r in records if r.get("team")})
    scopes = [Scope("key", r["id"]) for r in records] + [Scope("team", t) for t in teams]
    return list(await asyncio.gather(*(_report(accounts, s, now) for s in scopes)))
