"""What compaction did, in the public words: the record holds a typed strategy (or a
refusal), and the log line's fields and the metric labels say the same words as before
(`x-compaction-strategy`'s, "refuse", "none")."""

from __future__ import annotations

import time

import orjson
import pytest
from prometheus_client import generate_latest

from proxy.core.strategy import Strategy
from proxy.server.metrics import Metrics
from proxy.server.record import RequestRecord


def record(**fields: object) -> RequestRecord:
    rec = RequestRecord("req", "/v1/messages", "POST")
    for name, value in fields.items():
        setattr(rec, name, value)
    return rec


@pytest.mark.parametrize("strategy", list(Strategy))
def test_a_rewrite_is_logged_and_counted_under_its_word(strategy: Strategy) -> None:
    rec = record(strategy=strategy, tokens_before=9_000, tokens_after=4_000)
    fields = rec.compaction_fields()
    assert orjson.dumps(fields["strategy"]) == orjson.dumps(strategy.value)
    assert type(fields["strategy"]) is str and fields["tokens_after"] == 4_000
    assert rec.strategy_word == strategy.value
    metrics = Metrics()
    metrics.record(rec, 200, time.perf_counter())
    text = generate_latest(metrics.registry).decode()
    assert f'rewrites_total{{strategy="{strategy.value}"}} 1.0' in text
    crossing = f'compactions_total{{strategy="{strategy.value}"}} 1.0' in text
    assert crossing == (strategy is not Strategy.CHECKPOINT)


def test_a_refusal_is_logged_as_refuse_and_counted_apart() -> None:
    rec = record(refused=True, reason="too_long")
    assert rec.compaction_fields() == {"strategy": "refuse", "reason": "too_long"}
    assert rec.strategy_word == "refuse"
    metrics = Metrics()
    metrics.record(rec, 400, time.perf_counter())
    text = generate_latest(metrics.registry).decode()
    assert "refusals_total 1.0" in text and "rewrites_total{" not in text


def test_an_untouched_request_is_logged_as_none() -> None:
    rec = record()
    assert rec.compaction_fields() == {"strategy": "none"} and rec.strategy_word == ""
