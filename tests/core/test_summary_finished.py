"""One place applies `keep_facts` (issue 25, finding 4): `GetSummary.finished`, called by
the executor on the text its summariser made, for a crossing's summary and for one made
ahead alike. The driver folds with the text the executor answered, and adds nothing."""

from __future__ import annotations

from proxy.core.commands import (
    Command,
    GetSummary,
    PrepareSummary,
    Reply,
    SaveCrossing,
    SummaryReply,
)
from proxy.core.driver import commands_of, compaction
from tests.core.test_driver import COUNTER, NO_OFFLOAD, Store, history_between, request


def fold_commands(answer: str | None = None) -> tuple[GetSummary, SaveCrossing]:
    """The GetSummary and SaveCrossing of a fold whose executor answers `answer`, or the
    asked summary finished (as the server's executor does) when None."""
    store = Store()

    def execute(command: Command) -> Reply:
        if isinstance(command, GetSummary):
            text = command.finished("notes", COUNTER.count_text) if answer is None else answer
            return SummaryReply(text)
        return store(command)

    commands, _ = commands_of(compaction(request(history_between(11_000, 13_000), NO_OFFLOAD)),
                              execute)  # fmt: skip
    ask = next(c for c in commands if isinstance(c, GetSummary))
    save = next(c for c in commands if isinstance(c, SaveCrossing))
    return ask, save


def test_a_crossings_summary_asks_with_the_folds_facts() -> None:
    ask, _ = fold_commands()
    ranked = ask.facts.ranked()
    assert ranked and ask.facts_budget > 0
    finished = ask.finished("notes", COUNTER.count_text)
    assert finished.startswith("notes") and finished != "notes"
    assert any(fact in finished for fact in ranked)
    # A summary that kept every identifier is left as it is.
    whole = "notes " + " ".join(ranked)
    assert ask.finished(whole, COUNTER.count_text) == whole


def test_the_driver_stores_the_text_as_the_executor_finished_it() -> None:
    ask, save = fold_commands()
    assert save.summary == (ask.key, ask.finished("notes", COUNTER.count_text))


def test_the_driver_adds_nothing_to_the_executors_text() -> None:
    ask, save = fold_commands("notes as answered")
    assert save.summary == (ask.key, "notes as answered")


def test_a_summary_made_ahead_carries_the_same_facts_on_its_ask() -> None:
    store = Store()
    commands, _ = commands_of(compaction(request(history_between(7_200, 8_000), NO_OFFLOAD)),
                              store)  # fmt: skip
    prepare = next(c for c in commands if isinstance(c, PrepareSummary))
    assert prepare.ask.facts.ranked() and prepare.ask.facts_budget > 0
    assert (prepare.facts, prepare.facts_budget) == (prepare.ask.facts, prepare.ask.facts_budget)


def test_without_facts_the_text_is_unchanged() -> None:
    ask = GetSummary("k", {"messages": []}, 100, "claude-test")
    assert ask.finished("notes E1234 /etc/x.conf", COUNTER.count_text) == "notes E1234 /etc/x.conf"
