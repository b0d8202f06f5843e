"""Stopping background tasks within a deadline, whatever they do with a cancellation.

A task cancelled inside a Redis call can have its cancellation turned into a timeout by
the client library (the cancel and the call's own timeout racing); a loop that retries on
timeouts (the admin stats' flush, the revocation watch) then goes on as if nothing
happened, and whoever awaits it at shutdown waits for ever. That is what held a test
fixture's finalizer past 120 s (issue 21, finding 9). So shutdown never awaits a task
unbounded: `stop_tasks` cancels, and cancels again every STOP_RETRY seconds until each
task is done or the deadline passes; one still alive then is logged by name and left.
"""

from __future__ import annotations

import asyncio
import logging
from collections import Counter
from collections.abc import Coroutine, Iterable
from typing import Any

log = logging.getLogger(__name__)

# Background tasks that ended with an error, by what they were (a fixed word:
# "compaction", "calibration", "settlement"); exported as
# compaction_proxy_background_task_failures_total{task}.
FAILURES: Counter[str] = Counter()

STOP_DEADLINE = 5.0  # seconds a shutdown waits for background tasks to end
STOP_RETRY = 0.1


async def stop_tasks(
    tasks: Iterable[asyncio.Task[Any]],
    *,
    deadline: float = STOP_DEADLINE,
    what: str = "background task",
) -> bool:
    """Cancel `tasks` and wait for them, at most `deadline` seconds; True when all
    ended. Never raises for the tasks' own errors or cancellations."""
    pending = {task for task in tasks if not task.done()}
    loop = asyncio.get_running_loop()
    end = loop.time() + deadline
    while pending:
        for task in pending:
            task.cancel()
        left = end - loop.time()
        if left <= 0:
            names = ", ".join(sorted(task.get_name() for task in pending))
            log.warning(
                "%d %s(s) still running at shutdown, left behind: %s", len(pending), what, names
            )
            return False
        _, pending = await asyncio.wait(pending, timeout=min(STOP_RETRY, left))
    return True


def is_cancelling() -> bool:
    """Whether the current task has been asked to stop (a loop that catches timeouts
    checks this, so a cancellation turned into a timeout still ends it)."""
    task = asyncio.current_task()
    return task is not None and task.cancelling() > 0


def spawn_watched(
    tasks: set[asyncio.Task[None]],
    work: Coroutine[Any, Any, None],
    what: str,
    **create: Any,
) -> asyncio.Task[None]:
    """Start `work` as a task kept in `tasks` until it ends; an error it ends with is
    retrieved (never "Task exception was never retrieved"), logged once with its
    traceback and counted in FAILURES[what]. `create`: create_task's own arguments."""
    task = asyncio.get_running_loop().create_task(work, **create)
    tasks.add(task)

    def ended(done: asyncio.Task[None]) -> None:
        tasks.discard(done)
        if done.cancelled():
            return
        error = done.exception()
        if error is not None:
            FAILURES[what] += 1
            log.error("background %s task failed: %s", what, type(error).__name__, exc_info=error)

    task.add_done_callback(ended)
    return task
