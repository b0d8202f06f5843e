"""Getting a summary for a crossing: reuse a stored one, or make it once for the fleet.

A summary is stored under the hash of the messages it folds, per conversation, so every
later request (on any replica) whose history starts with that prefix reuses it byte for
byte. Making one costs an upstream call, so a Redis lock lets one replica make it while
the others wait briefly for it and, if it does not come in time, pack instead.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass

import anthropic
import openai

from proxy.core.identity import credential
from proxy.core.rewrite import NeedSummary
from proxy.core.summary import INSTRUCTION
from proxy.server import charges, observe
from proxy.store import Store, StoreUnavailable

log = logging.getLogger(__name__)

PURPOSE_HEADER = "x-compaction-proxy-purpose"


@dataclass(frozen=True, slots=True)
class SummaryOutcome:
    text: str | None  # None: no summary to be had, pack instead
    reused: bool = False
    failure: str = ""  # why there is none, for logs and metrics


@dataclass(frozen=True, slots=True)
class SummariserSettings:
    timeout: float = 120.0  # seconds for the summariser call
    wait: float = 8.0  # seconds another replica waits for a summary being made
    poll: float = 0.2


async def obtain_summary(
    need: NeedSummary,
    *,
    store: Store,
    tenant: str,
    conversation: str,
    model: str,
    headers: Mapping[str, str],
    base_url: str,
    settings: SummariserSettings,
    call: Callable[..., Awaitable[str]] | None = None,
) -> SummaryOutcome:
    key = need.key
    try:
        stored = await store.get_json(tenant, conversation, "summary", key)
        if isinstance(stored, str) and stored.strip():
            return SummaryOutcome(stored, reused=True)
        lock = f"summary:{key}"
        ttl_ms = int((settings.timeout + 5) * 1000)
        token = await store.acquire_lock(tenant, conversation, lock, ttl_ms)
    except StoreUnavailable as e:
        return SummaryOutcome(None, failure=f"store unavailable: {e}")
    if token is None:
        return await _wait_for_other(store, tenant, conversation, key, settings)
    try:
        observe.summariser_call()
        text = await (call or call_summariser)(
            need, model=model, headers=headers, base_url=base_url, seconds=settings.timeout
        )
        if not text.strip():
            observe.summariser_call(failed=True)
            return SummaryOutcome(None, failure="the summariser answered with no text")
        await store.put_json(tenant, conversation, "summary", key, text)
        return SummaryOutcome(text)
    except StoreUnavailable as e:
        return SummaryOutcome(None, failure=f"store unavailable: {e}")
    except (anthropic.APIError, openai.APIError) as e:
        observe.summariser_call(failed=True)
        log.warning("summariser call failed: %s (%r)", type(e).__name__, e.__cause__)
        return SummaryOutcome(None, failure=f"summariser failed: {type(e).__name__}")
    finally:
        with contextlib.suppress(StoreUnavailable):  # else it expires by itself
            await store.release_lock(tenant, conversation, lock, token)


async def _wait_for_other(
    store: Store, tenant: str, conversation: str, key: str, settings: SummariserSettings
) -> SummaryOutcome:
    loop = asyncio.get_running_loop()
    deadline = loop.time() + settings.wait
    while loop.time() < deadline:
        await asyncio.sleep(settings.poll)
        try:
            stored = await store.get_json(tenant, conversation, "summary", key)
        except StoreUnavailable as e:
            return SummaryOutcome(None, failure=f"store unavailable: {e}")
        if isinstance(stored, str) and stored.strip():
            return SummaryOutcome(stored, reused=True)
    return SummaryOutcome(None, failure="another replica is still summarising")


async def call_summariser(
    need: NeedSummary, *, model: str, headers: Mapping[str, str], base_url: str, seconds: float
) -> str:
    """One Messages call through the anthropic SDK, with the caller's own credential."""
    secret = credential(headers)
    uses_bearer = not headers.get("x-api-key") and bool(headers.get("authorization"))
    client = anthropic.AsyncAnthropic(
        base_url=base_url,
        api_key=None if uses_bearer else secret,
        auth_token=secret if uses_bearer else None,
        max_retries=1,
        timeout=seconds,
        default_headers={PURPOSE_HEADER: "summary"},
    )
    async with client:
        message = await client.messages.create(
            model=need.model or model,
            max_tokens=need.slot,
            system=INSTRUCTION,
            messages=[{"role": "user", "content": need.transcript}],
        )
    charges.summariser_usage(message.usage.model_dump())  # the caller's budget pays
    return "".join(b.text for b in message.content if b.type == "text")
