"""Calibration: how far the local token count is from what the upstream reports, per model.

The factor (real / estimated) is shared by the fleet through a running mean in Redis;
each replica keeps its own copy, refreshed in the background every CALIBRATION_REFRESH
seconds and never waited for. Samples come from the usage the upstream reported for the
first round of an answer, against the estimate of what was sent (proxy/core/calibration.py
clamps and checks them). After a warm-up of CALIBRATION_SAMPLES requests per model, one
response in CALIBRATION_EVERY feeds it: each sample costs a Redis round trip, and a ratio
that changes slowly needs few of them. Without a store the same mean is kept in memory.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Coroutine
from dataclasses import dataclass
from typing import Any

from proxy.core.calibration import sample_ratio
from proxy.store import Store, StoreUnavailable

CALIBRATION = "calibration"
CALIBRATION_REFRESH = 30.0  # seconds a replica trusts its copy of a model's factor
CALIBRATION_SAMPLES = 20
CALIBRATION_EVERY = 16


@dataclass(slots=True)
class _Factor:
    value: float = 1.0
    fetched: float = float("-inf")
    refreshing: bool = False
    seen: int = 0  # requests of this model
    samples: int = 0  # of them, fed to calibration


class Calibration:
    def __init__(self) -> None:
        self._factors: dict[str, _Factor] = {}
        self._tasks: set[asyncio.Task[None]] = set()

    def factor(self, model: str, store: Store | None) -> float:
        """The model's factor as this replica knows it (a refresh starts if stale)."""
        entry = self._factors.setdefault(model, _Factor())
        stale = time.monotonic() - entry.fetched > CALIBRATION_REFRESH
        if store is not None and stale and not entry.refreshing:
            entry.refreshing = True
            self._spawn(self._refresh(model, entry, store))
        return entry.value

    def wants_sample(self, model: str) -> bool:
        """Whether this request's usage should feed the model's calibration."""
        entry = self._factors.setdefault(model, _Factor())
        entry.seen += 1
        return entry.samples < CALIBRATION_SAMPLES or entry.seen % CALIBRATION_EVERY == 0

    def record(self, model: str, estimate: int, reported: int, store: Store | None) -> None:
        """Fold one answer's reported input (all of it: fresh, written, read) into the
        model's factor, fleet-wide when there is a store."""
        ratio = sample_ratio(estimate, reported)
        if ratio is None or not model:
            return
        entry = self._factors.setdefault(model, _Factor())
        entry.samples += 1
        if store is None:
            self._local(entry, ratio)
            return
        self._spawn(self._record(model, ratio, entry, store))

    @staticmethod
    def _local(entry: _Factor, ratio: float) -> None:
        # The same running mean the store keeps (proxy/store/redis.py _MEAN), in memory.
        n = min(entry.samples, CALIBRATION_SAMPLES)
        entry.value += (ratio - entry.value) / max(1, n)

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

    async def _record(self, model: str, ratio: float, entry: _Factor, store: Store) -> None:
        try:
            entry.value, _ = await store.update_global_mean(
                CALIBRATION, model, ratio, max_samples=CALIBRATION_SAMPLES
            )
            entry.fetched = time.monotonic()
        except StoreUnavailable:
            self._local(entry, ratio)

    def _spawn(self, coro: Coroutine[Any, Any, None]) -> None:
        task = asyncio.get_running_loop().create_task(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def close(self) -> None:
        for task in list(self._tasks):
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
