"""Mount the admin API and the dashboard on the app.

With `auth.admin_key_env` empty, every `/admin/*` path and the dashboard answer 404 (they
are never passed through upstream). Otherwise every `/admin/*` path, whatever the method,
first needs `Authorization: Bearer <admin key>` (401 in the Messages error shape without
it); the dashboard page itself is public, as it holds no secret and no data: it asks for
the admin key and reads the API with it.
"""

from __future__ import annotations

from collections.abc import Mapping

from aiohttp import web

from proxy.core.errors import NotAuthenticated, ProxyError
from proxy.server.admin import dashboard, keys
from proxy.server.admin.access import AdminKey
from proxy.server.admin.answers import MethodNotAllowed, NotFound, error
from proxy.server.admin.stats import STATS, StatsCollector, handle_stats
from proxy.server.auth import is_admin_path
from proxy.server.caller import count_rejection
from proxy.server.metrics import REQUEST_ENDED, Handler
from proxy.server.state import SETTINGS

ADMIN_KEY = web.AppKey("admin_key", AdminKey)


@web.middleware
async def guard(request: web.Request, handler: Handler) -> web.StreamResponse:
    path = request.path
    if not is_admin_path(path):
        return await handler(request)
    try:
        key = request.app.get(ADMIN_KEY)
        if key is None:
            raise NotFound("Not found.")
        if path.startswith("/admin"):
            problem = key.problem(request.headers.get("Authorization", ""))
            if problem is not None:
                count_rejection(request.app, "admin")
                raise NotAuthenticated(problem)
        return await handler(request)
    except ProxyError as problem:
        return error(problem)


async def _unknown(request: web.Request) -> web.Response:
    raise NotFound("Not found.")


def _by_method(handlers: Mapping[str, Handler]) -> Handler:
    """One route per path, so a wrong method is a 405 (not a 404 from the catch-all)."""
    allowed = ", ".join(handlers)

    async def dispatch(request: web.Request) -> web.StreamResponse:
        handler = handlers.get(request.method)
        if handler is None:
            raise MethodNotAllowed(request.method, allowed)
        return await handler(request)

    return dispatch


def install(app: web.Application) -> None:
    """Before the pass-through catch-all route is added (raises ConfigError when the
    admin key is named but unusable)."""
    app.middlewares.append(guard)
    key = AdminKey.from_settings(app[SETTINGS])
    if key is not None:
        app[ADMIN_KEY] = key
        collector = app[STATS] = StatsCollector(app)
        app.setdefault(REQUEST_ENDED, []).append(collector.observe)
        collector.install(app)
        for path, methods in (
            ("/admin/stats", {"GET": handle_stats}),
            ("/admin/keys", {"GET": keys.handle_keys, "POST": keys.handle_keys}),
            ("/admin/keys/{key_id}", {"DELETE": keys.handle_key}),
            ("/admin/budgets", {"GET": keys.handle_budgets}),
            (
                "/admin/budgets/{kind}/{name}",
                {"GET": keys.handle_budget, "PUT": keys.handle_budget},
            ),
        ):
            app.router.add_route("*", path, _by_method(methods))
        dashboard.add_routes(app.router)
    for path in ("/admin", "/admin/{tail:.*}", "/dashboard", "/dashboard/{tail:.*}"):
        app.router.add_route("*", path, _unknown)
