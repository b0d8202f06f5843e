"""One calibration lookup per request: the factor found when the request is prepared is
carried to its budget reservation and to every read_result round (issue 25, finding 5).

A request with budgets whose answer takes one read_result round: the anthropic SDK ->
the proxy (proxy keys) -> the stand-in, scripted to read the first stub it sees.
"""

from __future__ import annotations

from typing import Any

import pytest

from proxy.server.app import RunningProxy
from proxy.server.calibration import Calibration
from proxy.store.accounts import Accounts
from tests.plugins.standin import RunningStandIn
from tests.server.test_budget_read_rounds import MAX_TOKENS, ask, keyed_compacting, turns
from tests.server.test_keys_and_budgets import new_key

__all__ = ["keyed_compacting"]  # the fixture, shared


@pytest.mark.parametrize("stream", [False, True], ids=["whole", "stream"])
async def test_a_request_with_a_read_round_looks_its_factor_up_once(
    keyed_compacting: tuple[RunningProxy, Accounts],
    standin: RunningStandIn,
    monkeypatch: pytest.MonkeyPatch,
    stream: bool,
) -> None:
    proxy, accounts = keyed_compacting
    text, _ = await new_key(accounts, **{"day:output": MAX_TOKENS * 5 // 2})
    lookups: list[tuple[str, str]] = []
    factor = Calibration.factor

    def counted(self: Calibration, model: str, store: Any, tenant: str = "") -> float:
        lookups.append((model, tenant))
        return factor(self, model, store, tenant)

    monkeypatch.setattr(Calibration, "factor", counted)
    await ask(proxy, text, stream)

    assert len(turns(standin)) == 2  # the first call and one read round
    assert len(lookups) == 1, lookups
