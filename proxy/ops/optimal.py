"""The cheapest schedule of offloads and folds for a recorded conversation: a cost floor.

`cheapest(shape, rules)` finds, by dynamic programming over the requests, the schedule
that minimises the prompt-cache bill of a conversation, so a policy's cost
(`compaction-proxy replay`) can be compared with the best any policy could do under the
same rules. What it optimises over, per request t (in order), is a *state* (f, k):

- f, the fold point: messages [0, f) are replaced by one summary (f = 0: none). f is a
  group start (an assistant message: a tool call stays with its results), never
  decreases, and leaves at least `keep_last` group starts after it in request t;
- k, the offload point: the first k offloadable results (tool results larger than the
  policy's `offload_threshold`, in history order) are stubs. k never decreases between
  folds, and the newest `keep_results` results of request t stay verbatim.

Each request is then billed, with the same prices as `replay` (proxy/core/pricing.py's
cache model: read 0.1, write 1.25, output 5 per token):

- the longest prefix it shares with the previous request *as that was sent* is read from
  the cache, everything after it is written (the agent's breakpoint on its newest
  message writes the whole prompt, as the scripted agent and Claude Code do): unchanged
  state: the whole previous prompt is read; a new offload point: the prompt up to the
  first newly stubbed result is read; a new fold point: only the fixed part (system and
  tools) is read;
- its output (the assistant message the next request adds; the last one: the mean), the
  same in every schedule;
- a fold's summariser call: a summary made in place whose input (the conversation up to
  the fold point, every offloadable result in it taken as stubbed) is all read from the
  cache, and whose output is the summary, `summary_tokens` (the proxy's cap on a summary,
  or all the folded tokens when fewer) at the output price.

Every request, as sent, must fit the window. Assumptions that make it a floor for a
policy with the same rules (keep_last, keep_results, stub size, summary size): the cache
is ideal (any prefix sent earlier can be read: no 4-breakpoint limit, no 20-block
lookback, no minimum size, no expiry); the read_result tool's definition, the
summariser's instruction and the stubs' exact bytes beyond their counted size cost
nothing; read_result rounds (the model reading a stub back) are not counted, as in
`replay`. It does not choose other summary sizes, other stub heads, dropping turns
without a summary, or undoing an offload except at a fold (after a fold everything but
the fixed part is rewritten anyway, so the new offload point is free).

The trace must be append-only (each request's messages start with the previous
request's, compared without `cache_control` and blind to string-or-text-block form), as
an agent's are; `shape_of` raises ValueError otherwise.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from proxy.core.offload import ref_for, result_text, stub_text
from proxy.core.policy import Policy
from proxy.core.pricing import CACHE_MODEL
from proxy.core.tokens import TokenCounter

INF = math.inf


@dataclass(frozen=True, slots=True)
class Message:
    tokens: int  # as the client sent it
    stubbed: int  # with its large tool results stubbed (== tokens when it has none)
    group_start: bool  # a fold may start here
    result: bool  # it holds a tool result


@dataclass(frozen=True, slots=True)
class Request:
    messages: int  # it holds messages [0, messages) of the conversation
    fixed: int  # system prompt and tools: the rest of its count
    output: int  # tokens it is answered with


@dataclass(frozen=True, slots=True)
class Shape:
    """A conversation reduced to what the floor needs: token counts."""

    messages: tuple[Message, ...]
    requests: tuple[Request, ...]


@dataclass(frozen=True, slots=True)
class Rules:
    window: int
    keep_last: int = 6  # group starts that stay verbatim after the fold point
    keep_results: int = 1  # the newest results stay verbatim (at least 1: the model's input)
    summary_tokens: int = 6_500  # a summary's size (the proxy's cap, facts budget apart)
    # ... and of those, only as many as fit in this many tokens (0: no bound; the newest
    # result stays whatever its size)
    keep_tokens: int = 0


@dataclass(frozen=True, slots=True)
class Prices:
    input: float = CACHE_MODEL.input
    read: float = CACHE_MODEL.cache_read
    write: float = CACHE_MODEL.cache_write
    output: float = CACHE_MODEL.output


@dataclass(slots=True)
class Schedule:
    cost: float  # everything: requests and summariser calls
    states: list[tuple[int, int]] = field(default_factory=list)  # (f, k) per request
    prompts: list[int] = field(default_factory=list)  # tokens sent per request
    folds: list[int] = field(default_factory=list)  # requests (1-based) that fold
    offloads: list[int] = field(default_factory=list)  # requests that stub new results
    summariser_cost: float = 0.0

    @property
    def largest(self) -> int:
        return max(self.prompts, default=0)


class _Sums:
    """Prefix sums over the shape, for O(1) prompt sizes."""

    def __init__(self, shape: Shape, rules: Rules) -> None:
        msgs = shape.messages
        self.tokens = [0]
        for m in msgs:
            self.tokens.append(self.tokens[-1] + m.tokens)
        self.offloadable = [i for i, m in enumerate(msgs) if m.stubbed < m.tokens]
        self.saving = [0]
        for i in self.offloadable:
            self.saving.append(self.saving[-1] + msgs[i].tokens - msgs[i].stubbed)
        # below[i]: offloadable results before message i
        self.below = [0] * (len(msgs) + 1)
        j = 0
        for i in range(len(msgs) + 1):
            while j < len(self.offloadable) and self.offloadable[j] < i:
                j += 1
            self.below[i] = j
        self.stubbed_prefix = [0]  # tokens of messages [0, i) with every result stubbed
        for m in msgs:
            self.stubbed_prefix.append(self.stubbed_prefix[-1] + m.stubbed)
        self.rules = rules

    def summary(self, f: int) -> int:
        return min(self.rules.summary_tokens, self.tokens[f]) if f else 0

    def prompt(self, req: Request, f: int, k: int) -> int:
        stubbed = self.saving[k] - self.saving[self.below[f]] if k > self.below[f] else 0
        return req.fixed + self.summary(f) + self.tokens[req.messages] - self.tokens[f] - stubbed

    def up_to_result(self, req: Request, f: int, k: int) -> int:
        """The prompt before offloadable result k (the first a step from k would stub)."""
        at = self.offloadable[k]
        stubbed = self.saving[k] - self.saving[self.below[f]]
        return req.fixed + self.summary(f) + self.tokens[at] - self.tokens[f] - stubbed


def _fold_points(shape: Shape, req: Request, keep_last: int) -> list[int]:
    """Where request `req` may have its fold point: 0, or a group start with at least
    keep_last group starts from it to its end."""
    starts = [i for i in range(req.messages) if shape.messages[i].group_start]
    usable = starts[: max(0, len(starts) - keep_last + 1)] if keep_last else starts
    return [0] + [i for i in usable if i > 0]


def _offload_limit(shape: Shape, req: Request, rules: Rules, sums: _Sums) -> int:
    """The largest k request `req` allows: the newest keep_results results stay verbatim,
    as many of them as fit in keep_tokens (the newest always)."""
    results = [i for i in range(req.messages) if shape.messages[i].result]
    kept = results[-max(1, rules.keep_results) :] if results else []
    if rules.keep_tokens and kept:
        total, first = 0, len(kept) - 1
        for n in range(len(kept) - 1, -1, -1):
            total += shape.messages[kept[n]].tokens
            if n < len(kept) - 1 and total > rules.keep_tokens:
                break
            first = n
        kept = kept[first:]
    first_kept = kept[0] if kept else req.messages
    return sums.below[min(first_kept, req.messages)]


def cheapest(shape: Shape, rules: Rules, prices: Prices | None = None) -> Schedule | None:
    """The cheapest schedule, or None when no schedule keeps every request in the window."""
    prices = prices or Prices()
    sums = _Sums(shape, rules)
    best: dict[tuple[int, int], float] = {(0, 0): 0.0}
    prompt_before: dict[tuple[int, int], int] = {(0, 0): 0}
    back: list[dict[tuple[int, int], tuple[tuple[int, int], str]]] = []
    previous: Request | None = None
    save = prices.write - prices.read
    for req in shape.requests:
        out = req.output * prices.output
        folds = _fold_points(shape, req, rules.keep_last)
        limit = _offload_limit(shape, req, rules, sums)
        now: dict[tuple[int, int], float] = {}
        came: dict[tuple[int, int], tuple[tuple[int, int], str]] = {}

        def offer(
            state: tuple[int, int],
            cost: float,
            src: tuple[int, int],
            how: str,
            now: dict[tuple[int, int], float] = now,
            came: dict[tuple[int, int], tuple[tuple[int, int], str]] = came,
        ) -> None:
            if cost < now.get(state, INF):
                now[state] = cost
                came[state] = (src, how)

        # Lowest cost over the previous states of each fold point, for folds.
        lowest: dict[int, tuple[float, tuple[int, int]]] = {}
        for (f0, k0), c in best.items():
            if c < lowest.get(f0, (INF, (0, 0)))[0]:
                lowest[f0] = (c, (f0, k0))
        for f in folds:
            base = sums.below[f]
            # a new fold point, from any smaller one: the cheapest way in, before rewriting
            into_fold: tuple[float, tuple[int, int], float] | None = None
            if f and previous is not None:
                for f0, (c0, src) in lowest.items():
                    if f0 >= f:  # a fold point only grows
                        continue
                    into = req.fixed + sums.summary(f0) + sums.stubbed_prefix[f]
                    into -= sums.stubbed_prefix[f0]
                    call = into * prices.read + sums.summary(f) * prices.output
                    if into_fold is None or c0 + call < into_fold[0]:
                        into_fold = (c0 + call, src, call)
            # a new offload point, from a smaller one with the same fold point: the
            # cheapest (cost before - saving on the shared prefix) over k0 < k, running
            running: tuple[float, tuple[int, int]] | None = None
            for k in range(base, max(base, limit) + 1):
                if previous is not None and k > base and (f, k - 1) in best:
                    k0 = k - 1
                    shared = min(sums.up_to_result(previous, f, k0), prompt_before[(f, k0)])
                    value = best[(f, k0)] - save * shared
                    if running is None or value < running[0]:
                        running = (value, (f, k0))
                size = sums.prompt(req, f, k)
                if size > rules.window:
                    continue
                if previous is None:
                    if (f, k) == (0, 0):
                        offer((0, 0), size * prices.write + out, (0, 0), "stay")
                    continue
                if (f, k) in best:  # unchanged since the previous request
                    before = prompt_before[(f, k)]
                    if size >= before:
                        cost = before * prices.read + (size - before) * prices.write
                        offer((f, k), best[(f, k)] + cost + out, (f, k), "stay")
                if running is not None:
                    offer((f, k), running[0] + size * prices.write + out, running[1], "offload")
                if into_fold is not None:
                    rewrite = req.fixed * prices.read + (size - req.fixed) * prices.write
                    cost = into_fold[0] + rewrite + out
                    offer((f, k), cost, into_fold[1], f"fold:{into_fold[2]}")
        if not now:
            return None
        back.append(came)
        best = now
        prompt_before = {s: sums.prompt(req, *s) for s in now}
        previous = req
    return _walk(shape, sums, best, back)


def _walk(
    shape: Shape,
    sums: _Sums,
    best: Mapping[tuple[int, int], float],
    back: Sequence[Mapping[tuple[int, int], tuple[tuple[int, int], str]]],
) -> Schedule:
    state = min(best, key=lambda s: best[s])
    schedule = Schedule(cost=best[state])
    states: list[tuple[int, int]] = []
    hows: list[str] = []
    for came in reversed(back):
        states.append(state)
        src, how = came[state]
        hows.append(how)
        state = src
    states.reverse()
    hows.reverse()
    schedule.states = states
    schedule.prompts = [
        sums.prompt(req, f, k) for req, (f, k) in zip(shape.requests, states, strict=True)
    ]
    for n, how in enumerate(hows, 1):
        if how.startswith("fold:"):
            schedule.folds.append(n)
            schedule.summariser_cost += float(how.split(":", 1)[1])
        elif how == "offload":
            schedule.offloads.append(n)
    return schedule


def unmanaged(shape: Shape, prices: Prices | None = None) -> float:
    """Every request sent as is, with the same ideal cache and no window."""
    prices = prices or Prices()
    sums = _Sums(shape, Rules(window=2**62))
    total, before = 0.0, 0
    for req in shape.requests:
        size = sums.prompt(req, 0, 0)
        total += min(before, size) * prices.read + max(0, size - before) * prices.write
        total += req.output * prices.output
        before = size
    return total


# What a schedule's cost pays for (`bill`), the first four the same in every schedule
# of a conversation whose newest result stays whole: what no policy saves.
PARTS = ("fixed", "output", "new", "context", "kept", "stubs", "rewrite", "summary")


def bill(
    shape: Shape,
    rules: Rules,
    states: Sequence[tuple[int, int]],
    prices: Prices | None = None,
    *,
    uncached_tail: bool = False,
) -> dict[str, float]:
    """A schedule's cost (`states`: its (f, k) per request, as `cheapest` gives them) by
    what it pays for, billed the slow way (each prompt a list of items, the prefix it
    shares with the previous one found by comparing them), in PARTS:

    - fixed: system and tools, read (or written when they grow);
    - output: the answers;
    - new: each message written the first time it is sent, whole (the unmanaged run
      writes it too);
    - context: messages other than offloadable results, read whole;
    - kept: offloadable results read whole (what keeping a result verbatim costs);
    - stubs: stubs, written and read (what a stub's size costs);
    - rewrite: whole messages written again (those after a newly stubbed result, a fold's);
    - summary: summaries written and read, and the summariser calls.

    `uncached_tail`: a result sent whole for the first time and stubbed by the next
    request is sent uncached (input price) rather than written, as the proxy does when
    it drops the client's breakpoint on it (`Rewrite.uncached_tail`); the rest as above.
    """
    prices = prices or Prices()
    sums = _Sums(shape, rules)
    offloadable = set(sums.offloadable)
    parts = dict.fromkeys(PARTS, 0.0)
    before: list[tuple[str, int, int]] = []
    fixed_before, f_before, sent = 0, 0, set()
    later = [*states[1:], None]
    for req, (f, k), after in zip(shape.requests, states, later, strict=True):
        stubbed = set(sums.offloadable[sums.below[f] : k])
        # results the next request stubs: never read whole from the cache
        going = set(sums.offloadable[k : after[1]]) if uncached_tail and after else set()
        items: list[tuple[str, int, int]] = [("summary", f, sums.summary(f))] if f else []
        for i in range(f, req.messages):
            whole = i not in stubbed
            items.append(("whole" if whole else "stub", i, shape.messages[i].tokens if whole
                          else shape.messages[i].stubbed))  # fmt: skip
        # system and tools: read as far as the previous request sent them (what they add
        # is written, and, as in `cheapest`, does not move what follows out of the cache)
        parts["fixed"] += min(fixed_before, req.fixed) * prices.read
        parts["fixed"] += max(0, req.fixed - fixed_before) * prices.write
        shared = True
        if f > f_before:  # a fold: the summariser reads the conversation up to it
            into = req.fixed + sums.summary(f_before)
            into += sums.stubbed_prefix[f] - sums.stubbed_prefix[f_before]
            parts["summary"] += into * prices.read + sums.summary(f) * prices.output
            shared = False
        for n, (form, i, tokens) in enumerate(items):
            shared = shared and n < len(before) and before[n] == (form, i, tokens)
            if form == "summary":
                parts["summary"] += tokens * (prices.read if shared else prices.write)
            elif form == "stub":
                parts["stubs"] += tokens * (prices.read if shared else prices.write)
            elif shared:
                parts["kept" if i in offloadable else "context"] += tokens * prices.read
            else:
                price = prices.input if i in going and i not in sent else prices.write
                parts["rewrite" if i in sent else "new"] += tokens * price
                sent.add(i)
        parts["output"] += req.output * prices.output
        before, fixed_before, f_before = items, req.fixed, f
    return parts


def rules_for(policy: Policy) -> Rules:
    """The floor's rules for a policy: its window, keep_last, keep_results (within
    keep_results_tokens) and summary
    size (the proxy's summary_tokens at the cap, less the facts budget:
    proxy/core/summariser_input.py)."""
    from proxy.core.summariser_input import FACTS_MAX, FACTS_MIN

    cap = policy.summary_max_tokens
    facts = min(FACTS_MAX, max(FACTS_MIN, cap // 5))
    return Rules(
        window=policy.window,
        keep_last=policy.keep_last,
        keep_results=max(1, policy.keep_results),
        keep_tokens=policy.keep_results_tokens,
        summary_tokens=max(cap - facts, cap // 2),
    )


def _plain(value: Any) -> Any:
    """A message without cache_control, a one-text-block list as its string."""
    if isinstance(value, dict):
        return {k: _plain(v) for k, v in value.items() if k != "cache_control"}
    if isinstance(value, list):
        items = [_plain(v) for v in value]
        one = items[0] if len(items) == 1 else None
        if isinstance(one, dict) and set(one) == {"type", "text"} and one["type"] == "text":
            return one["text"]
        return items
    return value


def _stubbed(message: Mapping[str, Any], policy: Policy, counter: TokenCounter) -> dict[str, Any]:
    content = message.get("content")
    if message.get("role") != "user" or not isinstance(content, list):
        return dict(message)
    blocks = []
    for block in content:
        text = result_text(block) if isinstance(block, dict) else None
        if (
            isinstance(block, dict)
            and block.get("type") == "tool_result"
            and text is not None
            and counter.count_text(text) > policy.offload_threshold
        ):
            stub = stub_text(text, ref_for(text), "read_result", policy.stub_head_chars,
                             policy.read_length)  # fmt: skip
            block = {**block, "content": stub}
        blocks.append(block)
    return {**message, "content": blocks}


def shape_of(bodies: Sequence[Mapping[str, Any]], counter: TokenCounter, policy: Policy) -> Shape:
    """The shape of an append-only Anthropic Messages trace, counted with `counter`;
    offloadable results and stub sizes by `policy`."""
    if not bodies:
        raise ValueError("no requests")
    final = list(bodies[-1].get("messages") or [])
    plain = [_plain(m) for m in final]
    messages = []
    for i, m in enumerate(final):
        tokens = counter.count_message(m)
        stubbed = min(tokens, counter.count_message(_stubbed(m, policy, counter)))
        content = m.get("content")
        has_result = isinstance(content, list) and any(
            isinstance(b, dict) and b.get("type") == "tool_result" for b in content
        )
        start = i == 0 or m.get("role") == "assistant"
        messages.append(Message(tokens, stubbed, start, has_result))
    requests = []
    sums_tokens = [0]
    for m in messages:
        sums_tokens.append(sums_tokens[-1] + m.tokens)
    outputs: list[int] = []
    for n, body in enumerate(bodies):
        ms = list(body.get("messages") or [])
        if len(ms) > len(final) or [_plain(m) for m in ms] != plain[: len(ms)]:
            raise ValueError(f"request {n + 1} does not extend the one before: not append-only")
        fixed = max(0, counter.count_request(dict(body)) - sums_tokens[len(ms)])
        nxt = final[len(ms)] if len(ms) < len(final) else None
        out = -1
        if n + 1 < len(bodies) and nxt is not None and nxt.get("role") == "assistant":
            out = counter.count_content(nxt.get("content"))
        elif n + 1 < len(bodies):
            out = 0
        outputs.append(out)
        requests.append(Request(len(ms), fixed, out))
    known = [o for o in outputs if o >= 0]
    mean = round(sum(known) / len(known)) if known else 0
    requests = [r if r.output >= 0 else Request(r.messages, r.fixed, mean) for r in requests]
    return Shape(tuple(messages), tuple(requests))
