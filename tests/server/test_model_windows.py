"""The proxy's window per request (issue 23, finding 3): the model table's, the 1M window
when the request's `anthropic-beta` asks for it, and one warning for a model the table
lacks."""

from __future__ import annotations

import logging

import pytest
from multidict import CIMultiDict

from proxy.server.compactor import Compactor
from proxy.server.envelope import betas_of


async def test_a_model_not_in_the_table_is_warned_of_once(
    caplog: pytest.LogCaptureFixture,
) -> None:
    compactor = Compactor()
    with caplog.at_level(logging.WARNING, logger="proxy.server.compactor"):
        for _ in range(3):
            assert compactor.policy("mystery-model-7").window == 128_000
        assert compactor.policy("claude-opus-5-5").window == 1_000_000
    warned = [r for r in caplog.records if "not in the model table" in r.getMessage()]
    assert len(warned) == 1 and "mystery-model-7" in warned[0].getMessage()
    await compactor.close()


async def test_the_beta_header_of_the_request_picks_the_1m_window() -> None:
    compactor = Compactor()
    headers = CIMultiDict(
        [("Anthropic-Beta", "oauth-2025-04-20"), ("anthropic-beta", "context-1m-2025-08-07")]
    )
    betas = betas_of(headers)
    assert compactor.policy("claude-sonnet-4-5", None, betas).window == 1_000_000
    assert compactor.policy("claude-sonnet-4-5").window == 200_000  # memoised apart
    assert compactor.policy("claude-sonnet-4-5", {"trigger": 90_000}, betas).window == 1_000_000
    await compactor.close()
