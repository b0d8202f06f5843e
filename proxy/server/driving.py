"""Drive a generator of commands to its end with an async executor.

The core decides as generators that yield commands and are resumed with their replies
(the compaction driver, proxy/core/driver.py; an answer's read rounds, proxy/core/
rounds.py); an executor carries each command out (proxy/server/executor.py,
proxy/server/read_rounds.py). `drive` is the loop between them, the one for both.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Generator
from typing import Any, TypeVar

T = TypeVar("T")
C = TypeVar("C")  # a generator's commands
R = TypeVar("R")  # ... and their replies


async def drive(
    driver: Generator[C, R, T],
    execute: Callable[[C], Awaitable[R]],
    *,
    off_loop: bool = False,
) -> T:
    """Drive a generator to its end with an async executor. `off_loop`: run the
    driver's own (pure, CPU-bound) steps in a worker thread, so a huge history being
    planned does not stall every other request of the replica; its first step (up to
    the load: a root from the digests) runs inline, not worth a thread's hand-over."""
    reply: R | None = None
    while True:
        if off_loop and reply is not None:
            done, value = await asyncio.to_thread(_step, driver, reply)
        else:
            done, value = _step(driver, reply)
        if done:
            result: T = value
            return result
        reply = await execute(value)


def _step(driver: Generator[C, R, T], reply: R | None) -> tuple[bool, Any]:
    """(False, the next command) or (True, the result): StopIteration cannot cross a
    thread's future."""
    try:
        return False, driver.send(reply) if reply is not None else next(driver)
    except StopIteration as stop:
        return True, stop.value
