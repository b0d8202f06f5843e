"""Calibration from relayed Chat streams: the openai SDK -> the proxy -> the Chat stand-in.

A Chat stream reports its usage in its last chunk (with `stream_options.include_usage`),
not in its first as an Anthropic stream does; requests under the trigger are relayed as
bytes, so the proxy must look at the stream's end to learn the upstream's tokenizer.
"""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Awaitable, Callable
from typing import Any

import openai
import pytest

from proxy.core.identity import tenant_of
from proxy.server.calibration import store_name
from proxy.server.compactor import calibrated_as
from proxy.testing.standin import StandInOptions
from proxy.wire import CHAT
from tests.plugins.standin import RunningStandIn
from tests.server.conftest import MakeProxy

SCALE = 1.3
# An answer in several deltas, paced, so the usage chunk arrives apart from the first.
SCRIPT = '{"text": "noted, and more words to stream", "chunk_tokens": 1, "token_delay": 0.005}'


async def test_relayed_chat_streams_calibrate_the_model(
    make_standin: Callable[[StandInOptions], Awaitable[RunningStandIn]],
    make_proxy: MakeProxy,
    make_store: Callable[..., Any],
    redis_key_prefix: str,
) -> None:
    standin = await make_standin(StandInOptions(token_scale=SCALE, max_recorded=None))
    proxy = await make_proxy(
        standin.url,
        **{"upstream.openai_url": standin.url, "store.key_prefix": redis_key_prefix},
    )
    model = f"gpt-scale-{uuid.uuid4().hex[:8]}"
    client = openai.AsyncOpenAI(base_url=f"{proxy.url}/v1", api_key="sk-cal", max_retries=0)
    messages: list[dict[str, Any]] = [
        {"role": "system", "content": "You are terse."},
    ]
    async with client:
        for turn in range(12):
            messages.append({"role": "user", "content": f"Turn {turn}: " + "word " * 300})
            stream = await client.chat.completions.create(
                model=model,
                messages=messages,  # type: ignore[arg-type]
                stream=True,
                stream_options={"include_usage": True},
                extra_headers={"x-stand-in": SCRIPT},
            )
            usage = None
            async for chunk in stream:
                usage = chunk.usage or usage
            assert usage is not None and usage.prompt_tokens > 0
            messages.append({"role": "assistant", "content": "noted"})
    assert {r.outcome for r in standin.recorded} == {"complete"}
    assert len(standin.recorded) == 12  # every one relayed as it was: no read rounds

    store = make_store(prefix=redis_key_prefix)
    tenant = tenant_of({"authorization": "Bearer sk-cal"})  # calibration is per tenant
    found = None
    for _ in range(50):  # samples are written in the background
        found = await store.get_global_mean(
            "calibration", store_name(calibrated_as(CHAT, model), tenant)
        )
        if found is not None and found[1] >= 12:
            break
        await asyncio.sleep(0.05)
    assert found is not None, "no relayed Chat stream fed calibration"
    factor, samples = found
    assert samples >= 12
    assert factor == pytest.approx(SCALE, abs=0.03)
