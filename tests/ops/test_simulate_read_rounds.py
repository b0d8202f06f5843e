"""The simulator replays read_result rounds with the server's own generator
(proxy/core/rounds.py): for one request, what the model receives round by round through
the proxy (the stand-in's recorded bodies) is what the simulator sends its model, and the
client's one message says the same.

The model on both sides is the stand-in's script (proxy/testing/script.py): through the
server it answers over HTTP, in the simulator it is called with each round's body.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import aiohttp
import orjson
import pytest

from proxy.core.policy import DEFAULT_POLICIES, parse_policies
from proxy.core.tokens import default_counter
from proxy.ops.simulate import Simulator
from proxy.server.app import start
from proxy.testing.api_messages import message, read
from proxy.testing.reply import Usage
from proxy.testing.script import decide, parse_script
from proxy.testing.standin import StandInOptions
from proxy.testing.standin_http import request_digest
from tests.plugins.standin import RunningStandIn
from tests.server import test_budget_read_rounds as budget_rounds
from tests.server import test_read_rounds as fit_rounds
from tests.server.conftest import proxy_settings
from tests.server.test_budget_read_rounds import tool_history

PURPOSE = "x-compaction-proxy-purpose"  # marks the summariser's calls
# (policy, the stand-in's script, the history): one read; and reads past the round limit,
# each slice too long for the window, shortened every round.
ONE_READ = (budget_rounds.POLICY, budget_rounds.READ_SCRIPT["x-stand-in"], tool_history(12))
PAST_THE_LIMIT = (fit_rounds.POLICY, fit_rounds.READ_EVERYTHING, fit_rounds.anthropic_history())


def scripted_model(header: str) -> Any:
    """The stand-in's answer to a body, as a whole message (its usage left out)."""
    script = parse_script(StandInOptions().script, header)
    counter = default_counter()

    def answer(body: dict[str, Any]) -> dict[str, Any]:
        digest = request_digest(body, ("stream",))
        planned = decide(read(body), script, counter, digest)
        return {
            **message(body["model"], planned, Usage(1)),
            "usage": {"input_tokens": 1, "output_tokens": planned.output_tokens},
        }

    return answer


@pytest.mark.parametrize("stream", [False, True], ids=["whole", "stream"])
@pytest.mark.parametrize("case", [ONE_READ, PAST_THE_LIMIT], ids=["one", "limit"])
async def test_the_simulator_sends_the_model_what_the_server_sends(
    standin: RunningStandIn, redis_url: str, redis_key_prefix: str, case: Any, stream: bool
) -> None:
    policy, header, history = case
    body = {"model": "claude-sim-1", "max_tokens": 1_000, "messages": history, "stream": stream}
    settings = proxy_settings(standin.url, redis_url, **{"store.key_prefix": redis_key_prefix})
    proxy = await start(dataclasses.replace(settings, policies=(policy,)))
    headers = {"x-api-key": "sk-simulated", "anthropic-version": "2023-06-01", "x-stand-in": header}
    try:
        async with aiohttp.ClientSession() as http:
            url = f"{proxy.url}/v1/messages"
            async with http.post(url, data=orjson.dumps(body), headers=headers) as response:
                assert response.status == 200, await response.text()
                served = await response.read()
                read_rounds = response.headers.get("x-compaction-read-rounds")
    finally:
        await proxy.stop()
    received = [
        orjson.loads(r.body)
        for r in standin.recorded
        if r.path_qs.startswith("/v1/messages") and not r.headers.get(PURPOSE)
    ]

    simulator = Simulator([*parse_policies([policy]), *DEFAULT_POLICIES], default_counter())
    step = simulator.step(body)
    assert step.tool is not None  # the step offered read_result
    replay = simulator.read_rounds(step, scripted_model(header))

    assert len(received) >= 2  # the model read
    assert replay.sent == received
    assert replay.rounds == len(received) - 1
    if not stream:  # (a stream's message is its events: the wire tests merge those)
        message = orjson.loads(served)
        assert int(read_rounds or -1) == replay.rounds
        assert replay.answer["content"] == message["content"]
        assert replay.answer["stop_reason"] == message["stop_reason"]
    last = replay.answer["content"][-1]
    assert orjson.dumps(last["text"])[1:-1] in served  # the text, or the stop note, it ends with
    if policy.get("max_read_rounds"):
        assert replay.outcome == "limit"
        assert any(b"Shortened to fit the context window" in orjson.dumps(r) for r in received)
    else:
        assert replay.outcome == "complete"
