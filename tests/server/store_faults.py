"""A store fault the facts tests share: one turn's load of the conversation's state fails
as a timeout would (the event loop busy past op_timeout), the store answering again for
that turn's writes and every later call."""

from __future__ import annotations

from typing import Any

import pytest

from proxy.store import Store, StoreUnavailable
from proxy.testing.agent import Turn


class FailingLoad:
    """Store.load_conversation fails once: for the turn after turn `after` (an agent's
    `on_turn` hook arms it). `failed` says whether it did."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch, after: int) -> None:
        self.after, self.armed, self.failed = after, False, False
        load = Store.load_conversation

        async def failing(store: Store, *args: Any, **kwargs: Any) -> Any:
            if self.armed:
                self.armed, self.failed = False, True
                raise StoreUnavailable("redis: TimeoutError: ")
            return await load(store, *args, **kwargs)

        monkeypatch.setattr(Store, "load_conversation", failing)

    async def on_turn(self, t: int, turn: Turn) -> None:
        self.armed = t == self.after
