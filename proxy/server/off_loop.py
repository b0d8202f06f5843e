"""Pure work over a big body, off the event loop.

Decoding a body, checking its fields, counting it, planning its compaction: on a body of
megabytes each takes tens of ms or more, during which the replica's other requests would
wait. Past `server.off_loop_bytes` (the one threshold, for every step that does such
work) it runs in a worker thread; below it, here, where the hand-over would cost more
than the work.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any, TypeVar

T = TypeVar("T")


async def off_loop(size: int, threshold: int, work: Callable[..., T], *args: Any) -> T:
    """`work(*args)` over a body of `size` bytes: in a worker thread past `threshold`."""
    if size > threshold:
        return await asyncio.to_thread(work, *args)
    return work(*args)
