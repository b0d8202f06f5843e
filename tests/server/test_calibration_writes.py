"""Calibration's samples reach the fleet's mean in as few Redis calls as the time between
them allows: the writer writes a sample at once, then rests CALIBRATION_WRITE_EVERY
while more gather, and writes those in one call per factor, in order (the mean the
samples one by one would give); what still waits at close is written then."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from proxy.server import calibration
from proxy.server.calibration import CALIBRATION, CALIBRATION_SAMPLES, Calibration, store_name
from proxy.store import Store

MODEL, TENANT = "messages:claude-held", "tenant-held"


def _counting(store: Store, monkeypatch: pytest.MonkeyPatch) -> list[list[float]]:
    """The samples of each update_global_mean call the store is made."""
    calls: list[list[float]] = []
    update = store.update_global_mean

    async def counted(kind: str, name: str, sample: Any, **options: Any) -> tuple[float, int]:
        calls.append([sample] if isinstance(sample, float) else list(sample))
        return await update(kind, name, sample, **options)

    monkeypatch.setattr(store, "update_global_mean", counted)
    return calls


def _sequential(samples: list[float]) -> float:
    mean = 0.0
    for n, sample in enumerate(samples, 1):
        mean += (sample - mean) / min(n, CALIBRATION_SAMPLES)
    return mean


async def test_samples_within_the_interval_go_in_one_write(
    store: Store, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(calibration, "CALIBRATION_WRITE_EVERY", 0.3)
    calls = _counting(store, monkeypatch)
    cal = Calibration()
    name = store_name(MODEL, TENANT)
    cal.record(MODEL, 1.2, store, TENANT)
    for _ in range(50):  # the first is written at once
        if await store.get_global_mean(CALIBRATION, name) is not None:
            break
        await asyncio.sleep(0.01)
    assert calls == [[1.2]]
    held = [1.1, 1.4, 0.9]
    for ratio in held:
        cal.record(MODEL, ratio, store, TENANT)
    await asyncio.sleep(0.05)
    assert calls == [[1.2]]  # held while the interval runs
    found = await store.get_global_mean(CALIBRATION, name)
    assert found is not None and found[1] == 1
    await asyncio.sleep(0.4)
    assert calls == [[1.2], held]
    mean, samples = await store.get_global_mean(CALIBRATION, name) or (0.0, 0)
    assert samples == 4
    assert mean == pytest.approx(_sequential([1.2, *held]))
    assert cal.factor(MODEL, store, TENANT) == pytest.approx(mean)  # the replica's copy
    await asyncio.sleep(0.4)  # an interval with nothing held ends the writing
    cal.record(MODEL, 1.0, store, TENANT)
    await asyncio.sleep(0.05)
    assert calls == [[1.2], held, [1.0]]  # written at once again
    await cal.close()


async def test_what_is_held_at_close_is_written(
    store: Store, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(calibration, "CALIBRATION_WRITE_EVERY", 30.0)
    calls = _counting(store, monkeypatch)
    cal = Calibration()
    cal.record(MODEL, 1.2, store, TENANT)
    await asyncio.sleep(0.05)
    for ratio in (1.1, 1.3):
        cal.record(MODEL, ratio, store, TENANT)
    await asyncio.sleep(0.05)
    assert calls == [[1.2]]
    await cal.close()
    assert calls == [[1.2], [1.1, 1.3]]
    found = await store.get_global_mean(CALIBRATION, store_name(MODEL, TENANT))
    assert found is not None and found[1] == 3
    assert found[0] == pytest.approx(_sequential([1.2, 1.1, 1.3]))


async def test_samples_that_gathered_go_in_one_call_per_factor(
    store: Store, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(calibration, "CALIBRATION_WRITE_EVERY", 0.2)
    calls = _counting(store, monkeypatch)
    cal = Calibration()
    other = "messages:claude-other"
    cal.record(MODEL, 1.2, store, TENANT)
    await asyncio.sleep(0.05)
    cal.record(MODEL, 1.1, store, TENANT)
    cal.record(other, 0.8, store, TENANT)
    cal.record(MODEL, 1.3, store, TENANT)
    await asyncio.sleep(0.3)
    assert calls == [[1.2], [1.1, 1.3], [0.8]]
    found = await store.get_global_mean(CALIBRATION, store_name(other, TENANT))
    assert found == (pytest.approx(0.8), 1)
    await cal.close()
