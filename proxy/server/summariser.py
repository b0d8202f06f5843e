"""Getting a summary for a crossing: reuse a stored one, or make it once for the fleet.

A summary is stored under the hash of the turns it folds, per conversation, so every
later request (on any replica) whose history starts with them reuses it byte for byte.
Making one costs an upstream call, so a Redis lock lets one replica make it while the
others wait briefly for it and, if it does not come in time, pack instead. The maker
keeps the lock until the crossing's writes have stored the summary (the executor
releases it), so no second replica pays for the same summary in between.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass

import anthropic
import openai

from proxy.core.commands import GetSummary, SummaryReply
from proxy.core.identity import credential
from proxy.core.summary import INSTRUCTION
from proxy.core.usage import anthropic_usage
from proxy.server.record import detached
from proxy.store import Store, StoreUnavailable
from proxy.wire.chat_rounds import chat_usage
from proxy.wire.responses_rounds import responses_usage

log = logging.getLogger(__name__)

PURPOSE_HEADER = "x-compaction-proxy-purpose"
SUMMARY = "summary"  # the store kind summaries are kept under


SummaryCall = Callable[..., Awaitable[str]]


@dataclass(frozen=True, slots=True)
class Obtained:
    reply: SummaryReply
    lock: tuple[str, str] | None = None  # (lock name, token) still held: release after saving


@dataclass(frozen=True, slots=True)
class SummariserSettings:
    timeout: float = 120.0  # seconds for the summariser call
    wait: float = 8.0  # seconds another replica waits for a summary being made
    poll: float = 0.2


async def obtain_summary(
    need: GetSummary,
    *,
    store: Store,
    tenant: str,
    conversation: str,
    model: str,
    headers: Mapping[str, str],
    base_url: str,
    settings: SummariserSettings,
    call: SummaryCall,
) -> Obtained:
    key = need.key
    try:
        stored = await store.get_json(tenant, conversation, SUMMARY, key)
        if isinstance(stored, str) and stored.strip():
            return Obtained(SummaryReply(stored, reused=True))
        lock = f"summary:{key}"
        # Held through the call and until the crossing's writes (then released).
        ttl_ms = int((settings.timeout + 30) * 1000)
        token = await store.acquire_lock(tenant, conversation, lock, ttl_ms)
    except StoreUnavailable as e:
        return Obtained(SummaryReply(None, failure=f"store unavailable: {e}"))
    if token is None:
        return Obtained(await _wait_for_other(store, tenant, conversation, key, settings))
    record = detached()
    held = (lock, token)
    try:
        record.summariser_calls += 1
        text = await call(
            need, model=model, headers=headers, base_url=base_url, seconds=settings.timeout
        )
        if not text.strip():
            record.summariser_failures += 1
            await release(store, tenant, conversation, held)
            return Obtained(SummaryReply(None, failure="the summariser answered with no text"))
        return Obtained(SummaryReply(text), held)
    except (anthropic.APIError, openai.APIError) as e:
        record.summariser_failures += 1
        log.warning("summariser call failed: %s (%r)", type(e).__name__, e.__cause__)
        await release(store, tenant, conversation, held)
        return Obtained(SummaryReply(None, failure=f"summariser failed: {type(e).__name__}"))
    except BaseException:
        await release(store, tenant, conversation, held)
        raise


async def release(store: Store, tenant: str, conversation: str, held: tuple[str, str]) -> None:
    with contextlib.suppress(StoreUnavailable):  # else it expires by itself
        await store.release_lock(tenant, conversation, held[0], held[1])


async def _wait_for_other(
    store: Store, tenant: str, conversation: str, key: str, settings: SummariserSettings
) -> SummaryReply:
    loop = asyncio.get_running_loop()
    deadline = loop.time() + settings.wait
    while loop.time() < deadline:
        await asyncio.sleep(settings.poll)
        try:
            stored = await store.get_json(tenant, conversation, SUMMARY, key)
        except StoreUnavailable as e:
            return SummaryReply(None, failure=f"store unavailable: {e}")
        if isinstance(stored, str) and stored.strip():
            return SummaryReply(stored, reused=True)
    return SummaryReply(None, failure="another replica is still summarising")


async def call_summariser(
    need: GetSummary, *, model: str, headers: Mapping[str, str], base_url: str, seconds: float
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
    # The caller's budget pays for it.
    detached().meter.summariser(anthropic_usage(message.usage.model_dump()))
    return "".join(b.text for b in message.content if b.type == "text")


async def call_chat_summariser(
    need: GetSummary, *, model: str, headers: Mapping[str, str], base_url: str, seconds: float
) -> str:
    """One Chat Completions call through the openai SDK, with the caller's credential
    (and its organization and project headers)."""
    extra = {PURPOSE_HEADER: "summary"}
    for name in ("OpenAI-Organization", "OpenAI-Project"):
        if headers.get(name):
            extra[name] = headers[name]
    client = openai.AsyncOpenAI(
        base_url=base_url.rstrip("/") + "/v1",
        api_key=credential(headers) or "none",
        max_retries=1,
        timeout=seconds,
        default_headers=extra,
    )
    async with client:
        completion = await client.chat.completions.create(
            model=need.model or model,
            max_completion_tokens=need.slot,
            messages=[
                {"role": "system", "content": INSTRUCTION},
                {"role": "user", "content": need.transcript},
            ],
        )
    if completion.usage is not None:  # the caller's budget pays
        detached().meter.summariser(chat_usage(completion.usage.model_dump()))
    if not completion.choices:
        return ""
    return completion.choices[0].message.content or ""


async def call_responses_summariser(
    need: GetSummary, *, model: str, headers: Mapping[str, str], base_url: str, seconds: float
) -> str:
    """One Responses call through the openai SDK, with the caller's credential (and its
    organization and project headers); stored nowhere upstream (`store: false`)."""
    async with _openai_client(headers, base_url, seconds) as client:
        response = await client.responses.create(
            model=need.model or model,
            max_output_tokens=need.slot,
            instructions=INSTRUCTION,
            input=[{"role": "user", "content": need.transcript}],
            store=False,
        )
    if response.usage is not None:  # the caller's budget pays
        detached().meter.summariser(responses_usage(response.usage.model_dump()))
    return response.output_text


def _openai_client(headers: Mapping[str, str], base_url: str, seconds: float) -> openai.AsyncOpenAI:
    extra = {PURPOSE_HEADER: "summary"}
    for name in ("OpenAI-Organization", "OpenAI-Project"):
        if headers.get(name):
            extra[name] = headers[name]
    return openai.AsyncOpenAI(
        base_url=base_url.rstrip("/") + "/v1",
        api_key=credential(headers) or "none",
        max_retries=1,
        timeout=seconds,
        default_headers=extra,
    )


# The summariser call of each wire format (by WireFormat.name).
SUMMARISERS: dict[str, SummaryCall] = {
    "anthropic": call_summariser,
    "chat": call_chat_summariser,
    "responses": call_responses_summariser,
}
