"""The admin API's answers: JSON bodies, and its errors in the Messages API's shape.

Admin requests carry `Authorization: Bearer`, which the proxy's routing rule would read
as an OpenAI client's; the admin API always answers in the Messages error shape, so its
errors are rendered here rather than by the route-dependent renderer.
"""

from __future__ import annotations

from typing import Any

import orjson
from aiohttp import web

from proxy.core.errors import ClientError, NotFound, ProxyError
from proxy.server.errors import render
from proxy.wire import ANTHROPIC

__all__ = ["MethodNotAllowed", "NotFound", "answer", "error"]


class MethodNotAllowed(ClientError):
    status = 405

    def __init__(self, method: str, allowed: str) -> None:
        super().__init__(f"{method} is not allowed here ({allowed})")
        self.allowed = allowed

    def headers(self) -> dict[str, str]:
        return {**super().headers(), "Allow": self.allowed}


def answer(body: Any, status: int = 200) -> web.Response:
    return web.Response(
        status=status,
        body=orjson.dumps(body),
        content_type="application/json",
        headers={"Cache-Control": "no-store"},
    )


def error(problem: ProxyError) -> web.Response:
    return render(problem, ANTHROPIC)
