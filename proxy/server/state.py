"""Typed keys for what the application holds for its lifetime."""

from __future__ import annotations

from dataclasses import dataclass

from aiohttp import web

from proxy.config import Settings
from proxy.server.compactor import Compactor
from proxy.server.upstream import Upstream
from proxy.store import EmbeddedRedis, Store


@dataclass(slots=True)
class StoreState:
    """The store, if one could be set up, and the embedded Redis we started, if any."""

    store: Store | None = None
    embedded: EmbeddedRedis | None = None
    problem: str = ""  # why there is no store, for /readyz


SETTINGS = web.AppKey("settings", Settings)
UPSTREAM = web.AppKey("upstream", Upstream)
STORE = web.AppKey("store", StoreState)
COMPACTOR = web.AppKey("compactor", Compactor)
