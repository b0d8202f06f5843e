"""The first step of every request: its target made canonical (proxy/core/target.py).

A target that is not canonical gets 400 in the route's API shape before anything else
reads it: the key check, the admin guard, routing, scopes and budgets then all read one
form, which is also the form forwarded upstream.
"""

from __future__ import annotations

import posixpath
from urllib.parse import unquote

from aiohttp import web

from proxy.core.errors import InvalidRequest
from proxy.core.target import target_problem
from proxy.server.caller import count_rejection
from proxy.server.errors import render, wire_for


def target_refusal(request: web.Request) -> web.Response | None:
    """The 400 for a request whose target is not canonical; None when it is (the front
    door, proxy/server/front_door.py, asks first)."""
    problem = target_problem(request.raw_path)
    if problem is None:
        return None
    count_rejection(request.app, "target")
    # Answered in the shape of the API the target would name once normalised (the
    # caller's SDK reads it), though it is never routed there.
    raw = unquote(request.raw_path.partition("?")[0]).replace("\\", "/")
    path = posixpath.normpath("/" + raw.lstrip("/"))
    return render(InvalidRequest(problem), wire_for(path, request.headers))
