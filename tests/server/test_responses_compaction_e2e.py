"""Compaction of Responses traffic end to end: the openai SDK -> the proxy -> the stand-in.

A Codex-shaped agent (proxy/testing/agent_responses.py) runs 40 tool turns with large
outputs against a 30k window: every upstream request must pass the stand-in's strict
Responses validation (a call and its output together, reasoning items unchanged, tools
named) and fit the window, read_result rounds must be invisible to the SDK (one
response.created, one response.completed, sequence numbers and output indices counting
on), and what the client is told about usage must stay within the window.
"""

from __future__ import annotations

from typing import Any

import openai
import orjson
import pytest

from proxy.core.tokens import default_counter
from proxy.server.app import RunningProxy
from proxy.testing.agent_responses import ResponsesTurn, run_responses_agent
from proxy.testing.api_responses import ResponsesOptions
from proxy.testing.responses_items import ItemCounter
from proxy.testing.standin import RecordedRequest, StandInOptions
from proxy.wire.responses_units import input_items
from proxy.wire.responses_validation import validate_responses_request
from tests.plugins.responses import MakeResponsesStandIn
from tests.server.conftest import SMALL_WINDOW, MakeProxy

TURNS = 40
RESULT_CHARS = 8_000
PATH = "/v1/responses"
PURPOSE = "x-compaction-proxy-purpose"
KEY = ResponsesOptions().seal_key


async def responses_proxy(
    make_compacting_proxy: MakeProxy, upstream_url: str, **settings: Any
) -> RunningProxy:
    return await make_compacting_proxy(
        "http://127.0.0.1:9", **{"upstream.openai_url": upstream_url, **settings}
    )


def client_for(proxy: RunningProxy) -> openai.AsyncOpenAI:
    return openai.AsyncOpenAI(base_url=proxy.url + "/v1", api_key="sk-test-e2e", max_retries=0)


def upstream_bodies(recorded: list[RecordedRequest]) -> list[dict[str, Any]]:
    return [orjson.loads(r.body) for r in recorded if r.path_qs == PATH]


def names(body: dict[str, Any]) -> list[str]:
    return [str(i.get("name")) for i in input_items(body) if i.get("type") == "function_call"]


def check_stream(turn: ResponsesTurn) -> None:
    kinds = [e.type for e in turn.events]
    assert kinds.count("response.created") == 1 and kinds[0] == "response.created"
    assert kinds.count("response.completed") == 1 and kinds[-1] == "response.completed"
    assert [e.sequence_number for e in turn.events] == list(range(len(kinds)))
    added = [e for e in turn.events if e.type == "response.output_item.added"]
    assert [e.output_index for e in added] == list(range(len(added)))
    done = [e.item for e in turn.events if e.type == "response.output_item.done"]
    assert [i.model_dump() for i in done] == [i.model_dump() for i in turn.response.output]


@pytest.mark.parametrize("stream", [False, True], ids=["whole", "stream"])
async def test_a_long_responses_conversation_stays_valid_and_fits(
    make_responses_standin: MakeResponsesStandIn,
    make_compacting_proxy: MakeProxy,
    stream: bool,
) -> None:
    standin = await make_responses_standin(
        StandInOptions(windows={"*": SMALL_WINDOW}, max_recorded=None), ResponsesOptions()
    )
    proxy = await responses_proxy(make_compacting_proxy, standin.url)
    seen: list[str] = []

    async def on_turn(t: int, turn: ResponsesTurn) -> None:
        response = turn.response
        assert response.status == "completed", t
        assert all(getattr(item, "name", None) != "read_result" for item in response.output), t
        assert response.usage.input_tokens <= SMALL_WINDOW
        if stream:
            check_stream(turn)
        seen.append(turn.headers.get("x-compaction-strategy", ""))

    async with client_for(proxy) as client:
        turns = await run_responses_agent(
            client,
            turns=TURNS,
            result_chars=RESULT_CHARS,
            stream=stream,
            read_every=3,
            on_turn=on_turn,
        )
    assert len(turns) == TURNS
    bodies = upstream_bodies(standin.recorded)
    counter = ItemCounter(default_counter(), KEY)
    for body in bodies:
        assert validate_responses_request(body, openai=False) is None
        assert counter.count_request(body) <= SMALL_WINDOW
    assert all(r.outcome == "complete" for r in standin.recorded)
    # The proxy compacted, offloaded, and answered read_result itself.
    assert any(s.startswith("offload") for s in seen), seen
    assert any(s.endswith("summary") for s in seen), seen
    reads = [b for b in bodies if "read_result" in names(b)]
    assert reads, "the stand-in never called read_result"
    summaries = [r for r in standin.recorded if r.headers.get(PURPOSE) == "summary"]
    assert len(summaries) <= 6
