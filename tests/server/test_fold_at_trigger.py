"""The fold lands at the trigger (issue 23, finding 2).

A chat-heavy conversation (long reasoning text each turn, short tool results: nothing to
offload, only folds help) against a summariser slower than the agent: the summary made
ahead is not ready when the history crosses the trigger. The request may go on unfolded
for a bounded stretch past the trigger (counted in a metric), then waits for the summary;
so no request is larger than the trigger plus 10% of the window, at the first fold or at
the later ones (a fold that lands above the target does not move the next trigger).
"""

from __future__ import annotations

import dataclasses
import random
import uuid
from typing import Any

import anthropic
import orjson

from proxy.core.tokens import default_counter
from proxy.server.app import start
from proxy.server.metrics import METRICS
from proxy.server.state import COMPACTOR
from proxy.testing.agent import run_agent
from proxy.testing.standin import StandInOptions
from proxy.wire import ANTHROPIC
from tests.plugins.standin import RunningStandIn
from tests.server.conftest import proxy_settings

PURPOSE = "x-compaction-proxy-purpose"
WINDOW = 30_000
CHAT_POLICY: dict[str, Any] = {
    "match": "*",
    "window": WINDOW,
    "trigger": 12_000,
    "target": 8_000,
    "keep_last": 2,
    "offload_threshold": 100_000,  # results stay verbatim: a chat-heavy session
    "summary_max_tokens": 1_200,
}
WORDS = [
    "the",
    "build",
    "fails",
    "because",
    "config",
    "loader",
    "reads",
    "stale",
    "cache",
    "entry",
    "after",
    "retry",
]


def prose(turn: int) -> str:
    """About 300 tokens of the model's reasoning, naming files and error codes."""
    rng = random.Random(turn)
    words = [f"Turn {turn}:"]
    for _ in range(220):
        pick = rng.random()
        if pick < 0.06:
            words.append(f"src/mod_{rng.randint(0, 99)}.py:{rng.randint(1, 900)}")
        elif pick < 0.09:
            words.append(f"E{rng.randint(1000, 9999)}")
        else:
            words.append(rng.choice(WORDS))
    return " ".join(words) + "."


async def test_the_fold_lands_at_the_trigger_when_the_summariser_is_slow(
    make_standin: Any, redis_url: str, redis_key_prefix: str
) -> None:
    standin: RunningStandIn = await make_standin(
        StandInOptions(windows={"*": WINDOW}, max_recorded=None, summary_delay=1.5)
    )
    settings = proxy_settings(standin.url, redis_url, **{"store.key_prefix": redis_key_prefix})
    proxy = await start(dataclasses.replace(settings, policies=(CHAT_POLICY,)))
    client = anthropic.AsyncAnthropic(base_url=proxy.url, api_key="sk-chat", max_retries=0)
    try:
        turns = await run_agent(
            client, turns=90, result_chars=300, text=prose, conversation=uuid.uuid4().hex
        )
        await proxy.app[COMPACTOR].settled()
        deferred = proxy.app[METRICS].folds_deferred._value.get()
    finally:
        await client.close()
        await proxy.stop()

    counter = default_counter()
    agent = [orjson.loads(r.body) for r in standin.recorded if not r.headers.get(PURPOSE)]
    assert len(agent) == 90
    history = [counter.count_request(b) - ANTHROPIC.fixed_tokens(counter, b) for b in agent]
    folds = [t for t in turns if t.headers.get("x-compaction-strategy") == "summary"]
    assert len(folds) >= 2, "the conversation folded more than once"
    # The summariser was slower than the agent: folds went on unfolded past the trigger...
    pending = [t for t in turns if t.headers.get("x-compaction-reason") == "summary_pending"]
    assert pending and deferred == len(pending)
    # ...for a bounded stretch: no request much past the trigger, at any fold.
    bound = CHAT_POLICY["trigger"] + WINDOW // 10
    assert max(history) <= bound, (max(history), bound)
