"""The read rounds' generator (proxy/core/rounds.py), Playbook-style: the commands one
answer's rounds yield, in order, for each way they end; no I/O anywhere."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import orjson

from proxy.core.commands import (
    REFUSED,
    Answered,
    Failed,
    ReadResults,
    Results,
    RoundCommand,
    RoundReply,
    SendRound,
    ToppedUp,
    TopUp,
)
from proxy.core.driver import commands_of
from proxy.core.policy import Policy
from proxy.core.rounds import RoundsRequest, read_rounds
from proxy.core.tokens import default_counter
from proxy.wire import ANTHROPIC

TOOL = "read_result"
REF = "r_" + "0" * 16
TEXT = "line of the offloaded log\n" * 400


def request(**changes: Any) -> RoundsRequest:
    """A request whose history names REF; `changes` to its policy."""
    sent = {
        "model": "claude-test",
        "max_tokens": 500,
        "messages": [{"role": "user", "content": f'see read_result(ref="{REF}")'}],
    }
    policy = replace(Policy(), **{"max_read_rounds": 2, "read_length": 2_000, **changes})
    body = orjson.dumps(sent)
    return RoundsRequest(ANTHROPIC, sent, body, frozenset({REF}), default_counter(), policy)


def reading(ref: str = REF, n: int = 0) -> Answered:
    call = {"type": "tool_use", "id": f"toolu_{n}", "name": TOOL, "input": {"ref": ref}}
    message = {"role": "assistant", "content": [call], "stop_reason": "tool_use"}
    return Answered(ANTHROPIC.split(message, TOOL))


DONE = Answered(
    ANTHROPIC.split(
        {
            "role": "assistant",
            "content": [{"type": "text", "text": "done"}],
            "stop_reason": "end_turn",
        },
        TOOL,
    )
)


class Script:
    """Replies in order: each SendRound's answer from `answers`; reads from `texts`."""

    def __init__(
        self, answers: list[Answered | Failed], texts: dict[str, str], budget: bool = True
    ):
        self.answers, self.texts, self.budget = list(answers), texts, budget
        self.sent: list[dict[str, Any]] = []

    def __call__(self, command: RoundCommand) -> RoundReply:
        if isinstance(command, SendRound):
            self.sent.append(orjson.loads(command.body))
            return self.answers.pop(0)
        if isinstance(command, ReadResults):
            texts = tuple(self.texts.get(ref) for ref in command.refs)
            return Results(texts, (False,) * len(texts))
        assert isinstance(command, TopUp)
        return ToppedUp(self.budget)


def kinds(commands: list[RoundCommand]) -> list[str]:
    return [type(c).__name__ for c in commands]


def test_an_answer_without_reads_is_complete_after_one_round() -> None:
    commands, ended = commands_of(read_rounds(request()), Script([DONE], {}))
    assert kinds(commands) == ["SendRound"]
    assert commands[0] == SendRound(request().body, 1)  # round 1: the request as sent
    assert (ended.outcome, ended.rounds, ended.note, ended.failed) == ("complete", 0, None, False)


def test_a_read_is_fetched_held_in_the_budget_and_sent_as_round_two() -> None:
    script = Script([reading(), DONE], {REF: TEXT})
    commands, ended = commands_of(read_rounds(request()), script)
    assert kinds(commands) == ["SendRound", "ReadResults", "TopUp", "SendRound"]
    assert commands[1] == ReadResults((REF,))
    topped = commands[2]
    assert isinstance(topped, TopUp) and topped.tokens > 0 and topped.output == 500
    assert isinstance(commands[3], SendRound) and commands[3].number == 2
    second = script.sent[1]["messages"]
    assert second[-2]["content"][0]["name"] == TOOL  # the call, then its result
    assert TEXT[:2_000] in second[-1]["content"][0]["content"]
    assert (ended.outcome, ended.rounds, ended.note) == ("complete", 1, None)


def test_a_ref_the_history_does_not_name_is_not_asked_of_the_store() -> None:
    script = Script([reading("r_" + "1" * 16), DONE], {})
    commands, ended = commands_of(read_rounds(request()), script)
    assert kinds(commands) == ["SendRound", "TopUp", "SendRound"]
    assert "No offloaded result" in orjson.dumps(script.sent[1]["messages"][-1]).decode()
    assert ended.outcome == "complete"


def test_the_round_limit_ends_with_its_note() -> None:
    script = Script([reading(n=0), reading(n=1), reading(n=2)], {REF: TEXT})
    commands, ended = commands_of(read_rounds(request(max_read_rounds=2)), script)
    assert kinds(commands).count("SendRound") == 3
    assert (ended.outcome, ended.rounds) == ("limit", 2)
    assert ended.note is not None and "2 read rounds" in ended.note


def test_a_budget_that_refuses_ends_before_the_round_is_sent() -> None:
    script = Script([reading()], {REF: TEXT}, budget=False)
    commands, ended = commands_of(read_rounds(request()), script)
    assert kinds(commands) == ["SendRound", "ReadResults", "TopUp"]
    assert (ended.outcome, ended.rounds) == ("budget", 0)
    assert ended.note is not None and "budget" in ended.note


def test_a_round_that_cannot_fit_the_window_is_not_sent() -> None:
    script = Script([reading()], {REF: TEXT})
    commands, ended = commands_of(read_rounds(request(window=50)), script)
    assert kinds(commands) == ["SendRound", "ReadResults"]
    assert ended.outcome == "window" and ended.note is not None


def test_a_failed_round_ends_the_rounds_as_it_says() -> None:
    script = Script([reading(), Failed("upstream_error")], {REF: TEXT})
    _, ended = commands_of(read_rounds(request()), script)
    assert (ended.outcome, ended.rounds, ended.failed) == ("upstream_error", 1, True)


# -- read_result deferred by the proxy, refused: round 1 once more listed ------------------


def deferred_request() -> RoundsRequest:
    """`request()` as sent with read_result deferred, to be relisted if refused."""
    plain = request()
    sent = {**plain.sent, "tools": [ANTHROPIC.read_result_tool(TOOL, deferred=True)]}
    return replace(plain, sent=sent, body=orjson.dumps(sent), relist=TOOL)


def test_round_one_refused_deferred_goes_once_more_listed_and_on_from_there() -> None:
    script = Script([Failed(REFUSED), reading(), DONE], {REF: TEXT})
    commands, ended = commands_of(read_rounds(deferred_request()), script)
    assert kinds(commands) == ["SendRound", "SendRound", "ReadResults", "TopUp", "SendRound"]
    assert [c.number for c in commands if isinstance(c, SendRound)] == [1, 1, 2]
    deferred, listed, second = script.sent
    assert deferred["tools"][0]["defer_loading"] is True
    assert listed["tools"] == [ANTHROPIC.read_result_tool(TOOL)]
    assert listed["messages"] == deferred["messages"]  # the same plan
    assert second["tools"] == listed["tools"]  # later rounds are built from the listed form
    assert (ended.outcome, ended.rounds, ended.relisted, ended.failed) == (
        "complete",
        1,
        True,
        False,
    )


def test_the_listed_form_refused_too_ends_the_rounds_not_relisted() -> None:
    script = Script([Failed(REFUSED), Failed("")], {})
    commands, ended = commands_of(read_rounds(deferred_request()), script)
    assert kinds(commands) == ["SendRound", "SendRound"]
    assert (ended.failed, ended.relisted) == (True, False)


def test_a_refusal_without_a_listed_form_ends_the_rounds() -> None:
    script = Script([Failed(REFUSED)], {})
    commands, ended = commands_of(read_rounds(request()), script)
    assert kinds(commands) == ["SendRound"]
    assert (ended.outcome, ended.failed, ended.relisted) == (REFUSED, True, False)


def test_a_listed_round_one_that_is_answered_is_relisted_however_the_rounds_end() -> None:
    script = Script([Failed(REFUSED), reading(n=0), reading(n=1), reading(n=2)], {REF: TEXT})
    _, ended = commands_of(read_rounds(deferred_request()), script)
    assert (ended.outcome, ended.relisted) == ("limit", True)
