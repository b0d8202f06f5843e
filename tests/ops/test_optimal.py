"""The optimal-schedule calculator (proxy/ops/optimal.py) against an exhaustive search.

The search bills every allowed schedule of tiny conversations the slow way: each
request's prompt built as a list of items, the prefix it shares with the previous
request found by comparing the lists, so the calculator's shortcuts (prefix sums,
running minima) are checked against the rules as written in its docstring.
"""

from __future__ import annotations

import itertools
import math
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from proxy.core.policy import Policy
from proxy.core.tokens import default_counter
from proxy.ops.optimal import (
    Message,
    Prices,
    Request,
    Rules,
    Shape,
    bill,
    cheapest,
    rules_for,
    shape_of,
    unmanaged,
)

PRICES = Prices()


@st.composite
def shapes(draw: st.DrawFn) -> tuple[Shape, Rules]:
    turns = draw(st.integers(1, 3))
    messages = [Message(draw(st.integers(1, 40)), 0, True, False)]
    for _ in range(turns):
        messages.append(Message(draw(st.integers(1, 40)), 0, True, False))  # assistant
        tokens = draw(st.integers(1, 60))
        stubbed = draw(st.integers(1, tokens))
        messages.append(Message(tokens, stubbed, False, True))  # the tool result
    messages = [Message(m.tokens, m.stubbed or m.tokens, m.group_start, m.result) for m in messages]
    fixed = draw(st.integers(0, 20))
    requests = tuple(Request(2 * n + 1, fixed, draw(st.integers(0, 10))) for n in range(turns + 1))
    rules = Rules(
        window=draw(st.integers(40, 400)),
        keep_last=draw(st.integers(0, 2)),
        keep_results=draw(st.integers(1, 2)),
        summary_tokens=draw(st.integers(1, 30)),
        keep_tokens=draw(st.sampled_from([0, 30, 80])),
    )
    return Shape(tuple(messages), requests), rules


def _states(shape: Shape, req: Request, rules: Rules) -> list[tuple[int, int]]:
    """Every state the docstring allows for a request, window apart."""
    msgs = shape.messages
    offloadable = [i for i, m in enumerate(msgs) if m.stubbed < m.tokens]
    starts = [i for i in range(req.messages) if msgs[i].group_start]
    folds = [0] + [
        f for f in starts if f > 0 and sum(1 for s in starts if s >= f) >= rules.keep_last
    ]
    results = [i for i in range(req.messages) if msgs[i].result]
    kept = results[-rules.keep_results :]
    while (
        rules.keep_tokens
        and len(kept) > 1
        and sum(msgs[i].tokens for i in kept) > rules.keep_tokens
    ):
        kept = kept[1:]  # as many of the newest as fit, the newest whatever its size
    first_kept = kept[0] if kept else req.messages
    limit = sum(1 for i in offloadable if i < first_kept)
    out = []
    for f in folds:
        below = sum(1 for i in offloadable if i < f)
        out += [(f, k) for k in range(below, max(below, limit) + 1)]
    return out


def _items(shape: Shape, req: Request, rules: Rules, f: int, k: int) -> list[tuple[Any, ...]]:
    msgs = shape.messages
    offloadable = [i for i, m in enumerate(msgs) if m.stubbed < m.tokens]
    stubbed = set(offloadable[:k])
    items: list[tuple[Any, ...]] = [("fixed", req.fixed)]
    if f:
        items.append(("summary", f, _summary(shape, rules, f)))
    for i in range(f, req.messages):
        form = "stub" if i in stubbed else "verbatim"
        items.append((form, i, msgs[i].stubbed if i in stubbed else msgs[i].tokens))
    return items


def _summary(shape: Shape, rules: Rules, f: int) -> int:
    return min(rules.summary_tokens, sum(m.tokens for m in shape.messages[:f])) if f else 0


def _size(items: list[tuple[Any, ...]]) -> int:
    return sum(item[-1] for item in items)


def _bill(shape: Shape, rules: Rules, schedule: tuple[tuple[int, int], ...]) -> float:
    total = 0.0
    before: list[tuple[Any, ...]] = []
    msgs = shape.messages
    for n, (req, (f, k)) in enumerate(zip(shape.requests, schedule, strict=True)):
        items = _items(shape, req, rules, f, k)
        shared = 0
        for a, b in zip(before, items, strict=False):
            if a != b:
                break
            shared += a[-1]
        total += shared * PRICES.read + (_size(items) - shared) * PRICES.write
        total += req.output * PRICES.output
        f0 = schedule[n - 1][0] if n else 0
        if f > f0:  # the summariser call, as documented
            into = req.fixed + (
                min(rules.summary_tokens, sum(m.tokens for m in msgs[:f0])) if f0 else 0
            )
            into += sum(m.stubbed for m in msgs[f0:f])
            total += (
                into * PRICES.read
                + min(rules.summary_tokens, sum(m.tokens for m in msgs[:f])) * PRICES.output
            )
        before = items
    return total


def _allowed(schedule: tuple[tuple[int, int], ...]) -> bool:
    if schedule[0] != (0, 0):
        return False
    for (f0, k0), (f, k) in itertools.pairwise(schedule):
        if f < f0 or (f == f0 and k < k0):
            return False
    return True


def exhaustive(shape: Shape, rules: Rules) -> float:
    options = []
    for req in shape.requests:
        fits = [
            s
            for s in _states(shape, req, rules)
            if _size(_items(shape, req, rules, *s)) <= rules.window
        ]
        options.append(fits)
    costs = [_bill(shape, rules, s) for s in itertools.product(*options) if _allowed(s)]
    return min(costs, default=math.inf)


@settings(max_examples=150, deadline=None)
@given(shapes())
def test_cheapest_is_the_exhaustive_minimum(case: tuple[Shape, Rules]) -> None:
    shape, rules = case
    found = cheapest(shape, rules)
    floor = exhaustive(shape, rules)
    if math.isinf(floor):
        assert found is None
        return
    assert found is not None
    assert found.cost == pytest.approx(floor)
    # the schedule it returns is one of those and costs what it says
    assert _allowed(tuple(found.states))
    assert _bill(shape, rules, tuple(found.states)) == pytest.approx(found.cost)
    assert found.largest <= rules.window
    # what it pays for adds up to what it costs; output and first writes are the
    # unmanaged run's
    parts = bill(shape, rules, found.states)
    assert sum(parts.values()) == pytest.approx(found.cost)
    assert parts["output"] == pytest.approx(sum(r.output for r in shape.requests) * PRICES.output)
    sent = max(r.messages for r in shape.requests)
    firsts = sum(m.tokens for m in shape.messages[:sent]) * PRICES.write
    assert parts["new"] <= firsts + 1e-9
    assert parts["new"] + parts["rewrite"] + parts["stubs"] + parts["summary"] >= 0
    # a result the next request stubs, sent uncached: only its first write is cheaper, by
    # the write price less the input price on each such result's tokens
    tail = bill(shape, rules, found.states, uncached_tail=True)
    assert {p: v for p, v in tail.items() if p != "new"} == {
        p: v for p, v in parts.items() if p != "new"
    }
    offloadable = [i for i, m in enumerate(shape.messages) if m.stubbed < m.tokens]
    going = {i for (_, k0), (_, k1) in itertools.pairwise(found.states) for i in offloadable[k0:k1]}
    saved = sum(shape.messages[i].tokens for i in going)
    assert 0 <= parts["new"] - tail["new"] <= saved * (PRICES.write - PRICES.input) + 1e-9


@settings(max_examples=100, deadline=None)
@given(shapes())
def test_floor_is_not_above_sending_everything(case: tuple[Shape, Rules]) -> None:
    shape, rules = case
    roomy = Rules(2**40, rules.keep_last, rules.keep_results, rules.summary_tokens)
    found = cheapest(shape, roomy)
    assert found is not None
    assert found.cost <= unmanaged(shape) + 1e-9
    # doing nothing is the unmanaged run, billed the same way
    assert _bill(shape, roomy, tuple((0, 0) for _ in shape.requests)) == pytest.approx(
        unmanaged(shape)
    )


def test_a_window_too_small_for_the_newest_turn_has_no_schedule() -> None:
    shape = Shape(
        (Message(10, 10, True, False), Message(10, 10, True, False), Message(50, 5, False, True)),
        (Request(1, 5, 1), Request(3, 5, 1)),
    )
    assert cheapest(shape, Rules(window=74)) is None  # the newest result stays verbatim
    assert cheapest(shape, Rules(window=75)) is not None  # 5 + 10 + 10 + 50


def _trace() -> list[dict[str, Any]]:
    log = "".join(f"line {i} src/a.py:{i} ok\n" for i in range(400))
    messages: list[dict[str, Any]] = [{"role": "user", "content": "Fix it."}]
    bodies = []
    for t in range(3):
        bodies.append({"model": "claude-x", "max_tokens": 10, "messages": list(messages)})
        call = {"type": "tool_use", "id": f"t{t}", "name": "Bash", "input": {}}
        messages.append({"role": "assistant", "content": [{"type": "text", "text": "ok"}, call]})
        result = {"type": "tool_result", "tool_use_id": f"t{t}", "content": log + str(t)}
        messages.append({"role": "user", "content": [result]})
    bodies.append({"model": "claude-x", "max_tokens": 10, "messages": list(messages)})
    return bodies


def test_shape_of_a_trace() -> None:
    counter = default_counter()
    policy = Policy(offload_threshold=500)
    shape = shape_of(_trace(), counter, policy)
    assert [r.messages for r in shape.requests] == [1, 3, 5, 7]
    assert [m.result for m in shape.messages] == [False, False, True, False, True, False, True]
    results = [m for m in shape.messages if m.result]
    assert all(m.stubbed < m.tokens // 5 for m in results)  # a 200-character head
    assert [m.group_start for m in shape.messages][:3] == [True, True, False]
    assert shape.requests[0].output == counter.count_content(_trace()[-1]["messages"][1]["content"])
    # the first three requests are answered by the next one's new assistant message; the last
    # by their mean
    assert shape.requests[-1].output == shape.requests[0].output
    rules = rules_for(policy)
    found = cheapest(shape, rules)
    assert found is not None and found.cost < unmanaged(shape)


def test_shape_of_refuses_a_trace_that_is_not_append_only() -> None:
    bodies = _trace()
    bodies[2]["messages"][1] = {"role": "assistant", "content": "something else"}
    with pytest.raises(ValueError, match="append-only"):
        shape_of(bodies, default_counter(), Policy())


def test_rules_follow_the_policy() -> None:
    rules = rules_for(
        Policy(
            window=1000,
            trigger=700,
            target=300,
            keep_last=3,
            keep_results=0,
            summary_max_tokens=8_000,
        )
    )
    assert (rules.window, rules.keep_last, rules.keep_results) == (1000, 3, 1)
    assert rules.summary_tokens == 8_000 - 1_500  # the summary_tokens at the cap, facts apart
