"""Calibration: how far the local token count is from what the upstream reports, per
tenant and model.

Each tenant (a proxy key's, or the hash of the caller's credential) has its own factor
per model, so what one tenant sends can never move how another's history is counted:
one tenant's unusual requests (documents the counter can only guess at, a model alias
that tokenizes differently) would otherwise skew every tenant's compaction. Requests
holding images, documents, files or audio are not sampled at all: the counter charges
those a flat guess, and their ratio says nothing about text.

The factor (real / estimated) is shared by the fleet through a running mean in Redis,
under a key named by a digest of the tenant and the model (never the model name itself);
each replica keeps its own copy, refreshed in the background every CALIBRATION_REFRESH
seconds and never waited for, at most CALIBRATION_ENTRIES of them (the least recently
used go first). Samples come from the usage the upstream reported for the first round of
an answer, against the estimate of what was sent (proxy/core/calibration.py clamps and
checks them). After a warm-up of CALIBRATION_SAMPLES requests, one response in
CALIBRATION_EVERY feeds it: a ratio that changes slowly needs few of them. A request
hands its sample to the replica's one writer (a task started with the first) and is done
with it; a sample that finds CALIBRATION_QUEUE of them waiting is dropped (a sample, not
state: the mean has plenty). The writer writes what waits in one call per factor (its
samples in order: the mean one by one would give), then rests CALIBRATION_WRITE_EVERY
seconds while more gather: a Redis round trip costs some 150 µs of this process's CPU,
so under load it is one per factor a tenth of a second, not one per sample. What still
waits at close is written then. Without a store the same mean is kept in memory.
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import time
from collections import OrderedDict
from collections.abc import Coroutine
from dataclasses import dataclass
from typing import Any

from proxy.core.model_names import model_digest
from proxy.core.wire_format import Request
from proxy.server.tasks import spawn_watched, stop_tasks
from proxy.store import Store, StoreUnavailable

CALIBRATION = "calibration"
CALIBRATION_REFRESH = 30.0  # seconds a replica trusts its copy of a factor
CALIBRATION_SAMPLES = 20
CALIBRATION_EVERY = 16
CALIBRATION_ENTRIES = 20_000  # (tenant, model) factors one replica keeps
CALIBRATION_QUEUE = 1_000  # samples waiting for the writer, at most
CALIBRATION_WRITE_EVERY = 0.1  # seconds the writer rests after a write


def calibrated_as(wire: Request, model: str) -> str:
    """The name a model's calibration factor is kept under: per format as well (the
    same model's Chat and Responses requests are counted with different errors)."""
    return f"{wire.name}:{model}"


def store_name(model: str, tenant: str) -> str:
    """The name of a tenant's factor for a model in the store (never the model itself)."""
    return model_digest(f"{tenant}\0{model}")


@dataclass(slots=True)
class _Factor:
    name: str  # its key name in the store
    value: float = 1.0
    fetched: float = float("-inf")
    refreshing: bool = False
    seen: int = 0  # requests of this tenant and model
    samples: int = 0  # of them, fed to calibration


class Calibration:
    def __init__(
        self, entries: int = CALIBRATION_ENTRIES, waiting: int = CALIBRATION_QUEUE
    ) -> None:
        self._factors: OrderedDict[tuple[str, str], _Factor] = OrderedDict()
        self._entries = entries
        self._tasks: set[asyncio.Task[None]] = set()  # the writer, the refreshes
        self._waiting = waiting
        self._samples: asyncio.Queue[tuple[_Factor, float, Store]] = asyncio.Queue(waiting)
        self._writer: asyncio.Task[None] | None = None

    def __len__(self) -> int:
        return len(self._factors)

    def _entry(self, model: str, tenant: str) -> _Factor:
        key = (tenant, model)
        entry = self._factors.get(key)
        if entry is None:
            entry = self._factors[key] = _Factor(store_name(model, tenant))
            while len(self._factors) > self._entries:
                self._factors.popitem(last=False)
        else:
            self._factors.move_to_end(key)
        return entry

    def factor(self, model: str, store: Store | None, tenant: str = "") -> float:
        """The tenant's factor for the model as this replica knows it (a refresh starts
        if stale)."""
        entry = self._entry(model, tenant)
        stale = time.monotonic() - entry.fetched > CALIBRATION_REFRESH
        if store is not None and stale and not entry.refreshing:
            entry.refreshing = True
            self._spawn(self._refresh(entry, store))
        return entry.value

    def wants_sample(self, model: str, tenant: str = "") -> bool:
        """Whether this request's usage should feed the factor."""
        entry = self._entry(model, tenant)
        entry.seen += 1
        return entry.samples < CALIBRATION_SAMPLES or entry.seen % CALIBRATION_EVERY == 0

    def record(self, model: str, ratio: float, store: Store | None, tenant: str = "") -> None:
        """Fold one answer's sample (`answer_sample`: its reported input / its estimate)
        into the tenant's factor for the model, fleet-wide when there is a store."""
        if not model:
            return
        entry = self._entry(model, tenant)
        entry.samples += 1
        if store is None:
            self._local(entry, ratio)
            return
        if self._writer is None or self._writer.done():  # (one that failed was logged)
            # A writer with a queue of its own (of the running loop), in a context of its
            # own: not the request's that happens to start it (its record, its trace
            # span), whose work it outlives.
            self._samples = asyncio.Queue(self._waiting)
            writer = self._write(self._samples)
            context = contextvars.Context()
            self._writer = spawn_watched(self._tasks, writer, "calibration", context=context)
        with contextlib.suppress(asyncio.QueueFull):  # dropped: a sample, not state
            self._samples.put_nowait((entry, ratio, store))

    @staticmethod
    def _local(entry: _Factor, ratio: float) -> None:
        # The same running mean the store keeps (proxy/store/redis.py _MEAN), in memory.
        n = min(entry.samples, CALIBRATION_SAMPLES)
        entry.value += (ratio - entry.value) / max(1, n)

    async def _refresh(self, entry: _Factor, store: Store) -> None:
        try:
            found = await store.get_global_mean(CALIBRATION, entry.name)
            if found is not None and found[0] > 0:
                entry.value = found[0]
        except StoreUnavailable:
            pass
        finally:
            entry.fetched = time.monotonic()
            entry.refreshing = False

    async def _write(self, samples: asyncio.Queue[tuple[_Factor, float, Store]]) -> None:
        """The writer, for as long as the replica runs: what waits, then a rest."""
        while True:
            taken = [await samples.get()]
            await self._record(_by_factor(samples, taken))
            await asyncio.sleep(CALIBRATION_WRITE_EVERY)

    async def _record(self, factors: list[tuple[_Factor, Store, list[float]]]) -> None:
        """Each factor's samples in one call."""
        for entry, store, ratios in factors:
            try:
                entry.value, _ = await store.update_global_mean(
                    CALIBRATION, entry.name, ratios, max_samples=CALIBRATION_SAMPLES
                )
                entry.fetched = time.monotonic()
            except StoreUnavailable:
                for ratio in ratios:
                    self._local(entry, ratio)

    def _spawn(self, coro: Coroutine[Any, Any, None]) -> None:
        spawn_watched(self._tasks, coro, "calibration")

    async def close(self) -> None:
        """Stop the writer and the refreshes, then write what samples still wait."""
        await stop_tasks(list(self._tasks), what="calibration write")
        await self._record(_by_factor(self._samples, []))


def _by_factor(
    samples: asyncio.Queue[tuple[_Factor, float, Store]], taken: list[tuple[_Factor, float, Store]]
) -> list[tuple[_Factor, Store, list[float]]]:
    """`taken` and every sample still queued, by factor, in the order they came."""
    while not samples.empty():
        taken.append(samples.get_nowait())
    by_factor: dict[tuple[int, int], tuple[_Factor, Store, list[float]]] = {}
    for entry, ratio, store in taken:
        by_factor.setdefault((id(entry), id(store)), (entry, store, []))[2].append(ratio)
    return list(by_factor.values())
