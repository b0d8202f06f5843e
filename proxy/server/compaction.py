"""Carry out compaction for one Messages request: the effects of the pure plan.

The order of work keeps the common case cheap: count the history (cached per block);
when even the calibrated count is under the trigger, no checkpoint can apply (one is only
made when the history crossed), so the original bytes go out without a Redis call. Only
above the trigger does the proxy read the conversation's checkpoint, plan, store blobs,
summaries and the new checkpoint, and encode the rewritten body. Any failure of its own
parts degrades: no store means pack without offload or summary; an error in planning
means the request goes out untouched (DESIGN invariant 7).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from proxy.core.calibration import sample_ratio
from proxy.core.identity import conversation_of, tenant_of
from proxy.core.intake import (
    Planning,
    cannot_cross,
    checkpoint_slot,
    count_request,
    digests_of,
    plan_input,
    replaced_fields,
)
from proxy.core.policy import DEFAULT_POLICIES, Policy, parse_policies, policy_for
from proxy.core.rewrite import (
    NeedSummary,
    Refuse,
    Rewrite,
    Untouched,
    finish_with_summary,
    plan_request,
)
from proxy.core.tokens import TokenCounter, default_counter
from proxy.server import observe
from proxy.server.summariser import SummariserSettings, obtain_summary
from proxy.server.wires import ANTHROPIC_WIRE, Wire
from proxy.store import Store, StoreUnavailable
from proxy.store.keys import BLOB
from proxy.wire.anthropic import encode_request, request_messages

log = logging.getLogger(__name__)

CHECKPOINT = "checkpoint"
CALIBRATION = "calibration"
CALIBRATION_REFRESH = 30.0  # seconds a replica trusts its copy of a model's factor
CALIBRATION_SAMPLES = 20
# Reported usage fields that together are a request's whole input.
INPUT_KEYS = ("input_tokens", "cache_creation_input_tokens", "cache_read_input_tokens")
COUNT_OFF_LOOP_BYTES = 256 * 1024
# Once the factor has settled, one response in this many feeds it: each sample costs a
# Redis round trip, and a ratio that changes slowly needs few of them.
CALIBRATION_EVERY = 16


@dataclass(slots=True)
class Interception:
    """What the read_result loop needs to answer calls and ask again."""

    tool: str
    tenant: str
    conversation: str
    body: dict[str, Any]  # the rewritten request, as sent
    policy: Policy
    wire: Wire = ANTHROPIC_WIRE


@dataclass(slots=True)
class Prepared:
    """The outcome for the handler: bytes to send, or an error to answer with."""

    body: bytes
    headers: list[tuple[str, str]] = field(default_factory=list)
    interception: Interception | None = None
    refusal: str | None = None
    estimate: int = 0  # estimated input tokens of what is sent, for calibration
    model: str = ""


@dataclass(slots=True)
class _Factor:
    value: float = 1.0
    fetched: float = float("-inf")
    refreshing: bool = False
    seen: int = 0  # requests of this model
    samples: int = 0  # of them, fed to calibration


class Compactor:
    """Per-process compaction state: policies, the counter, calibration factors."""

    def __init__(
        self,
        raw_policies: Sequence[Mapping[str, Any]] = (),
        *,
        counter: TokenCounter | None = None,
        summariser: SummariserSettings | None = None,
    ) -> None:
        self.policies = [*parse_policies(raw_policies), *DEFAULT_POLICIES]
        self.counter = counter or default_counter()
        self.summariser = summariser or SummariserSettings()
        self._factors: dict[str, _Factor] = {}
        self._tasks: set[asyncio.Task[None]] = set()

    # -- calibration ---------------------------------------------------------------------

    def factor(self, model: str, store: Store | None) -> float:
        """The model's calibration factor as this replica knows it; refreshed in the
        background from the fleet's shared value, never waited for."""
        entry = self._factors.setdefault(model, _Factor())
        stale = time.monotonic() - entry.fetched > CALIBRATION_REFRESH
        if store is not None and stale and not entry.refreshing:
            entry.refreshing = True
            self._spawn(self._refresh(model, entry, store))
        return entry.value

    async def _refresh(self, model: str, entry: _Factor, store: Store) -> None:
        try:
            found = await store.get_global_mean(CALIBRATION, model)
            if found is not None and found[0] > 0:
                entry.value = found[0]
        except StoreUnavailable:
            pass
        finally:
            entry.fetched = time.monotonic()
            entry.refreshing = False

    def wants_sample(self, model: str) -> bool:
        """Whether this request's usage should feed the model's calibration."""
        entry = self._factors.setdefault(model, _Factor())
        entry.seen += 1
        return entry.samples < CALIBRATION_SAMPLES or entry.seen % CALIBRATION_EVERY == 0

    def record_usage(self, model: str, estimate: int, usage: Mapping[str, Any], store: Any) -> None:
        """Fold one response's reported input into the model's factor (fleet-wide)."""
        reported = sum(int(usage.get(k) or 0) for k in INPUT_KEYS)
        ratio = sample_ratio(estimate, reported)
        if ratio is None or not model:
            return
        entry = self._factors.setdefault(model, _Factor())
        entry.samples += 1
        if store is None:
            entry.value += (ratio - entry.value) / CALIBRATION_SAMPLES
            return
        self._spawn(self._record(model, ratio, entry, store))

    async def _record(self, model: str, ratio: float, entry: _Factor, store: Store) -> None:
        try:
            entry.value, _ = await store.update_global_mean(
                CALIBRATION, model, ratio, max_samples=CALIBRATION_SAMPLES
            )
            entry.fetched = time.monotonic()
        except StoreUnavailable:
            entry.value += (ratio - entry.value) / CALIBRATION_SAMPLES

    def _spawn(self, coro: Any) -> None:
        task = asyncio.get_running_loop().create_task(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def close(self) -> None:
        for task in list(self._tasks):
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)

    # -- one request ---------------------------------------------------------------------

    async def prepare(
        self,
        body_bytes: bytes,
        body: dict[str, Any],
        headers: Mapping[str, str],
        *,
        store: Store | None,
        upstream_url: str,
        wire: Wire = ANTHROPIC_WIRE,
        tenant: str | None = None,
        policy_override: Mapping[str, int] | None = None,
    ) -> Prepared:
        """`tenant` and `policy_override` come from a proxy key when keys are required
        (else the tenant is the hash of the forwarded credential)."""
        messages = request_messages(body)
        model = str(body.get("model", ""))
        if not messages:
            return Prepared(body_bytes, model=model)
        policy = policy_for(model, self.policies, policy_override)
        fmt = wire.format
        counter = fmt.counter(self.counter)
        factor = self.factor(model, store)
        sample = self.wants_sample(model)
        if not sample and cannot_cross(body_bytes, policy, factor):
            return Prepared(body_bytes, model=model)  # not even counted
        if len(body_bytes) > COUNT_OFF_LOOP_BYTES:
            # A cold count of a big history takes tens of ms: keep the loop free meanwhile
            # (tiktoken encodes without the GIL).
            counted = await asyncio.to_thread(count_request, fmt, counter, body, messages)
        else:
            counted = count_request(fmt, counter, body, messages)
        estimate = counted.history + counted.fixed
        if counted.fits(policy, factor):
            return Prepared(body_bytes, estimate=estimate if sample else 0, model=model)

        tenant = tenant or tenant_of(headers)
        conversation = conversation_of(headers, fmt.identity_view(body), tenant)
        digests = digests_of(messages)
        slot = checkpoint_slot(digests)
        checkpoint, store_ok = None, store is not None
        if store is not None:
            try:
                found = await store.get_json(tenant, conversation, CHECKPOINT, slot)
                checkpoint = found if isinstance(found, dict) else None
            except StoreUnavailable:
                store_ok = False
        planning = plan_input(
            fmt,
            counter,
            body,
            messages,
            counted,
            digests,
            policy=policy,
            factor=factor,
            checkpoint=checkpoint,
            store_ok=store_ok,
        )
        inp = planning.inp
        outcome = plan_request(inp)
        if isinstance(outcome, NeedSummary):
            assert store is not None  # a summary is only asked for with a store
            got = await obtain_summary(
                outcome,
                store=store,
                tenant=tenant,
                conversation=conversation,
                model=model,
                headers=headers,
                base_url=upstream_url,
                settings=self.summariser,
                call=wire.summarise,
            )
            if got.failure:
                log.info("no summary (%s); packing instead", got.failure)
            outcome = finish_with_summary(outcome, got.text, reused=got.reused)
        if isinstance(outcome, Untouched):
            return Prepared(body_bytes, estimate=estimate, model=model)
        if isinstance(outcome, Refuse):
            observe.refused()
            return Prepared(body_bytes, refusal=outcome.message, model=model)
        if store is not None and not await self._store_effects(
            store, tenant, conversation, slot, outcome
        ):
            # Blobs that cannot be stored cannot be read back: plan again without them.
            inp = replace(inp, store_ok=False, checkpoint=None)
            fallback = plan_request(inp)
            if not isinstance(fallback, Rewrite):
                return Prepared(body_bytes, estimate=estimate, model=model)
            outcome = fallback
        observe.rewrite(
            outcome.strategy,
            outcome.tokens_before,
            outcome.tokens_after,
            len(outcome.blobs),
            outcome.summary,
        )
        return self._encode(body, outcome, tenant, conversation, policy, planning, model, wire)

    async def _store_effects(
        self, store: Store, tenant: str, conversation: str, slot: str, rewrite: Rewrite
    ) -> bool:
        try:
            writes = [
                store.put_blob(tenant, conversation, ref, text.encode())
                for ref, text in rewrite.blobs
            ]
            await asyncio.gather(*writes)
            if rewrite.checkpoint is not None:
                await store.put_json(tenant, conversation, CHECKPOINT, slot, rewrite.checkpoint)
                # Stubs kept from earlier crossings must live as long as the new checkpoint.
                new = {ref for ref, _ in rewrite.blobs}
                kept = [ref for ref in rewrite.refs if ref not in new]
                await store.refresh_ttl(tenant, conversation, BLOB, kept)
            return True
        except StoreUnavailable:
            return not rewrite.blobs

    def _encode(
        self,
        body: dict[str, Any],
        rewrite: Rewrite,
        tenant: str,
        conversation: str,
        policy: Policy,
        planning: Planning,
        model: str,
        wire: Wire,
    ) -> Prepared:
        changed = replaced_fields(wire.format, body, rewrite)
        headers = [
            ("x-compaction-strategy", rewrite.strategy),
            ("x-compaction-tokens-before", str(rewrite.tokens_before)),
            ("x-compaction-tokens-after", str(rewrite.tokens_after)),
            ("x-compaction-offloaded", str(len(rewrite.refs))),
            ("x-compaction-summary", rewrite.summary or "none"),
        ]
        interception = None
        if rewrite.tool:
            sent = {**body, **changed}
            interception = Interception(rewrite.tool, tenant, conversation, sent, policy, wire)
        return Prepared(
            encode_request(body, **changed),
            headers=headers,
            interception=interception,
            estimate=planning.fixed_sent(rewrite) + rewrite.estimate,
            model=model,
        )
