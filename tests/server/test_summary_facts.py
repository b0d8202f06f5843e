"""Facts survive folding, by construction: a long session through several summaries keeps
the identifiers planted in its first turns, though its summariser drops a fifth of what it
sees; and no upstream request ever names a ref without offering the tool to read it."""

from __future__ import annotations

import re
import uuid
from typing import Any

import anthropic
import orjson

from proxy.testing.agent import run_agent, tool_output
from proxy.testing.standin import StandInOptions
from tests.plugins.standin import RunningStandIn
from tests.server.conftest import SMALL_WINDOW, MakeProxy

TURNS = 150
RESULT_CHARS = 3_000
PLANTED = [
    *(f"services/billing/ledger_{name}.py" for name in ("sync", "audit", "export")),
    *(f"ERR_LEDGER_{code}" for code in ("SKEW", "DRIFT", "GAP", "LOCK")),
    *(f"reconcile_{what}_entries" for what in ("ledger", "refund", "payout", "fee")),
    *(f"{name}Worker" for name in ("LedgerSync", "RefundQueue", "PayoutBatch")),
    *(f"https://ci.example.com/builds/{n}" for n in (8812, 9031)),
    *(f"E{n}" for n in (4521, 4533, 4590)),
    *(f"{m}_TIMEOUT_MS" for m in ("LEDGER", "REFUND", "PAYOUT")),
    *(f"migrate_{v}_schema" for v in ("v12", "v13", "v14")),
    *(f"{h}cafe42" for h in ("9a1b", "7c2d", "3e4f", "1a2b", "5d6e")),
]
PURPOSE = "x-compaction-proxy-purpose"
REF = re.compile(rb"r_[0-9a-f]{16}")


def planted_output(turn: int, chars: int) -> str:
    """A build log; the first 20 turns each also state one or two planted facts."""
    facts = PLANTED[turn * 3 // 2 : (turn + 1) * 3 // 2] if turn < 20 else []
    said = "".join(f"NOTE: the failure involves {fact}\n" for fact in facts)
    return said + tool_output(turn, chars - len(said))


def test_thirty_facts_are_planted_in_the_first_twenty_turns() -> None:
    assert len(PLANTED) == 30
    seen = "".join(planted_output(t, RESULT_CHARS) for t in range(20))
    assert all(fact in seen for fact in PLANTED)


async def test_a_long_session_keeps_its_early_facts_through_a_lossy_summariser(
    make_standin: Any, make_compacting_proxy: MakeProxy
) -> None:
    standin: RunningStandIn = await make_standin(
        StandInOptions(windows={"*": SMALL_WINDOW}, max_recorded=None, summary_loss=5)
    )
    proxy = await make_compacting_proxy(standin.url)
    client = anthropic.AsyncAnthropic(base_url=proxy.url, api_key="sk-facts", max_retries=0)
    turns = await run_agent(
        client,
        turns=TURNS,
        result_chars=RESULT_CHARS,
        conversation=uuid.uuid4().hex,
        output=planted_output,
    )
    await client.close()

    folded = ("made", "ahead", "waited")
    made = [t for t in turns if t.headers.get("x-compaction-summary") in folded]
    assert len(made) >= 3, "the session must fold several times"
    calls = [r for r in standin.recorded if r.path_qs.startswith("/v1/messages")]
    assert all(r.status == 200 for r in calls)
    summaries = [r for r in calls if r.headers.get(PURPOSE) == "summary"]
    # The summariser dropped some planted facts: the proxy had something to restore.
    dropped = {fact for r in summaries for fact in PLANTED if fact.encode() in r.body and
               fact not in " ".join(b.get("text", "") for b in r.content)}  # fmt: skip
    assert dropped, "the lossy summariser left nothing out: the test tests nothing"

    last = orjson.loads([r for r in calls if not r.headers.get(PURPOSE)][-1].body)
    text = orjson.dumps(last["messages"]).decode()
    kept = [fact for fact in PLANTED if fact in text]
    story = [
        "/".join(t.headers.get(f"x-compaction-{h}", "-") for h in ("strategy", "summary", "reason"))
        for t in turns
    ]
    assert len(kept) >= 29, f"lost {sorted(set(PLANTED) - set(kept))}; turns {story}"

    for r in calls:
        if r.headers.get(PURPOSE):
            continue
        body = orjson.loads(r.body)
        named = REF.findall(orjson.dumps(body["messages"]))
        offered = {t.get("name") for t in body.get("tools") or []}
        assert not named or "read_result" in offered, "a ref named with no tool to read it"
