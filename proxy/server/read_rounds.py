"""Answer the injected read_result tool inside the proxy, invisibly to the client.

When a rewritten request carried `read_result`, its answer is made of rounds: what
happens round after round is decided by the read rounds' generator (proxy/core/rounds.py:
read the slices, fit the round to the window, top up the budget, send it, up to the
policy's number of rounds), which the exchange drives (proxy/server/exchange.py) with
this `RoundExecutor`: each round sent through the exchange's transport (`Merging.round`:
HTTP whole or a stream, or a WebSocket, proxy/server/transport.py), results read from
the store, rounds held in the caller's budgets. The client gets one message (the
format's merger decides what it sees of each round); a call mixed with client tool
calls is removed from what the client sees, so nothing is left unanswered in its
history. When the rounds stop while the model still wanted to read (the round limit,
the window, a budget), the message ends with the generator's note saying why, so the
client always gets a valid, non-empty answer.
"""

from __future__ import annotations

import time
from collections.abc import Awaitable, Callable
from typing import assert_never

from proxy.core.commands import (
    Answered,
    Failed,
    ReadResults,
    Results,
    RoundCommand,
    RoundReply,
    SendRound,
    ToppedUp,
    TopUp,
)
from proxy.server.record import RequestRecord
from proxy.store import Store, StoreUnavailable

Send = Callable[[bytes], Awaitable[Answered | Failed]]  # a transport's `Merging.round`
TopUpCall = Callable[[int, int | None], Awaitable[bool]]  # `Budget.top_up`


class RoundExecutor:
    """The commands of one answer's read rounds. `send` is the transport's part: send a
    round and pass on what the client may see of its answer; `top_up` holds a round in
    the caller's budgets. `sending`: the seconds spent in `send` (the rest of the rounds'
    time is the proxy's own)."""

    def __init__(
        self,
        store: Store | None,
        tenant: str,
        conversation: str,
        *,
        send: Send,
        top_up: TopUpCall,
        record: RequestRecord | None = None,
    ) -> None:
        self.store = store
        self.tenant = tenant
        self.conversation = conversation
        self.send = send
        self.top_up = top_up
        self.record = record
        self.sending = 0.0

    async def __call__(self, command: RoundCommand) -> RoundReply:
        record = self.record
        match command:
            case SendRound():
                # What every transport's rounds record: the read rounds sent after the
                # request itself, and each answer's usage.
                if record is not None:
                    record.read_rounds = command.number - 1
                began = time.perf_counter()
                try:
                    answered = await self.send(command.body)
                finally:
                    self.sending += time.perf_counter() - began
                if record is not None and isinstance(answered, Answered):
                    record.meter.round(answered.round.usage)
                return answered
            case ReadResults():
                # One read a ref, in order; a store that fails one is unavailable for it.
                texts: list[str | None] = []
                unavailable: list[bool] = []
                for ref in command.refs:
                    text, down = None, self.store is None
                    if self.store is not None:
                        try:
                            text = await self.store.read_blob(self.tenant, self.conversation, ref)
                        except StoreUnavailable:
                            down = True
                    texts.append(text)
                    unavailable.append(down)
                return Results(tuple(texts), tuple(unavailable))
            case TopUp():
                return ToppedUp(await self.top_up(command.tokens, command.output))
            case _:
                assert_never(command)
