"""Getting a summary for a crossing: reuse a stored one, or make it once for the fleet.

A summary is stored under the hash of the turns it folds, per conversation, so every
later request (on any replica) whose history starts with them reuses it byte for byte.
Making one costs an upstream call, so a lock (proxy/store/summary_lock.py) lets one
replica make it while the others wait briefly for it and, if it does not come in time,
pack instead. The maker
keeps the lock until the crossing's writes have stored the summary (the executor
releases it), so no second replica pays for the same summary in between.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

import orjson
from multidict import MultiMapping

from proxy import tracing
from proxy.core.commands import GetSummary, PreparedSummary, PrepareSummary, SummaryReply
from proxy.core.errors import UpstreamError
from proxy.core.per_request import per_request
from proxy.core.usage import Usage
from proxy.core.wire_format import WireFormat
from proxy.server.envelope import Envelope
from proxy.server.headers import upstream_request_headers
from proxy.server.record import RequestRecord
from proxy.server.upstream import Upstream
from proxy.store import Store, StoreUnavailable, SummaryLock
from proxy.store.keys import SUMMARY  # the store kind summaries are kept under

log = logging.getLogger(__name__)

PURPOSE_HEADER = "x-compaction-proxy-purpose"


SummaryCall = Callable[[GetSummary], Awaitable[tuple[str, Usage | None]]]


class Settles(Protocol):
    def settle(self, usage: Usage | None) -> None: ...


class SummaryBudget(Protocol):
    """What summaries made for a caller may spend (proxy/server/budgets.py has the one
    with budgets): `at_crossing` holds a summary made for the request in its own
    reservation (False: refused); `ahead` holds one made in the background on its own
    (None: refused), settled when its call returns."""

    async def at_crossing(self, estimated_input: int, max_tokens: int) -> bool: ...

    async def ahead(self, estimated_input: int, max_tokens: int) -> Settles | None: ...


class _Free:
    """No budgets: every summary may be made, nothing to settle."""

    async def at_crossing(self, estimated_input: int, max_tokens: int) -> bool:
        return True

    async def ahead(self, estimated_input: int, max_tokens: int) -> Settles | None:
        return self

    def settle(self, usage: Usage | None) -> None:
        return None


FREE_SUMMARIES: SummaryBudget = _Free()


@dataclass(frozen=True, slots=True)
class Obtained:
    reply: SummaryReply
    lock: SummaryLock | None = None  # still held: release it once the summary is stored


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
    settings: SummariserSettings,
    call: SummaryCall,
    spend: SummaryBudget = FREE_SUMMARIES,
    record: RequestRecord | None = None,
) -> Obtained:
    key = need.key
    # Held through the call and until the crossing's writes (then released).
    lock = SummaryLock(store, tenant, conversation, key, settings.timeout)
    try:
        stored = await store.get_json(tenant, conversation, SUMMARY, key)
        if isinstance(stored, str) and stored.strip():
            return Obtained(SummaryReply(stored, reused=True))
        if not await lock.acquire() and need.ahead:
            found = await _wait_for_ahead(lock, settings)
            if found is not None:
                return Obtained(SummaryReply(found, reused=True, waited=True))
            if not lock.held:
                return Obtained(SummaryReply(None, failure="the summary made ahead never came"))
    except StoreUnavailable as e:
        return Obtained(SummaryReply(None, failure=f"store unavailable: {e}", unread=True))
    if not lock.held:
        return Obtained(await _wait_for_other(store, tenant, conversation, key, settings))
    if record is None:  # (no request's: a throwaway counts the call)
        record = RequestRecord("", "", "")
    try:
        if not await spend.at_crossing(summary_input(need), need.summary_tokens):
            await lock.release()
            return Obtained(SummaryReply(None, failure="the caller's budget has no room"))
        record.summariser_calls += 1
        text, usage = await call(need)
        if usage is not None:  # the caller's budget pays for it
            record.meter.summariser(usage)
        if not text.strip():
            record.summariser_failures += 1
            await lock.release()
            return Obtained(SummaryReply(None, failure="the summariser answered with no text"))
        return Obtained(SummaryReply(text), lock)
    except (SummariserFailed, UpstreamError, TimeoutError) as e:
        record.summariser_failures += 1
        log.warning("summariser call failed: %s (%s)", type(e).__name__, e)
        await lock.release()
        return Obtained(SummaryReply(None, failure=f"summariser failed: {type(e).__name__}"))
    except BaseException:
        await lock.release()
        raise


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
            return SummaryReply(None, failure=f"store unavailable: {e}", unread=True)
        if isinstance(stored, str) and stored.strip():
            return SummaryReply(stored, reused=True)
    return SummaryReply(None, failure="another replica is still summarising")


async def _wait_for_ahead(lock: SummaryLock, settings: SummariserSettings) -> str | None:
    """Wait for the summary being made ahead (its maker holds `lock`): its text once
    stored; None with `lock` held when its maker let go without storing it (its
    summariser call failed): the caller makes it; None with `lock` not held when neither
    happened within the longest a summariser call may take (plus `wait`): its maker went
    away with the lock, and the crossing packs. Raises StoreUnavailable."""
    store, tenant, conversation, key = lock.store, lock.tenant, lock.conversation, lock.key
    loop = asyncio.get_running_loop()
    deadline = loop.time() + settings.timeout + settings.wait
    while loop.time() < deadline:
        await asyncio.sleep(settings.poll)
        stored = await store.get_json(tenant, conversation, SUMMARY, key)
        if isinstance(stored, str) and stored.strip():
            return stored
        if await lock.acquire():
            # Its maker is done: stored since the last look, or not at all.
            stored = await store.get_json(tenant, conversation, SUMMARY, key)
            if isinstance(stored, str) and stored.strip():
                await lock.release()
                return stored
            return None
    return None


async def finished(need: GetSummary, text: str, count: Callable[[str], int]) -> str:
    """A summary the summariser made, finished as stored (`GetSummary.finished`: the
    identifiers it left out appended). Ranking the folded turns' identifiers is pure work
    of tens of ms: off the loop."""
    if need.facts_budget <= 0 or not need.facts.sources:
        return text
    ranked = await asyncio.to_thread(need.facts.ranked)
    return need.finished(text, count, ranked)


def summary_input(need: GetSummary) -> int:
    """What a summariser call is reserved for as input before it is made: its body's
    bytes over 3 (errs high for text and code; settled to what the upstream reports)."""
    return len(need.encoded or orjson.dumps(need.body)) // 3 + 1


@per_request
class SummaryCalls:
    """The summariser calls of one request (a `SummaryCall`): through its route's
    upstream (and its signer), with the caller's credential, betas and API version, in
    its envelope."""

    upstream: Upstream
    path: str  # the request's
    headers: MultiMapping[str]  # the client's
    wire: WireFormat
    envelope: Envelope
    seconds: float
    # Told when an in-place body with read_result deferred was refused and its listed
    # form answered (the compactor remembers it for the model there).
    relisted: Callable[[], None] | None = None

    async def __call__(self, need: GetSummary) -> tuple[str, Usage | None]:
        path, wrapped = self.envelope.summary(self.path, need)
        return await post_summary(
            wrapped,
            upstream=self.upstream,
            path=path,
            headers=upstream_request_headers(self.headers),
            wire=self.wire,
            seconds=self.seconds,
            relisted=self.relisted,
        )


class SummariserFailed(Exception):
    """The summariser gave no usable answer (an error status, or no text)."""

    def __init__(self, message: str, status: int = 0) -> None:
        super().__init__(message)
        self.status = status  # the upstream's error status (0: it answered)


async def post_summary(
    need: GetSummary,
    *,
    upstream: Upstream,
    path: str,
    headers: Sequence[tuple[str, str]],
    wire: WireFormat,
    seconds: float,
    relisted: Callable[[], None] | None = None,
) -> tuple[str, Usage | None]:
    """One summariser call: the request the driver built, sent through the proxy's own
    upstream client with the caller's credential, betas and API version (a summary made
    in place must match the conversation's requests to read their cache); it says what it
    is in PURPOSE_HEADER. Returns its text and the usage the upstream reported. An answer
    that calls a tool is no summary: the transcript request (`need.fallback`) is sent then,
    and the usage is both calls'. An in-place body refused with a 400 where the proxy
    deferred read_result in it goes once more listed (`need.relist`), as the
    conversation's request does; `relisted` is told when that one is answered."""
    sent = [
        (name, value)
        for name, value in headers
        if name.lower() not in ("accept-encoding", "content-type", PURPOSE_HEADER)
    ]
    sent += [
        ("Content-Type", "application/json"),
        ("Accept-Encoding", "identity"),
        (PURPOSE_HEADER, "summary"),
    ]
    async with asyncio.timeout(seconds):
        body = need.encoded or orjson.dumps(need.body)
        try:
            answer = await _ask(upstream, path, sent, body, need.model)
        except SummariserFailed as refused:
            if refused.status != 400 or need.relist is None:
                raise
            log.info("the summary made in place was refused deferred: asking with it listed")
            listed = orjson.dumps(wire.listed(need.body, need.relist))
            answer = await _ask(upstream, path, sent, listed, need.model)
            if relisted is not None:
                relisted()
        usage = wire.body_usage(answer)
        if calls_tool(answer):
            if need.fallback is None:
                raise SummariserFailed("the summariser called a tool")
            log.info("the summary made in place called a tool: asking with the transcript")
            again = await _ask(upstream, path, sent, orjson.dumps(need.fallback), need.model)
            more = wire.body_usage(again)
            if calls_tool(again):
                raise SummariserFailed("the summariser called a tool")
            usage = more if usage is None else usage if more is None else usage.plus(more)
            answer = again
    return wire.answer_text(answer), usage


async def _ask(
    upstream: Upstream, path: str, headers: list[tuple[str, str]], body: bytes, model: str
) -> dict[str, Any]:
    response = await upstream.send(
        "POST", path, headers, body, stream=False, purpose="summary", model=model
    )
    raw = await upstream.read(response)  # within upstream.max_answer_bytes
    if response.status != 200:
        raise SummariserFailed(f"upstream answered {response.status}", response.status)
    try:
        answer = orjson.loads(raw)
    except orjson.JSONDecodeError:
        raise SummariserFailed("the answer was not JSON") from None
    if not isinstance(answer, dict):
        raise SummariserFailed("the answer was not a JSON object")
    return answer


TOOL_CALLS = frozenset({"tool_use", "server_tool_use", "function_call", "custom_tool_call"})


def calls_tool(answer: dict[str, Any]) -> bool:
    """Whether an answer (Messages, Chat, Responses or Gemini) calls a tool rather than (only)
    writing text."""
    blocks = answer.get("content")
    items = answer.get("output")
    for part in [
        *(blocks if isinstance(blocks, list) else []),
        *(items if isinstance(items, list) else []),
    ]:
        if isinstance(part, dict) and part.get("type") in TOOL_CALLS:
            return True
    choices = answer.get("choices")
    for choice in choices if isinstance(choices, list) else []:
        message = choice.get("message") if isinstance(choice, dict) else None
        if isinstance(message, dict) and message.get("tool_calls"):
            return True
    candidates = answer.get("candidates")  # Gemini: a functionCall part
    for candidate in candidates if isinstance(candidates, list) else []:
        content = candidate.get("content") if isinstance(candidate, dict) else None
        parts = content.get("parts") if isinstance(content, dict) else None
        for part in parts if isinstance(parts, list) else []:
            if isinstance(part, dict) and ("functionCall" in part or "function_call" in part):
                return True
    return False


def prepared_of(raw: object) -> PreparedSummary | None:
    """A stored note of a summary made ahead (None when absent or malformed, or of a
    version that did not record what its summariser call saw: never used)."""
    if not isinstance(raw, dict) or not isinstance(raw.get("key"), str):
        return None
    folds, seen, covers, made = raw.get("folds"), raw.get("seen"), raw.get("n"), raw.get("made", 0)
    if not isinstance(folds, str) or not isinstance(seen, str) or not folds or not seen:
        return None
    if not isinstance(covers, int) or isinstance(covers, bool) or covers <= 0:
        return None
    if not isinstance(made, int) or isinstance(made, bool):
        made = 0
    text = raw.get("text")
    usable = text if isinstance(text, str) and text.strip() else None
    return PreparedSummary(raw["key"], usable, raw.get("failed") is True, folds, covers, seen, made)


def note_record(note: PreparedSummary, **more: object) -> dict[str, object]:
    """A note of a summary made ahead as stored (prepared_of reads it back)."""
    record: dict[str, object] = {"key": note.key, "folds": note.folds, "n": note.covers,
                                 "seen": note.seen, "made": note.made}  # fmt: skip
    return {**record, **more}


# How long a summary made ahead waits for the answer of the request it was made from to
# start (its prefix is in the provider's cache from then on), at most (seconds).
ANSWER_WAIT = 30.0


@dataclass(slots=True)
class Ahead:
    """A summary made ahead, begun: its lock held, its call reserved in the caller's
    budgets (`apart`), its note kept as being made."""

    command: PrepareSummary
    lock: SummaryLock
    apart: Settles


async def begin_ahead(
    command: PrepareSummary,
    *,
    store: Store,
    tenant: str,
    conversation: str,
    settings: SummariserSettings,
    spend: SummaryBudget,
) -> Ahead | None:
    """Begin the next fold's summary made ahead, once for the fleet (the same lock as a
    summary made at a crossing): the lock, the call reserved in the caller's budgets, its
    note kept in the root as being made (what it folds and what its call saw:
    proxy/core/lines.py), so that the next request of the line, and every replica, sees
    it being made. None when another replica makes it, the store is away, or a budget
    refuses it (a failed note then: the crossing makes the summary itself, or packs).
    Awaited in the request that asks for it (a few store round trips), so the note is
    there before its answer is; `make_ahead` then makes it in the background."""
    # The lock's time covers the wait for the answer to start, then the call.
    lock = SummaryLock(store, tenant, conversation, command.ask.key, settings.timeout + ANSWER_WAIT)
    note = command.note  # None: the summary is stored, no crossing is told of it
    try:
        if not await lock.acquire():
            return None  # another replica is making it
    except StoreUnavailable:
        return None
    apart: Settles | None = None
    try:
        apart = await spend.ahead(summary_input(command.ask), command.ask.summary_tokens)
        if note is not None:
            record = note_record(note) if apart is not None else note_record(note, failed=True)
            await store.put_note(
                tenant, conversation, command.root, note.seen, record, command.evict_notes
            )
        if apart is not None:
            return Ahead(command, lock, apart)
    except StoreUnavailable as e:
        log.info("summary made ahead not begun: %s", e)
    except BaseException:
        if apart is not None:
            apart.settle(None)
        await lock.release()
        raise
    if apart is not None:
        apart.settle(None)  # not begun: a refund
    await lock.release()
    return None


async def make_ahead(
    ahead: Ahead,
    *,
    call: SummaryCall,
    count: Callable[[str], int],
    on_call: Callable[[bool], None],
    after: asyncio.Event | None = None,
) -> None:
    """Make the summary begun ahead, in the background, and release its lock: its call
    goes up once `after` is set (the answer of the request it was made from has started:
    made in place, it reads that request's prefix, which the provider caches only then),
    or after ANSWER_WAIT; then it is stored, and its note given its text (or said
    failed). The call is settled to its usage in the caller's budgets."""
    command, lock, apart = ahead.command, ahead.lock, ahead.apart
    tracing.note({"compaction.tenant": lock.tenant, "compaction.conversation": lock.conversation})
    async with lock:
        store, tenant, conversation, key = lock.store, lock.tenant, lock.conversation, lock.key
        note = command.note  # None: the summary is stored, no crossing is told of it
        try:
            if after is not None and not after.is_set():
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(after.wait(), ANSWER_WAIT)
            try:
                text, usage = await call(command.ask)
            except (SummariserFailed, UpstreamError, TimeoutError) as e:
                on_call(False)
                log.warning("summary made ahead failed: %s (%s)", type(e).__name__, e)
                text, usage = "", None
            else:
                on_call(True)
            apart.settle(usage)
            if not text.strip():
                tracing.note({"compaction.summary": "failed"})
                # Said, so the crossing asks for it itself rather than wait for it.
                if note is not None:
                    record = note_record(note, failed=True)
                    await store.put_note(tenant, conversation, command.root, note.seen, record, ())
                return
            text = await finished(command.ask, text, count)
            await store.put_json(tenant, conversation, SUMMARY, key, text)
            if note is not None:
                record = note_record(note, text=text)
                await store.put_note(tenant, conversation, command.root, note.seen, record, ())
            tracing.note({"compaction.summary": "made"})
        except StoreUnavailable as e:
            log.info("summary made ahead not stored: %s", e)
        finally:
            apart.settle(None)  # no call made (cancelled, the store away): a refund
