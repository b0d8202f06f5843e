"""A store call's deadline, counted in the store's time, not the event loop's.

`op_timeout` bounds how long Redis takes to answer. A timer alone measures something
else: when the proxy's event loop is busy past the deadline (a large body parsed, a
burst of other requests' work), Redis's answer may be waiting in the socket, read in the
same loop pass whose expired timer cancels the call, so the call fails though Redis
answered in a millisecond. The compaction executor then plans the turn without the
conversation's state (a pack of the history as sent: its summary gone for that turn),
or a crossing packs for want of a summary it could have read.

So the deadline, when the loop comes to it, gives the call one more look (GRACE of its
time, so an answer read in that pass is taken, and the time the loop came to it late), then
again the time the loop came late to each later deadline, until MOST times the call's
own time. A Redis that does not answer fails the call after `seconds` and GRACE of it,
on an idle loop.
"""

from __future__ import annotations

import asyncio
from types import TracebackType

GRACE = 0.1  # of the call's time: the one more look every call gets at its deadline
MOST = 4.0  # times the call's time: the longest a late loop may make it take


def moved(seconds: float, started: float, due: float, now: float, first: bool) -> float | None:
    """The call's next deadline when its deadline `due` is handled at `now` (loop clock;
    `started`: when the call began), or None: it has had its time. The first deadline
    always gives one more look; a later one only when the loop came to it late (by more
    than the grace), and none past MOST times the call's time."""
    grace = seconds * GRACE
    late = now - due
    if first:
        return now + max(late, grace)
    if late <= grace or now >= started + seconds * MOST:
        return None  # the loop came on time, or the call has taken all it may
    return now + late


class Deadline:
    """`async with Deadline(seconds):` raises TimeoutError when the block has had its
    time by `moved` (asyncio.timeout's cancellation, with the deadline kept here)."""

    __slots__ = ("_due", "_first", "_handle", "_loop", "_seconds", "_started", "_timeout")

    def __init__(self, seconds: float) -> None:
        self._seconds = seconds
        self._timeout = asyncio.timeout(None)

    async def __aenter__(self) -> None:
        self._loop = loop = asyncio.get_running_loop()
        await self._timeout.__aenter__()
        self._started = loop.time()
        self._due = self._started + self._seconds
        self._first = True
        self._handle = loop.call_at(self._due, self._expired)

    async def __aexit__(
        self,
        kind: type[BaseException] | None,
        error: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        self._handle.cancel()
        await self._timeout.__aexit__(kind, error, traceback)

    def _expired(self) -> None:
        now = self._loop.time()
        then = moved(self._seconds, self._started, self._due, now, self._first)
        self._first = False
        if then is None:
            self._timeout.reschedule(now)  # cancels the block: TimeoutError on its way out
            return
        self._due = then
        self._handle = self._loop.call_at(then, self._expired)
