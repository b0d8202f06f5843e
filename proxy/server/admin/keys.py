"""`/admin/keys` and `/admin/budgets`: proxy keys and budgets over HTTP.

    POST   /admin/keys                      {"team": ..., ...} -> 201, the key shown once
    GET    /admin/keys                      {"keys": [record, ...]} (never a secret)
    DELETE /admin/keys/{key_id}             revoked on every replica within
                                            auth.cache_seconds
    GET    /admin/budgets                   {"budgets": [...]}: every key and team
    GET    /admin/budgets/{kind}/{name}     kind "key" or "team": limits, usage, policy
    PUT    /admin/budgets/{kind}/{name}     {"limits": {...}, "policy": {...}}

The request and answer shapes are in proxy/core/management.py; the work is done by
proxy/store/management.py, the same code the CLI runs against Redis.
"""

from __future__ import annotations

import time
from collections.abc import Awaitable, Callable
from typing import Any

import orjson
from aiohttp import web

from proxy.core import management as shapes
from proxy.core.errors import InvalidRequest, StoreUnavailable
from proxy.core.proxy_keys import upstream_env_problem
from proxy.server.admin.answers import NotFound, answer
from proxy.server.state import COMPACTOR, SETTINGS, STORE
from proxy.store import management as manage
from proxy.store.accounts import Accounts

STORE_DOWN_RETRY_AFTER = 2


async def _json(request: web.Request) -> Any:
    raw = await request.read()
    try:
        return orjson.loads(raw)
    except orjson.JSONDecodeError as e:
        raise ValueError(f"the body is not valid JSON: {e}") from None


Work = Callable[[web.Request, Accounts], Awaitable[web.Response]]


async def run(request: web.Request, work: Work) -> web.Response:
    """Run `work` with the accounts; failures become the proxy's errors (400, 404, 503)."""
    store = request.app[STORE].store
    if store is None:
        raise StoreUnavailable("compaction-proxy has no store for keys and budgets")
    try:
        return await work(request, Accounts(store))
    except ValueError as e:
        raise InvalidRequest(str(e)) from None
    except LookupError as e:
        raise NotFound(str(e.args[0])) from None
    except StoreUnavailable:
        raise StoreUnavailable(
            "compaction-proxy cannot reach its store right now",
            retry_after=STORE_DOWN_RETRY_AFTER,
        ) from None


async def _create_key(request: web.Request, accounts: Accounts) -> web.Response:
    wanted = shapes.parse_key_request(await _json(request))
    auth = request.app[SETTINGS].auth
    problem = upstream_env_problem(wanted.upstream_env, auth.admin_key_env, auth.upstream_envs)
    if problem is not None:
        raise ValueError(problem)
    return answer(await manage.create_key(accounts, wanted), status=201)


async def _list_keys(request: web.Request, accounts: Accounts) -> web.Response:
    return answer({"keys": await manage.list_keys(accounts)})


async def _revoke_key(request: web.Request, accounts: Accounts) -> web.Response:
    key_id = request.match_info["key_id"]
    shapes.check_scope("key", key_id)
    if not await accounts.revoke_key(key_id):
        raise LookupError(f"no key {key_id}")
    seconds = request.app[SETTINGS].auth.cache_seconds
    return answer({"revoked": key_id, "effective_within_seconds": seconds})


async def _all_budgets(request: web.Request, accounts: Accounts) -> web.Response:
    return answer({"budgets": await manage.all_budgets(accounts, time.time())})


async def _budget(request: web.Request, accounts: Accounts) -> web.Response:
    kind, name = request.match_info["kind"], request.match_info["name"]
    if request.method == "PUT":
        changes = shapes.budget_changes(await _json(request))
        policies = request.app[COMPACTOR].policies  # the models' own, configured first
        report = await manage.set_budget(accounts, kind, name, changes, time.time(), policies)
        return answer(report)
    return answer(await manage.budget(accounts, kind, name, time.time()))


async def handle_keys(request: web.Request) -> web.Response:
    return await run(request, _create_key if request.method == "POST" else _list_keys)


async def handle_key(request: web.Request) -> web.Response:
    return await run(request, _revoke_key)


async def handle_budgets(request: web.Request) -> web.Response:
    return await run(request, _all_budgets)


async def handle_budget(request: web.Request) -> web.Response:
    return await run(request, _budget)
