"""The proxy on a real loopback port, in front of a real upstream.

- `make_proxy(upstream_url, **settings)`: start a proxy in the test's event loop
  (settings by dotted name, e.g. `**{"server.max_body_bytes": 1000}`); stopped after.
- `make_proxy_thread(upstream_url, **settings)`: the same in a background thread with its
  own loop, for sync clients. Both use the session's Redis unless `store.redis_url` is
  given ("" starts the proxy's own embedded Redis under `store.state_dir`).
- `make_compacting_proxy(upstream_url, *, redis=None, **settings)`: a proxy with the one
  [[policy]] SMALL_WINDOW_POLICY, its keys under the test's own Redis prefix.
"""

from __future__ import annotations

import asyncio
import dataclasses
import threading
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from typing import Any

import aiohttp
import pytest

from proxy.config import Settings, load_settings
from proxy.server.app import RunningProxy, start


def proxy_settings(upstream_url: str, redis_url: str, **settings: Any) -> Settings:
    overrides: dict[str, Any] = {
        "server.port": 0,
        "upstream.url": upstream_url,
        "store.redis_url": redis_url,
    }
    overrides.update(settings)
    return load_settings(None, environ={}, overrides=overrides)


MakeProxy = Callable[..., Awaitable[RunningProxy]]


@pytest.fixture
async def make_proxy(redis_url: str) -> AsyncIterator[MakeProxy]:
    started: list[RunningProxy] = []

    async def make(upstream_url: str, **settings: Any) -> RunningProxy:
        started.append(await start(proxy_settings(upstream_url, redis_url, **settings)))
        return started[-1]

    yield make
    for running in started:
        await running.stop()


SMALL_WINDOW = 30_000
# Small enough that a few dozen agent turns with large tool results must be compacted.
SMALL_WINDOW_POLICY: dict[str, Any] = {
    "match": "*",
    "window": SMALL_WINDOW,
    "trigger": 12_000,
    "target": 7_000,
    # From 6,000 on every result is offloaded as it ages; folds at 12,000.
    "offload_trigger": 6_000,
    "keep_last": 3,
    "keep_results": 1,
    "offload_threshold": 500,
    "stub_head_chars": 1_500,
    "summary_max_tokens": 1_500,
}


@pytest.fixture
async def make_compacting_proxy(redis_url: str, redis_key_prefix: str) -> AsyncIterator[MakeProxy]:
    started: list[RunningProxy] = []

    async def make(upstream_url: str, *, redis: str | None = None, **settings: Any) -> RunningProxy:
        base = proxy_settings(
            upstream_url,
            redis if redis is not None else redis_url,
            **{"store.key_prefix": redis_key_prefix, **settings},
        )
        started.append(await start(dataclasses.replace(base, policies=(SMALL_WINDOW_POLICY,))))
        return started[-1]

    yield make
    for running in started:
        await running.stop()


class ThreadedProxy:
    """A proxy whose event loop runs in a daemon thread."""

    def __init__(self, settings: Settings) -> None:
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self.thread.start()
        self.running = self.call(start(settings))

    def call(self, coroutine: Awaitable[Any]) -> Any:
        return asyncio.run_coroutine_threadsafe(coroutine, self.loop).result(timeout=60)  # type: ignore[arg-type]

    def stop(self) -> None:
        self.call(self.running.stop())
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(timeout=30)
        self.loop.close()


@pytest.fixture
def make_proxy_thread(redis_url: str) -> Iterator[Callable[..., RunningProxy]]:
    started: list[ThreadedProxy] = []

    def make(upstream_url: str, **settings: Any) -> RunningProxy:
        started.append(ThreadedProxy(proxy_settings(upstream_url, redis_url, **settings)))
        return started[-1].running

    yield make
    for proxy in started:
        proxy.stop()


# -- the admin API -------------------------------------------------------------------

ADMIN_KEY_ENV = "CP_TEST_ADMIN_KEY"
UPSTREAM_KEY_ENV = "CP_TEST_ADMIN_UPSTREAM_KEY"  # what proxy keys made in tests map to
UPSTREAM_SECRET = "sk-upstream-admin-tests"


@pytest.fixture
def admin_key(monkeypatch: pytest.MonkeyPatch) -> str:
    """A fresh admin key in the environment (and the upstream credential keys map to)."""
    key = f"admin-{uuid.uuid4().hex}"
    monkeypatch.setenv(ADMIN_KEY_ENV, key)
    monkeypatch.setenv(UPSTREAM_KEY_ENV, UPSTREAM_SECRET)
    return key


@pytest.fixture
async def make_admin_proxy(admin_key: str, make_compacting_proxy: MakeProxy) -> MakeProxy:
    """A compacting proxy with the admin API on, proxy keys required, and key records
    and limits never cached (so revocations and budgets apply at once)."""

    async def make(upstream_url: str, **settings: Any) -> RunningProxy:
        return await make_compacting_proxy(
            upstream_url,
            **{
                "auth.admin_key_env": ADMIN_KEY_ENV,
                "auth.keys": "required",
                "auth.cache_seconds": 0.0,
                "auth.upstream_envs": UPSTREAM_KEY_ENV,
                "upstream.openai_url": upstream_url,
                **settings,
            },
        )

    return make


class AdminAPI:
    """The admin API as a script would call it: (status, JSON) for each call."""

    def __init__(self, url: str, key: str) -> None:
        self.url = url
        self.headers = {"Authorization": f"Bearer {key}"}

    async def call(
        self, method: str, path: str, body: Any = None, headers: dict[str, str] | None = None
    ) -> tuple[int, Any]:
        async with (
            aiohttp.ClientSession() as session,
            session.request(
                method,
                self.url + path,
                json=body,
                headers=self.headers if headers is None else headers,
            ) as response,
        ):
            return response.status, await response.json(content_type=None)

    async def ok(self, method: str, path: str, body: Any = None) -> Any:
        status, answer = await self.call(method, path, body)
        assert status in (200, 201), (status, answer)
        return answer
