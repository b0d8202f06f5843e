"""Carry out the commands of the compaction driver.

The driver (proxy/core/driver.py) decides; `StoreExecutor` only does what a command says,
on Redis and the summariser, and answers with the reply the driver expects. Every failure
of the store becomes a reply saying so (never an exception): the driver then plans
without the store (proxy/server/driving.py `drive` runs the driver with it).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable, Coroutine
from dataclasses import replace
from functools import cached_property
from typing import Any, assert_never

from proxy.core.checkpoint import Line, decode_checkpoint, encode_checkpoint
from proxy.core.commands import (
    Command,
    GetSummary,
    LoadConversation,
    Loaded,
    PrepareSummary,
    Reply,
    SaveCrossing,
    Saved,
    Started,
    SummaryReply,
    TouchLine,
)
from proxy.server.record import RequestRecord
from proxy.server.summariser import (
    SummariserSettings,
    SummaryBudget,
    SummaryCall,
    begin_ahead,
    finished,
    make_ahead,
    obtain_summary,
    prepared_of,
)
from proxy.store import Store, StoreUnavailable, SummaryLock
from proxy.store.keys import SUMMARY

log = logging.getLogger(__name__)


def _ignore_count(count: float) -> None:
    return None


class StoreExecutor:
    """The commands of one request's driver, for one tenant's conversation. The identity
    is worked out on the first command: a request that needs none never pays for it."""

    def __init__(
        self,
        store: Store | None,
        identify: Callable[[], tuple[str, str]],
        *,
        summariser: SummariserSettings,
        summarise: SummaryCall,
        background: Callable[[Coroutine[Any, Any, None]], None],
        count: Callable[[str], int],
        spend: SummaryBudget,
        on_background_call: Callable[[bool], None],
        on_lines: Callable[[float], None] = _ignore_count,
        on_evicted: Callable[[float], None] = _ignore_count,
        answer_started: asyncio.Event | None = None,
        record: RequestRecord | None = None,
    ) -> None:
        self.record = record  # the request's: a summary made for it is counted on it
        self.answer_started = answer_started  # a summary made ahead goes up after it
        self.on_lines = on_lines  # told how many lines a load found (metrics)
        self.on_evicted = on_evicted  # ... and how many a crossing evicted
        self.store = store
        self._identify = identify
        self.summariser = summariser
        self.summarise = summarise
        self.background = background
        self.count = count
        self.spend = spend
        self.on_background_call = on_background_call
        self._held: list[SummaryLock] = []  # summary locks to release after saving

    @cached_property
    def identity(self) -> tuple[str, str]:
        """(tenant, conversation)."""
        return self._identify()

    @property
    def tenant(self) -> str:
        return self.identity[0]

    @property
    def conversation(self) -> str:
        return self.identity[1]

    @property
    def identified(self) -> bool:
        return "identity" in self.__dict__

    async def __call__(self, command: Command) -> Reply:
        match command:
            case LoadConversation():
                return await self._load(command)
            case GetSummary():
                return await self._summary(command)
            case PrepareSummary():
                return await self._prepare(command)
            case TouchLine():
                return self._touch_line(command)
            case SaveCrossing():
                return await self._save(command)
            case _:
                assert_never(command)

    async def _load(self, command: LoadConversation) -> Loaded:
        if self.store is None:
            return Loaded(None, store_ok=False)
        try:
            # Checkpoints decoded once per stored value: the next request reads them again.
            state = await self.store.load_conversation(
                self.tenant, self.conversation, command.root, decode=decode_checkpoint
            )
        except StoreUnavailable:
            return Loaded(None, store_ok=False)
        lines = [Line(checkpoint, used) for checkpoint, used in state.lines]
        notes = [n for n in map(prepared_of, state.notes) if n is not None]
        self.on_lines(len(lines))
        return Loaded(lines=tuple(lines), notes=tuple(notes))

    def _touch_line(self, command: TouchLine) -> Started:
        """Mark a line most recently used, off the request (it never waits for it)."""
        store = self.store
        if store is not None:
            tenant, conversation = self.identity

            async def touch() -> None:
                with contextlib.suppress(StoreUnavailable):
                    await store.touch_line(
                        tenant, conversation, command.root, command.line, command.used
                    )

            self.background(touch())
        return Started()

    async def _prepare(self, command: PrepareSummary) -> Started:
        """Begin the summary made ahead here (its lock, its reservation, its note: a few
        store round trips, so the next request of the line sees it being made), and make
        it off the request: it must outlive it (the caller pays when it is made) and never
        hold it up."""
        store = self.store
        if store is None:
            return Started()
        ahead = await begin_ahead(
            command,
            store=store,
            tenant=self.tenant,
            conversation=self.conversation,
            settings=self.summariser,
            spend=self.spend,
        )
        if ahead is not None:
            self.background(
                make_ahead(
                    ahead,
                    call=self.summarise,
                    count=self.count,
                    on_call=self.on_background_call,
                    after=self.answer_started,
                )
            )
        return Started()

    async def _summary(self, command: GetSummary) -> SummaryReply:
        if self.store is None:
            return SummaryReply(None, failure="no store")
        obtained = await obtain_summary(
            command,
            store=self.store,
            tenant=self.tenant,
            conversation=self.conversation,
            settings=self.summariser,
            call=self.summarise,
            spend=self.spend,
            record=self.record,
        )
        if obtained.lock is not None:
            self._held.append(obtained.lock)
        reply = obtained.reply
        if reply.text is not None and not reply.reused:  # made for this request
            reply = replace(reply, text=await finished(command, reply.text, self.count))
        return reply

    async def keep_summary(self, key: str, text: str) -> None:
        """Store a summary made apart from any crossing (a served compaction names it
        next), then release its lock: what `_save` does for a crossing's summary, in its
        writes. Raises StoreUnavailable: a summary not kept must not be named."""
        store = self.store
        if store is None:
            raise StoreUnavailable("no store to keep the summary in")
        try:
            await store.put_json(self.tenant, self.conversation, SUMMARY, key, text)
        finally:
            await self.close()

    async def _save(self, command: SaveCrossing) -> Saved:
        """Every write of the crossing in one round trip (`Store.save_crossing`: one script,
        or a pipeline per node on a Cluster; proxy/store/crossing.py)."""
        store = self.store
        if store is None:
            return Saved(ok=False)
        try:
            saved = await store.save_crossing(
                self.tenant,
                self.conversation,
                root=command.root,
                checkpoint=(
                    None if command.checkpoint is None else encode_checkpoint(command.checkpoint)
                ),
                blobs=command.blobs,
                summary=command.summary,
                touch=command.touch,
                line=command.checkpoint.prefix_hash if command.checkpoint is not None else "",
                used=command.used,
                evict=command.evict,
                evict_notes=command.evict_notes,
                # The line's next load takes this object, not its bytes decoded again.
                decoded=(
                    None if command.checkpoint is None else (decode_checkpoint, command.checkpoint)
                ),
            )
        finally:
            await self.close()
        if saved.error:
            log.info("crossing not wholly stored: %s", saved.error)
        elif command.evict:
            self.on_evicted(len(command.evict))
        return Saved(ok=saved.blobs and saved.checkpoint, lost=saved.lost)

    async def close(self) -> None:
        """Release what the commands still hold (a summary's lock when nothing saved it)."""
        held, self._held = self._held, []
        for lock in held:
            await lock.release()
