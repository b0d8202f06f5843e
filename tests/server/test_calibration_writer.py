"""Calibration's samples go to one writer per replica (proxy/server/calibration.py): a
request hands its sample over and is done; the writer writes them in turn, a sample that
finds the queue full is dropped, and a writer that failed is replaced by the next sample."""

from __future__ import annotations

import asyncio
import functools
from typing import Any, cast

from proxy.server import record as records
from proxy.server.calibration import CALIBRATION, Calibration, store_name
from proxy.server.record import RequestRecord
from proxy.server.tasks import FAILURES
from proxy.store import Store


class SlowStore:
    """A store's running mean, each write held until `go` is set; it notes the most
    writes in flight at once."""

    def __init__(self) -> None:
        self.go = asyncio.Event()
        self.written: list[tuple[str, str, float]] = []
        self.in_flight = 0
        self.most_in_flight = 0
        self.fail_next = False
        self.records: list[RequestRecord | None] = []  # the record current in each write

    async def update_global_mean(
        self, kind: str, name: str, sample: float | list[float], *, max_samples: int
    ) -> tuple[float, int]:
        samples = sample if isinstance(sample, list) else [sample]  # several: in one call
        self.in_flight += 1
        self.records.append(records.current())
        self.most_in_flight = max(self.most_in_flight, self.in_flight)
        try:
            await self.go.wait()
            if self.fail_next:
                self.fail_next = False
                raise RuntimeError("the write broke")
            self.written.extend((kind, name, one) for one in samples)
            return samples[-1], len(self.written)
        finally:
            self.in_flight -= 1


async def _until(done: Any) -> None:
    for _ in range(200):
        if done():
            return
        await asyncio.sleep(0.005)
    raise AssertionError("never happened")


async def test_samples_are_written_in_turn_by_one_writer() -> None:
    calibration, fake = Calibration(), SlowStore()
    store = cast(Store, fake)
    for ratio in (1.1, 1.2, 1.3):
        calibration.record("anthropic:m", ratio, store, "t1")  # returns at once
    await asyncio.sleep(0.01)
    assert fake.written == [] and fake.in_flight == 1  # the first one, held
    fake.go.set()
    await _until(lambda: len(fake.written) == 3)
    name = store_name("anthropic:m", "t1")
    assert fake.written == [(CALIBRATION, name, r) for r in (1.1, 1.2, 1.3)]
    assert fake.most_in_flight == 1
    assert calibration.factor("anthropic:m", None, "t1") == 1.3  # the mean the store gave
    await calibration.close()


async def test_a_sample_that_finds_the_queue_full_is_dropped() -> None:
    calibration, fake = Calibration(waiting=2), SlowStore()
    store = cast(Store, fake)
    for ratio in (1.1, 1.2, 1.3, 1.4):  # the writer has not taken any yet: two wait
        calibration.record("anthropic:m", ratio, store, "t1")
    fake.go.set()
    await _until(lambda: len(fake.written) == 2)
    await asyncio.sleep(0.02)
    assert [sample for _, _, sample in fake.written] == [1.1, 1.2]
    await calibration.close()


async def test_a_writer_that_failed_is_replaced_by_the_next_sample() -> None:
    calibration, fake = Calibration(), SlowStore()
    store = cast(Store, fake)
    fake.fail_next = True
    fake.go.set()
    failures = FAILURES["calibration"]
    calibration.record("anthropic:m", 1.1, store, "t1")
    await _until(lambda: FAILURES["calibration"] == failures + 1)
    calibration.record("anthropic:m", 1.2, store, "t1")
    await _until(lambda: len(fake.written) == 1)
    assert fake.written[0][2] == 1.2
    await calibration.close()


async def test_the_writer_runs_in_no_request_s_context() -> None:
    """The writer outlives the request that started it: it writes under none's record
    (nor its trace span, a context variable too)."""
    calibration, fake = Calibration(), SlowStore()
    fake.go.set()
    token = records.begin(RequestRecord("r1", "/v1/messages", "POST"))
    try:
        calibration.record("anthropic:m", 1.1, cast(Store, fake), "t1")
    finally:
        records.end(token)
    await _until(lambda: len(fake.written) == 1)
    assert fake.records == [None]
    await calibration.close()


def test_a_calibration_used_on_another_loop_writes_there() -> None:
    """A writer and its queue belong to the loop that started them: on another loop (the
    first one's writer gone with it), the next sample starts a writer there, which waits
    for the samples after it without fault."""
    calibration = Calibration()
    failures = FAILURES["calibration"]

    async def two(ratios: tuple[float, float]) -> list[float]:
        fake = SlowStore()
        fake.go.set()
        for written, ratio in enumerate(ratios, 1):
            calibration.record("anthropic:m", ratio, cast(Store, fake), "t1")
            await _until(functools.partial(lambda n: len(fake.written) == n, written))
            await asyncio.sleep(0.01)  # the writer waits for the next
        return [sample for _, _, sample in fake.written]

    assert asyncio.run(two((1.1, 1.2))) == [1.1, 1.2]
    assert asyncio.run(two((1.3, 1.4))) == [1.3, 1.4]
    assert FAILURES["calibration"] == failures
