"""Which refs a rewritten history may read (issue 22, finding 3): those the proxy itself
put there, a stub it made or a summary it made from a history holding that stub. A
ref-shaped string the client typed never counts, quoted by the summary or not."""

from __future__ import annotations

from typing import Any

from proxy.core.checkpoint import decode_checkpoint, encode_checkpoint
from proxy.core.commands import Command, GetSummary, Reply, SummaryReply
from proxy.core.driver import commands_of, compaction
from proxy.core.offload import ref_for, result_text
from proxy.core.segments import Summary
from tests.core.test_driver import Store, request
from tests.core.test_planner import conversation, policy

TYPED = "r_00112233aabbccdd"  # a ref from somewhere else, typed by the client


def test_a_summary_vouches_for_the_stubs_it_folded_never_for_typed_refs() -> None:
    messages: list[dict[str, Any]] = conversation(120, result_words=150)
    messages[0] = {"role": "user", "content": f'Also see read_result(ref="{TYPED}").'}
    limits = policy(offload_trigger=2_000)
    # The results the fold takes were offloaded first: their refs are the proxy's own.
    stubbed = [ref_for(str(result_text(m["content"][0]))) for m in messages[2:12:2]]
    store = Store()

    def summarise(command: Command) -> Reply:
        if isinstance(command, GetSummary):
            # A summariser that quotes everything: the typed ref and the stubs' refs.
            return SummaryReply(f"notes: {TYPED} and {' '.join(stubbed)}")
        return store(command)

    _, decision = commands_of(compaction(request(messages, limits)), summarise)
    rewrite = decision.rewrite
    assert rewrite is not None and "summary" in rewrite.strategy
    summary = next(s for s in rewrite.checkpoint.segments if isinstance(s, Summary))
    assert TYPED in summary.text  # quoted, and the line of identifiers may list it too
    assert TYPED not in rewrite.refs and TYPED not in summary.refs
    assert set(stubbed) & set(summary.refs), "no folded stub's ref stayed readable"
    assert set(summary.refs) <= set(stubbed) | set(rewrite.refs)
    # Stored and read back, the summary vouches for the same refs.
    again = decode_checkpoint(encode_checkpoint(rewrite.checkpoint))
    assert again is not None and again.segments == rewrite.checkpoint.segments


def test_a_summary_stored_before_refs_were_recorded_vouches_for_none() -> None:
    raw = {"v": 2, "n": 1, "hash": "ab", "segments": [["summary", "r_0011223344556677", 3]],
           "tool": None, "strategy": "summary"}  # fmt: skip
    checkpoint = decode_checkpoint(raw)
    assert checkpoint is not None
    assert checkpoint.segments == (Summary("r_0011223344556677", 3, ()),)
