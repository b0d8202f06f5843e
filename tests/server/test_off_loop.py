"""The off-loop threshold is one setting (`server.off_loop_bytes`): a conversation route
and a metered pass-through call read their bodies with the same step, and move the same
pure work off the event loop at the same size (before, 1 MiB in one and 256 KiB in the
other)."""

from __future__ import annotations

import threading
from typing import Any

import aiohttp
import orjson
import pytest

from proxy.server import bodies
from proxy.store import Store
from proxy.store.accounts import Accounts
from tests.plugins.standin import RunningStandIn
from tests.server.conftest import MakeProxy
from tests.server.test_keys_and_budgets import ENV, UPSTREAM_SECRET, new_key

THRESHOLD = 4096


def body_of(size: int, path: str) -> bytes:
    """A JSON body of about `size` bytes, a model call of `path`'s API."""
    base: dict[str, Any] = {"model": "claude-haiku-4-5", "max_tokens": 10}
    if path == "/v1/complete":
        base["prompt"] = "\n\nHuman: " + "x" * size + "\n\nAssistant:"
    else:
        base["messages"] = [{"role": "user", "content": "x" * size}]
    return orjson.dumps(base)


async def test_a_conversation_and_a_metered_pass_through_go_off_the_loop_alike(
    monkeypatch: pytest.MonkeyPatch, standin: RunningStandIn, make_proxy: MakeProxy, store: Store
) -> None:
    monkeypatch.setenv(ENV, UPSTREAM_SECRET)
    proxy = await make_proxy(
        standin.url,
        **{
            "auth.keys": "required",
            "auth.cache_seconds": 0.0,
            "store.key_prefix": store.prefix,
            "server.off_loop_bytes": THRESHOLD,
        },
    )
    key, _ = await new_key(Accounts(store), **{"day:input": 10**9})  # budgets read bodies
    checked: list[bool] = []  # for each body checked: on the event loop's thread?
    check = bodies.check_duplicates

    def recording(raw: bytes, payload: dict[str, object]) -> None:
        checked.append(threading.current_thread() is threading.main_thread())
        check(raw, payload)

    monkeypatch.setattr(bodies, "check_duplicates", recording)
    seen: dict[tuple[str, str], bool] = {}
    async with aiohttp.ClientSession() as session:
        for path in ("/v1/messages", "/v1/complete"):
            for size, name in ((THRESHOLD // 2, "under"), (THRESHOLD * 2, "over")):
                checked.clear()
                headers = {"x-api-key": key, "anthropic-version": "2023-06-01"}
                async with session.post(
                    proxy.url + path, data=body_of(size, path), headers=headers
                ) as response:
                    await response.read()
                assert len(checked) == 1, (path, name, response.status)
                seen[(path, name)] = checked[0]
    assert seen == {
        ("/v1/messages", "under"): True,
        ("/v1/messages", "over"): False,
        ("/v1/complete", "under"): True,
        ("/v1/complete", "over"): False,
    }
