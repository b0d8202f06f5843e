"""The compaction driver, Playbook-style: the commands one request yields, in order, and
what it decides for each reply."""

from __future__ import annotations

import copy
import dataclasses
from typing import Any

import pytest

from proxy.core.checkpoint import Checkpoint, root_of
from proxy.core.commands import (
    Command,
    GetSummary,
    LoadConversation,
    Loaded,
    PreparedSummary,
    PrepareSummary,
    Reply,
    SaveCrossing,
    Saved,
    Started,
    SummaryReply,
    TouchLine,
)
from proxy.core.counting import count_request
from proxy.core.driver import (
    CompactionRequest,
    Decision,
    commands_of,
    compaction,
)
from proxy.core.exact_json import ClientJSON
from proxy.core.lines import renewal
from proxy.core.outcome import Refuse, Rewrite, Untouched
from proxy.core.policy import Policy
from proxy.core.segments import StubbedMemo, refs_of
from proxy.core.tokens import TokenCounter
from proxy.wire import ANTHROPIC
from proxy.wire.chat import CHAT
from tests.core.test_planner import conversation, policy

COUNTER = TokenCounter()
NO_OFFLOAD = policy(offload_threshold=100_000)


def request(messages: list[dict[str, Any]], limits: Policy | None = None) -> CompactionRequest:
    body = {"model": "claude-test", "max_tokens": 100, "messages": messages}
    counted = count_request(ANTHROPIC, COUNTER, body, messages)
    return CompactionRequest(
        ANTHROPIC,
        body,
        messages,
        counted,
        ANTHROPIC.counter(COUNTER),
        limits or policy(),
        1.0,
        ClientJSON.written(body),
    )


class Store:
    """A conversation's state as the driver sees it through its replies."""

    def __init__(self, *, down: bool = False, saves: bool = True, summary: str | None = "notes"):
        self.checkpoints: dict[str, Checkpoint] = {}
        self.prepared: dict[str, PreparedSummary] = {}  # root -> made ahead (text: ready)
        self.down = down
        self.saves = saves
        self.summary = summary
        self.unread = False  # GetSummary: the store could not be read for the summary

    def __call__(self, command: Command) -> Reply:
        if isinstance(command, LoadConversation):
            if self.down:
                return Loaded(None, store_ok=False)
            root = command.root
            return Loaded(self.checkpoints.get(root), prepared=self.prepared.get(root))
        if isinstance(command, PrepareSummary):
            assert command.note is not None and command.note.key == command.ask.key
            self.prepared[command.root] = command.note  # in the making
            return Started()
        if isinstance(command, TouchLine):
            return Started()
        if isinstance(command, GetSummary):
            failure = "" if self.summary else "it failed"
            return SummaryReply(self.summary, failure=failure, unread=self.unread)
        assert isinstance(command, SaveCrossing)
        if self.saves:
            self.checkpoints[command.root] = command.checkpoint
        return Saved(ok=self.saves)


def kinds(commands: list[Command]) -> list[str]:
    return [type(c).__name__ for c in commands]


def test_a_request_under_the_trigger_yields_nothing() -> None:
    commands, decision = commands_of(compaction(request(conversation(3))), Store())
    assert commands == []
    assert isinstance(decision.outcome, Untouched) and decision.rewrite is None


def test_an_offload_crossing_loads_then_saves_once() -> None:
    messages = conversation(12)
    store = Store()
    commands, decision = commands_of(compaction(request(messages, policy(target=5_000))), store)
    assert kinds(commands) == ["LoadConversation", "SaveCrossing"]
    load, save = commands
    assert isinstance(load, LoadConversation) and isinstance(save, SaveCrossing)
    assert load.root == save.root
    assert len(save.blobs) == 11 and save.touch == ()
    assert isinstance(decision.outcome, Rewrite) and decision.rewrite is not None
    assert decision.rewrite.strategy == "offload"
    assert decision.body is not None and b'"read_result"' in decision.body


def test_a_request_reusing_the_checkpoint_only_loads() -> None:
    messages = conversation(12)
    store = Store()
    commands_of(compaction(request(messages, policy(target=5_000))), store)
    grown = [*messages, {"role": "assistant", "content": "Done reading."}]
    commands, decision = commands_of(compaction(request(grown, policy(target=5_000))), store)
    assert kinds(commands) == ["LoadConversation"]
    assert decision.rewrite is not None and decision.rewrite.strategy == "checkpoint"


def test_a_fold_asks_for_the_summary_between_load_and_save() -> None:
    messages = history_between(11_000, 13_000)  # room in the window for it in place
    commands, decision = commands_of(compaction(request(messages, NO_OFFLOAD)), Store())
    assert kinds(commands) == ["LoadConversation", "GetSummary", "SaveCrossing"]
    ask = commands[1]
    assert isinstance(ask, GetSummary) and ask.summary_tokens > 0
    # In place: the conversation's own request (its history as it would go without the
    # fold, the same system, tools and model), then one message naming what to replace.
    asked = ask.body["messages"]
    assert len(asked) == len(messages) + 1 and asked[0] == messages[0]
    assert asked[1]["content"][1]["id"] == "toolu_0000"
    assert ask.body["model"] == "claude-test" and ask.body["max_tokens"] == ask.summary_tokens
    prompt = asked[-1]["content"][0]["text"]
    assert prompt.startswith("[compaction-proxy] This conversation is getting long.")
    assert "Write notes that will replace messages 2 to " in prompt
    assert decision.rewrite is not None and decision.rewrite.summary == "made"


def test_no_summary_packs_and_says_why() -> None:
    messages = conversation(30, result_words=150)
    commands, decision = commands_of(compaction(request(messages, NO_OFFLOAD)), Store(summary=None))
    assert kinds(commands) == ["LoadConversation", "GetSummary", "SaveCrossing"]
    assert decision.rewrite is not None and decision.rewrite.strategy == "pack"
    assert decision.reason == "summary_unavailable"
    assert decision.summary_failure == "it failed"


def test_a_fold_whose_summary_the_store_could_not_be_read_for_stores_no_pack() -> None:
    """The store could not be read for the fold's summary (a timeout: it may be stored):
    the crossing packs as one planned without the store, and stores nothing, so its pack
    never takes the place of the conversation's line (test_summary_facts.py)."""
    messages = conversation(30, result_words=150)
    store = Store(summary=None)
    store.unread = True
    commands, decision = commands_of(compaction(request(messages, NO_OFFLOAD)), store)
    assert kinds(commands) == ["LoadConversation", "GetSummary"]
    assert decision.rewrite is not None and decision.rewrite.strategy == "pack"
    assert decision.rewrite.checkpoint is None and decision.rewrite.blobs == []
    assert decision.reason == "store_unavailable" and decision.summary_failure == "it failed"
    assert store.checkpoints == {}


def test_a_store_that_cannot_be_read_packs_without_offloading() -> None:
    commands, decision = commands_of(compaction(request(conversation(12))), Store(down=True))
    # (It saved its pack too: see the next test for why it no longer does.)
    assert kinds(commands) == ["LoadConversation"]
    assert decision.rewrite is not None and decision.rewrite.strategy == "pack"
    assert decision.rewrite.blobs == [] and decision.rewrite.tool is None
    assert decision.reason == "store_unavailable"
    assert decision.rewrite.checkpoint is None


def test_a_store_that_could_not_be_read_has_nothing_written_over_its_line() -> None:
    """A load that failed (a timeout, the store answering again by the crossing's save)
    plans without the conversation's line: saved, its pack of the history as sent would
    take that line's place (it covers a longer prefix), and every later turn would go on
    from the pack, the line's summary gone (tests/server/test_summary_facts.py)."""
    limits = policy(target=5_000)
    store = Store()
    commands_of(compaction(request(conversation(12), limits)), store)
    (line,) = store.checkpoints.values()
    assert line.strategy != "pack"
    store.down = True
    commands, decision = commands_of(compaction(request(conversation(13), limits)), store)
    assert kinds(commands) == ["LoadConversation"]
    assert decision.rewrite is not None and decision.rewrite.strategy == "pack"
    assert decision.rewrite.checkpoint is None and decision.reason == "store_unavailable"
    assert list(store.checkpoints.values()) == [line]
    store.down = False
    _, after = commands_of(compaction(request(conversation(14), limits)), store)
    # The next turn goes on from the line: its stubs, not a pack's note.
    assert after.rewrite is not None and after.rewrite.refs
    assert after.body is not None and b"earlier messages were dropped" not in after.body


def test_blobs_that_cannot_be_saved_never_become_stubs() -> None:
    messages = conversation(12)
    commands, decision = commands_of(
        compaction(request(messages, policy(target=5_000))), Store(saves=False)
    )
    assert kinds(commands) == ["LoadConversation", "SaveCrossing"]
    assert decision.rewrite is not None and decision.rewrite.refs == []
    assert decision.body is not None and b"compaction-proxy offloaded" not in decision.body


def test_nothing_fits_is_refused_before_any_write() -> None:
    messages = [{"role": "user", "content": " ".join(["huge"] * 30_000)}]
    commands, decision = commands_of(compaction(request(messages)), Store())
    assert kinds(commands) == ["LoadConversation"]
    assert isinstance(decision.outcome, Refuse)
    assert decision == Decision(decision.outcome, decision.estimate)
    assert "more than the 20000-token window" in decision.outcome.message


def test_the_slot_is_the_first_message() -> None:
    messages = conversation(12)
    commands, _ = commands_of(compaction(request(messages, policy(target=5_000))), Store())
    counted = count_request(ANTHROPIC, COUNTER, {"messages": messages}, messages)
    assert isinstance(commands[0], LoadConversation)
    assert commands[0].root == root_of(counted.digests)


def test_a_request_that_cannot_offer_read_result_leaves_the_rewrite_alone() -> None:
    messages = conversation(12)
    store = Store()
    commands_of(compaction(request(messages, policy(target=5_000))), store)
    (stored,) = store.checkpoints.values()
    # Both read_result names taken by client tools: this request cannot read stubs.
    taken = [
        {"name": n, "input_schema": {}} for n in ("read_result", "compaction_proxy_read_result")
    ]
    body = {"model": "claude-test", "max_tokens": 100, "tools": taken, "messages": messages}
    counted = count_request(ANTHROPIC, COUNTER, body, messages)
    alone = CompactionRequest(
        ANTHROPIC,
        body,
        messages,
        counted,
        ANTHROPIC.counter(COUNTER),
        policy(target=5_000),
        1.0,
        ClientJSON.written(body),
    )
    commands, decision = commands_of(compaction(alone), store)
    assert kinds(commands) == ["LoadConversation"], "nothing is written over the rewrite"
    assert decision.rewrite is not None and decision.rewrite.tool is None
    assert decision.rewrite.refs == [] and decision.rewrite.checkpoint is None
    assert list(store.checkpoints.values()) == [stored]


def test_a_summary_paid_for_is_used_when_the_writes_fail() -> None:
    messages = conversation(100, result_words=150)  # over the trigger even offloaded
    limits = policy(offload_threshold=300, target=4_000)
    commands, decision = commands_of(compaction(request(messages, limits)), Store(saves=False))
    assert kinds(commands) == ["LoadConversation", "GetSummary", "SaveCrossing"]
    save = commands[-1]
    assert isinstance(save, SaveCrossing) and save.blobs and save.summary is not None
    rewrite = decision.rewrite
    assert rewrite is not None and rewrite.summary == "made" and rewrite.strategy == "summary"
    assert rewrite.refs == [] and rewrite.checkpoint is None
    assert decision.reason == "store_unavailable"
    assert decision.body is not None and b"compaction-proxy offloaded" not in decision.body


# Summaries made ahead. The test policy: trigger 8,000, target 4,000, window 20,000, so
# they are made from 7,200 tokens (Limits.prepare_at) and, over the trigger, not waited
# for up to 11,000 (Limits.defer_at).
def history_between(low: int, high: int) -> list[dict[str, Any]]:
    """The shortest test conversation whose history is within (low, high] tokens."""
    for turns in range(1, 200):
        messages = conversation(turns, result_words=150)
        tokens = count_request(ANTHROPIC, COUNTER, {"messages": messages}, messages).history
        if low < tokens <= high:
            return messages
    raise AssertionError(f"no test conversation of {low}-{high} tokens")


def ready(store: Store, text: str = "notes made ahead") -> None:
    """The background calls finish: every summary in the making is ready."""
    for root, made in store.prepared.items():
        store.prepared[root] = dataclasses.replace(made, text=text)


def test_near_the_trigger_the_next_summary_is_made_ahead() -> None:
    messages = history_between(7_200, 8_000)
    store = Store()
    commands, decision = commands_of(compaction(request(messages, NO_OFFLOAD)), store)
    assert kinds(commands) == ["LoadConversation", "PrepareSummary"]
    prepare = commands[1]
    assert isinstance(prepare, PrepareSummary) and prepare.ask.summary_tokens > 0
    assert prepare.facts.ranked() and prepare.facts_budget > 0
    assert isinstance(decision.outcome, Untouched), "the request itself goes on untouched"
    # The next turn finds it in the making: nothing is asked twice.
    commands, _ = commands_of(compaction(request(messages, NO_OFFLOAD)), store)
    assert kinds(commands) == ["LoadConversation"]


def test_far_from_the_trigger_nothing_is_made_ahead() -> None:
    messages = history_between(5_000, 7_000)
    commands, decision = commands_of(compaction(request(messages, NO_OFFLOAD)), Store())
    assert commands == [] and isinstance(decision.outcome, Untouched)


def test_a_fold_uses_the_summary_made_ahead_without_waiting() -> None:
    store = Store()
    commands_of(compaction(request(history_between(7_200, 8_000), NO_OFFLOAD)), store)
    ready(store)
    over = history_between(8_000, 11_000)
    commands, decision = commands_of(compaction(request(over, NO_OFFLOAD)), store)
    assert "GetSummary" not in kinds(commands), "no turn waits for the summariser"
    assert kinds(commands)[0] == "LoadConversation" and kinds(commands)[-1] == "SaveCrossing"
    rewrite = decision.rewrite
    assert rewrite is not None and rewrite.strategy == "summary"
    assert decision.body is not None and b"notes made ahead" in decision.body
    assert rewrite.estimate <= 8_000


def test_a_summary_still_in_the_making_is_not_waited_for_while_there_is_room() -> None:
    store = Store()
    commands_of(compaction(request(history_between(7_200, 8_000), NO_OFFLOAD)), store)
    over = history_between(8_000, 11_000)
    commands, decision = commands_of(compaction(request(over, NO_OFFLOAD)), store)
    assert kinds(commands) == ["LoadConversation"], "not asked again, not waited for"
    assert isinstance(decision.outcome, Untouched) and decision.reason == "summary_pending"


def test_far_over_the_trigger_the_request_waits_for_its_summary() -> None:
    store = Store()
    commands_of(compaction(request(history_between(7_200, 8_000), NO_OFFLOAD)), store)
    far = history_between(11_000, 16_000)
    commands, decision = commands_of(compaction(request(far, NO_OFFLOAD)), store)
    assert kinds(commands) == ["LoadConversation", "GetSummary", "SaveCrossing"]
    assert decision.rewrite is not None and decision.rewrite.summary == "made"


def test_at_the_wait_point_the_summary_still_in_the_making_is_waited_for() -> None:
    """Over the wait point, with the summary of the oldest groups still being made
    ahead: the crossing asks for that one (waiting for what is left of its call) and
    folds those groups with it, rather than pay for a second summary of more turns."""
    small = policy(offload_threshold=100_000, summary_max_tokens=1_000)
    store = Store(summary="notes made ahead")
    commands_of(compaction(request(history_between(7_200, 8_000), small)), store)
    (making,) = store.prepared.values()
    assert making.pending
    far = history_between(11_000, 16_000)
    commands, decision = commands_of(compaction(request(far, small)), store)
    assert kinds(commands) == ["LoadConversation", "GetSummary", "SaveCrossing"]
    asked = commands[1]
    assert isinstance(asked, GetSummary) and asked.key == making.key and asked.ahead
    rewrite = decision.rewrite
    assert rewrite is not None and rewrite.strategy == "summary"
    assert decision.body is not None and b"notes made ahead" in decision.body
    assert rewrite.tokens_after <= small.trigger_tokens


def test_a_summary_made_ahead_stored_before_the_fold_asked_says_ahead() -> None:
    """At the wait point the note still said "being made", but the summary was stored
    by the time the crossing asked for it: made ahead for this fold (the request did not
    wait), not one from an earlier crossing (x-compaction-summary, summaries_total)."""
    small = policy(offload_threshold=100_000, summary_max_tokens=1_000)
    store = Store(summary="notes made ahead")
    commands_of(compaction(request(history_between(7_200, 8_000), small)), store)

    def stored(command: Command) -> Reply:
        if isinstance(command, GetSummary):
            assert command.ahead
            return SummaryReply("notes made ahead", reused=True)
        return store(command)

    far = history_between(11_000, 16_000)
    _, decision = commands_of(compaction(request(far, small)), stored)
    rewrite = decision.rewrite
    assert rewrite is not None and rewrite.strategy == "summary"
    assert rewrite.summary == "ahead"


def test_a_fold_at_the_windows_edge_has_its_summary_made_from_the_transcript() -> None:
    """In place, the summariser's request is the whole history plus the prompt and the
    summary: a crossing with no room left for them (put off to the window's edge) sends
    the summariser the transcript of the folded turns instead."""
    roomy, edge = history_between(11_000, 13_000), history_between(18_500, 19_500)
    sent = {}
    for name, messages in (("roomy", roomy), ("edge", edge)):
        commands, decision = commands_of(compaction(request(messages, NO_OFFLOAD)), Store())
        asked = [c for c in commands if isinstance(c, GetSummary)]
        assert len(asked) == 1 and decision.rewrite is not None
        assert decision.rewrite.strategy == "summary"
        sent[name] = asked[0].body["messages"]
    assert len(sent["roomy"]) > 1, "in place: the conversation's own messages"
    assert len(sent["edge"]) == 1, "the transcript, in one message"


def test_a_summary_that_failed_ahead_is_asked_for_at_the_fold() -> None:
    store = Store()
    commands_of(compaction(request(history_between(7_200, 8_000), NO_OFFLOAD)), store)
    for root, made in store.prepared.items():
        store.prepared[root] = dataclasses.replace(made, failed=True)
    over = history_between(8_000, 11_000)
    commands, decision = commands_of(compaction(request(over, NO_OFFLOAD)), store)
    assert kinds(commands) == ["LoadConversation", "GetSummary", "SaveCrossing"]
    assert decision.rewrite is not None and decision.rewrite.summary == "made"


def test_blobs_found_gone_are_written_again_from_the_clients_messages() -> None:
    """An evicted blob that the new checkpoint still names: its text is in the request
    the client sent, so the crossing stores it again rather than leave a dead stub."""
    messages = conversation(12)
    store = Store()
    # A window with room for the fold to wait for its summary made ahead (the deferral is
    # at most 5% of the window past the trigger): the grown history goes on unfolded.
    deferring = policy(target=5_000, window=60_000)
    first, _ = commands_of(compaction(request(messages, deferring)), store)
    (offload,) = [c for c in first if isinstance(c, SaveCrossing)]
    gone = offload.blobs[0][0]

    class Evicted(Store):
        def __call__(self, command: Command) -> Reply:
            if isinstance(command, SaveCrossing) and command.checkpoint is not None:
                super().__call__(command)
                return Saved(ok=True, lost=tuple(r for r in command.touch if r == gone))
            return super().__call__(command)

    evicted = Evicted()
    evicted.checkpoints = store.checkpoints
    grown = conversation(40)  # the same start, over the trigger: a new crossing
    commands, decision = commands_of(compaction(request(grown, deferring)), evicted)
    saves = [c for c in commands if isinstance(c, SaveCrossing)]
    assert len(saves) == 2 and gone in saves[0].touch
    again = saves[1]
    assert again.checkpoint is None and again.touch == ()
    assert [ref for ref, _ in again.blobs] == [gone]
    assert again.blobs[0][1] == dict(offload.blobs)[gone]
    assert decision.rewrite is not None and gone in decision.rewrite.refs


def memo_request(messages: list[dict[str, Any]], memo: StubbedMemo) -> CompactionRequest:
    return dataclasses.replace(request(messages, policy(target=5_000)), stubbed=memo)


def test_stubbed_messages_are_built_once_and_reused_byte_for_byte(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Each turn reapplies the checkpoint's stubs to the whole history the client resent:
    with the shell's memo a stub is built once per original, and the bytes sent are those
    a fresh build gives."""
    messages = conversation(12)
    memo: StubbedMemo = {}
    store = Store()
    commands_of(compaction(memo_request(messages, memo)), store)
    assert len(memo) == 11  # every stubbed message of the crossing
    grown = [*messages, {"role": "assistant", "content": "Done reading."}]
    fresh = commands_of(compaction(request(grown, policy(target=5_000))), store)[1]

    def never(*_: Any) -> Any:
        raise AssertionError("a stubbed message was built again")

    monkeypatch.setattr(ANTHROPIC, "with_results", never)
    _, reused = commands_of(compaction(memo_request(grown, memo)), store)
    assert reused.rewrite is not None and reused.rewrite.strategy == "checkpoint"
    assert reused.body == fresh.body and reused.estimate == fresh.estimate


def test_chat_tool_messages_with_string_content_are_reused_from_the_memo(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A Chat tool result is a message whose content is a string (its digest's form 2:
    the text read as one block, which still pins the message exactly): its stubbed
    message is built once and reused, as a Messages block list's is."""
    from tests.core import test_planner_chat as chat_case

    messages = chat_case.conversation(12)
    limits = chat_case.policy(target=3_000, trigger=6_000, offload_trigger=6_000)

    def chat_request(history: list[dict[str, Any]], memo: StubbedMemo | None) -> CompactionRequest:
        body = {"model": "gpt-test", "messages": history}
        counted = count_request(CHAT, COUNTER, body, history)
        made = CompactionRequest(
            CHAT,
            body,
            history,
            counted,
            CHAT.counter(COUNTER),
            limits,
            1.0,
            ClientJSON.written(body),
        )
        return dataclasses.replace(made, stubbed=memo) if memo is not None else made

    memo: StubbedMemo = {}
    store = Store()
    _, first = commands_of(compaction(chat_request(messages, memo)), store)
    assert first.rewrite is not None and first.rewrite.refs
    assert len(memo) == len(first.rewrite.refs)  # one per stubbed tool message
    grown = [*messages, {"role": "assistant", "content": "Done reading."}]
    fresh = commands_of(compaction(chat_request(grown, None)), store)[1]

    def never(*_: Any) -> Any:
        raise AssertionError("a stubbed message was built again")

    monkeypatch.setattr(type(CHAT), "with_results", never)
    _, reused = commands_of(compaction(chat_request(grown, memo)), store)
    assert reused.rewrite is not None and reused.rewrite.strategy == "checkpoint"
    assert reused.body == fresh.body and reused.estimate == fresh.estimate


def test_a_message_whose_digest_leaves_out_its_cache_control_is_rebuilt() -> None:
    """A digest taken without cache_control matches messages that differ in where it is:
    those are never served from the memo (the bytes sent follow the client's)."""
    messages = conversation(12)
    marked = copy.deepcopy(messages)
    result = marked[2]["content"][0]
    assert result["type"] == "tool_result"
    result["cache_control"] = {"type": "ephemeral"}
    memo: StubbedMemo = {}
    store = Store()
    commands_of(compaction(memo_request(messages, memo)), store)
    _, unmarked = commands_of(compaction(memo_request(messages, memo)), store)
    _, with_mark = commands_of(compaction(memo_request(marked, memo)), store)
    fresh = commands_of(compaction(request(marked, policy(target=5_000))), Store())[1]
    assert with_mark.body == fresh.body != unmarked.body
    assert with_mark.body is not None and b'"cache_control"' in with_mark.body


def timed(messages: list[dict[str, Any]], now: int) -> CompactionRequest:
    return dataclasses.replace(request(messages, policy(target=5_000)), now=now, renew_every=600)


def test_refs_named_before_are_renewed_at_most_every_interval() -> None:
    """Incremental offload makes nearly every turn a crossing: the refs the previous
    checkpoint named were renewed at its renewed_at or later, so crossings within the
    interval renew none of them; the first one after it renews them all."""
    store = Store()
    saves = []
    for turns, now in ((12, 1_000), (30, 1_200), (40, 1_599), (50, 1_600)):
        commands, decision = commands_of(compaction(timed(conversation(turns), now)), store)
        (save,) = [c for c in commands if isinstance(c, SaveCrossing)]
        assert decision.rewrite is not None and decision.rewrite.strategy != "checkpoint"
        saves.append(save)
    first, within, last_within, after = saves
    assert first.touch == () and first.checkpoint.renewed_at == 1_000  # all written now
    assert within.blobs and within.touch == () and within.checkpoint.renewed_at == 1_000
    assert last_within.touch == () and last_within.checkpoint.renewed_at == 1_000
    assert after.checkpoint.renewed_at == 1_600
    named_before = {ref for ref, _ in first.blobs + within.blobs + last_within.blobs}
    assert after.checkpoint is not None
    assert set(after.touch) == named_before & set(refs_of(after.checkpoint.segments))


def test_a_ref_the_previous_checkpoint_did_not_name_is_renewed_at_once() -> None:
    """Nothing says when a ref the previous checkpoint did not name was renewed: then all
    of them are, and the interval starts again."""
    store = Store()
    commands_of(compaction(timed(conversation(12), 1_000)), store)
    (before,) = store.checkpoints.values()
    named = refs_of(before.segments)
    made = dataclasses.replace(before, renewed_at=0)
    asked = timed(conversation(12), 1_010)
    clock = asked.now, asked.renew_every
    assert renewal(before, made, named, *clock) == (dataclasses.replace(made, renewed_at=1_000), ())
    checkpoint, touch = renewal(before, made, [*named, "r_0123456789abcdef"], *clock)
    assert touch == (*named, "r_0123456789abcdef") and checkpoint.renewed_at == 1_010
    checkpoint, touch = renewal(None, made, named, *clock)
    assert touch == tuple(named) and checkpoint.renewed_at == 1_010


def test_without_a_clock_every_crossing_renews_every_ref() -> None:
    store = Store()
    commands_of(compaction(request(conversation(12), policy(target=5_000))), store)
    commands, _ = commands_of(compaction(request(conversation(30), policy(target=5_000))), store)
    (save,) = [c for c in commands if isinstance(c, SaveCrossing)]
    assert save.touch and save.checkpoint.renewed_at == 0
