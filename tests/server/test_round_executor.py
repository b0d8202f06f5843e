"""The server's RoundExecutor (proxy/server/read_rounds.py): a store it cannot read is a
reply saying so, and a command it does not know is refused (`assert_never`), never
carried out as another."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from proxy.core.commands import ReadResults, Results
from proxy.core.driver import commands_of
from proxy.core.rounds import UNAVAILABLE, read_rounds
from proxy.server.read_rounds import RoundExecutor
from tests.core.test_rounds import DONE, REF, TEXT, Script, reading, request


def test_the_executor_reads_unavailable_without_a_store_and_refuses_unknown_commands() -> None:
    async def never(command: Any) -> Any:
        raise AssertionError("not called")

    executor = RoundExecutor(None, "t", "c", send=never, top_up=never)
    down = asyncio.run(executor(ReadResults((REF,))))
    assert down == Results((None,), (True,))
    with pytest.raises(AssertionError):  # assert_never: nothing falls through
        asyncio.run(executor(object()))  # type: ignore[arg-type]

    script = Script([reading(), DONE], {REF: TEXT})
    _, ended = commands_of(
        read_rounds(request()), lambda c: down if isinstance(c, ReadResults) else script(c)
    )
    result = script.sent[1]["messages"][-1]["content"][0]
    assert result["content"] == UNAVAILABLE and result["is_error"] is True
    assert ended.outcome == "complete"
