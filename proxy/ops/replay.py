"""`compaction-proxy replay TRACE`: a saved conversation billed with and without the proxy.

Each request of the trace goes two ways, in memory: as the client sent it, and as the
proxy would send it (proxy/ops/simulate.py: the pure planner, checkpoints kept between
requests, a placeholder summary of the summary's cap in size), in the trace's wire format (given,
or its first request's: proxy/ops/formats.py). Both are counted with the prompt-cache
model of that format's stand-in (proxy/testing/cache.py; api_chat.prompt_units for
Chat Completions, responses_items.ItemCounter for Responses), each with its own cache, on
a clock that advances a fixed time per turn, and priced by proxy/core/pricing.py: in a
currency when `[[price]]` tables price every model involved, else in the cache model's
relative units (uncached input 1.0, cache write 1.25, 1-hour write 2.0, cache read 0.1,
output 5.0 per token). A summary the
proxy makes costs one more call: its prompt uncached and its output at the cap (an upper
bound). A turn's output is the assistant message the next request adds (the last turn:
the mean of the others); it is the same both ways.

Without the proxy, a request larger than the model's window is refused by the API ("prompt
is too long"): it is marked refused, billed nothing and caches nothing, and totals compare
like with like (the proxy's cost over the turns that were possible without it).

Not simulated: read_result rounds (the model's choice, which a trace of requests does not
hold; each would add a call: `Simulator.read_rounds` replays them given a model), and
calibration (the local count is taken as the real one).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

from proxy.core.policy import Policy
from proxy.core.pricing import CACHE_MODEL, PER_MILLION, PriceTable, Rates
from proxy.core.strategy import Strategy, strategy_word
from proxy.core.tokens import TokenCounter
from proxy.core.wire_format import WireFormat
from proxy.ops.formats import format_for
from proxy.ops.progress import Progress
from proxy.ops.simulate import Simulator, Step, Summarise
from proxy.testing.api_chat import prompt_units as chat_prompt_units
from proxy.testing.cache import CacheUsage, PromptCache, Unit, prompt_units
from proxy.testing.responses_items import ItemCounter
from proxy.wire import ANTHROPIC, CHAT, RESPONSES
from proxy.wire.chat import ChatCounter
from proxy.wire.responses_units import input_items, units_of

SECONDS_PER_TURN = 10.0  # well inside the cache's 5-minute lifetime, as an agent runs


def _cost(rates: Rates, usage: CacheUsage, output_tokens: int) -> float:
    return rates.cost({**usage.as_usage(), "output_tokens": output_tokens})


@dataclass(frozen=True, slots=True)
class Turn:
    n: int
    direct_tokens: int  # the whole request as the client sent it
    proxy_tokens: int  # ... and as the proxy would send it
    direct: CacheUsage
    proxied: CacheUsage
    output_tokens: int
    direct_cost: float
    proxy_cost: float  # the summariser call included
    summariser_cost: float
    strategy: Strategy | None  # the rewrite's (CHECKPOINT: reapplied); None: untouched
    summary_made: bool
    window: int  # the policy's window

    @property
    def strategy_word(self) -> str:
        return strategy_word(self.strategy, refused=False)

    @property
    def direct_refused(self) -> bool:
        """Without the proxy the API refuses this request: it is over the window."""
        return self.direct_tokens > self.window


@dataclass(slots=True)
class Replay:
    turns: list[Turn] = field(default_factory=list)
    policy: Policy | None = None
    unit: str = "units"  # of every cost: a currency, or the cache model's relative units
    price_note: str = ""  # which prices were used, for people

    @property
    def direct_cost(self) -> float:
        """Without the proxy: the requests the API would take (refused ones cost nothing)."""
        return sum(t.direct_cost for t in self.turns if not t.direct_refused)

    @property
    def proxy_cost(self) -> float:
        return sum(t.proxy_cost for t in self.turns)

    @property
    def proxy_cost_where_possible(self) -> float:
        """With the proxy, over the turns the API would also take without it."""
        return sum(t.proxy_cost for t in self.turns if not t.direct_refused)

    @property
    def crossings(self) -> list[Turn]:
        return [t for t in self.turns if t.strategy is not None and t.strategy.crossing]

    @property
    def summariser_calls(self) -> int:
        return sum(1 for t in self.turns if t.summary_made)

    def cache_read_share(self, proxied: bool) -> float:
        usages = [t.proxied if proxied else t.direct for t in self.turns]
        read = sum(u.cache_read_input_tokens for u in usages)
        total = sum(
            u.input_tokens + u.cache_read_input_tokens + u.cache_creation_input_tokens
            for u in usages
        )
        return read / total if total else 0.0

    @property
    def direct_over_window(self) -> int:
        return sum(1 for t in self.turns if t.direct_tokens > t.window)

    @property
    def proxy_over_window(self) -> int:
        return sum(1 for t in self.turns if t.proxy_tokens > t.window)


def _with_next(items: Iterable[dict[str, Any]]) -> Iterator[tuple[dict[str, Any], Any]]:
    """Each request with the one after it (None for the last)."""
    it = iter(items)
    current = next(it, None)
    while current is not None:
        following = next(it, None)
        yield current, following
        current = following


def _output_of(body: dict[str, Any], following: dict[str, Any] | None, pricing: _Pricing) -> int:
    """Tokens of the assistant message the next request adds after this one's history
    (in Chat its tool_calls too: they are output; in Responses every model item)."""
    if following is None:
        return -1
    if pricing.output is not None:
        return pricing.output(body, following)
    counter, chat = pricing.counter, pricing.chat
    n = len(body.get("messages") or [])
    later = following.get("messages") or []
    if len(later) > n and isinstance(later[n], dict) and later[n].get("role") == "assistant":
        if chat:
            return int(ChatCounter(counter).count_message(later[n]))
        return counter.count_content(later[n].get("content"))
    return 0


@dataclass(frozen=True, slots=True)
class _Pricing:
    """How the stand-in of a format counts and caches a prompt."""

    chat: bool
    count: Callable[[dict[str, Any]], int]
    units: Callable[[dict[str, Any]], list[Unit]]
    counter: TokenCounter
    # The output tokens between two requests, when the format has its own way to read them.
    output: Callable[[dict[str, Any], dict[str, Any]], int] | None = None


def _pricing(fmt: WireFormat, counter: TokenCounter) -> _Pricing:
    if fmt.name == CHAT.name:
        chat_counter = ChatCounter(counter)
        return _Pricing(
            True, chat_counter.count_request, lambda b: chat_prompt_units(b, chat_counter), counter
        )
    if fmt.name == RESPONSES.name:
        items = ItemCounter(counter, b"")
        return _Pricing(
            False,
            items.count_request,
            items.prompt_units,
            counter,
            lambda body, following: _responses_output(body, following, items),
        )
    return _Pricing(False, counter.count_request, lambda b: prompt_units(b, counter), counter)


def _responses_output(body: dict[str, Any], following: dict[str, Any], items: ItemCounter) -> int:
    """The model's items the next request adds after this one's input (up to the first
    item the client wrote)."""
    before, after = input_items(body), input_items(following)
    total = 0
    for item in after[len(before) :]:
        if units_of([item])[0]["unit"] != "turn":  # an output or a message of the client's
            break
        total += items.count_item(item)
    return total


def _summariser_usage(
    calls: Sequence[Summarise | None], cache: PromptCache, pricing: _Pricing
) -> list[tuple[CacheUsage, int]]:
    """The summariser calls' usage (input, output at the summary_tokens), through the proxy's
    cache: a summary made in place shares the conversation's cached prefix, as upstream."""
    out = []
    for s in calls:
        if s is None or s.reused:
            continue
        if s.request is None:
            out.append((CacheUsage(s.input_tokens, 0, 0, creation_1h=False), s.summary_tokens))
        else:
            out.append(
                (
                    cache.account("replay", pricing.units(s.request), s.input_tokens),
                    s.summary_tokens,
                )
            )
    return out


def _choose_rates(models: Iterable[str], prices: PriceTable) -> tuple[dict[str, Rates], str]:
    """Rates per model and a note saying which: the `[[price]]` tables' when they price
    every model in one currency, else the cache model's units for all (costs in two
    units, or some priced and some not, could not be added up)."""
    models = sorted(set(models))
    found = {m: prices.rates_for(m) for m in models}
    priced = {m: r for m, r in found.items() if r is not None}
    units = {r.unit for r in priced.values()}
    relative = (
        "relative units: uncached input token = 1, cache write 1.25 (1-hour 2),"
        " cache read 0.1, output 5"
    )
    if not prices.prices:
        return {m: CACHE_MODEL for m in models}, relative
    if len(priced) < len(models):
        missing = ", ".join(m for m in models if m not in priced)
        return {m: CACHE_MODEL for m in models}, f"{relative} (no [[price]] for {missing})"
    if len(units) > 1:
        return {m: CACHE_MODEL for m in models}, f"{relative} (prices in {', '.join(units)})"
    per_million = "; ".join(
        f"{m}: input {r.input * PER_MILLION:g}, cache write {r.cache_write * PER_MILLION:g},"
        f" cache read {r.cache_read * PER_MILLION:g}, output {r.output * PER_MILLION:g}"
        for m, r in priced.items()
    )
    return priced, f"{units.pop()} per million tokens from [[price]]: {per_million}"


def replay(
    bodies: Iterable[dict[str, Any]],
    policies: Sequence[Policy],
    counter: TokenCounter,
    progress: Progress | None = None,
    fmt: WireFormat | None = None,
    prices: PriceTable | None = None,
    betas: str = "",
) -> Replay:
    """`fmt` None: the first request's (proxy/ops/formats.py). `prices`: the `[[price]]`
    tables (none: the cache model's relative units). `betas`: the requests'
    `anthropic-beta`, as recorded (the 1M window, tool search)."""
    now = [0.0]
    direct_cache = PromptCache(clock=lambda: now[0])
    proxy_cache = PromptCache(clock=lambda: now[0])
    result = Replay()
    pending: list[_Pending] = []
    outputs: list[int] = []
    simulator: Simulator | None = None
    pricing = _pricing(ANTHROPIC, counter)
    for n, (body, following) in enumerate(_with_next(bodies)):
        if simulator is None:
            fmt = fmt or format_for("auto", body)
            simulator = Simulator(policies, counter, fmt=fmt, betas=betas)
            pricing = _pricing(fmt, counter)
        now[0] += SECONDS_PER_TURN
        step = simulator.step(body)
        result.policy = result.policy or step.policy
        direct_total = pricing.count(body)
        if direct_total > step.policy.window:  # refused by the API: nothing read or cached
            direct = CacheUsage(0, 0, 0, creation_1h=False)
        else:
            direct = direct_cache.account("replay", pricing.units(body), direct_total)
        sent = step.body
        proxy_total = direct_total if sent is body else pricing.count(sent)
        # The fold's summary is asked before the request goes out; one made ahead, after.
        summaries = _summariser_usage([step.summary], proxy_cache, pricing)
        proxied = proxy_cache.account("replay", pricing.units(sent), proxy_total)
        summaries += _summariser_usage([step.made_ahead], proxy_cache, pricing)
        output = _output_of(body, following, pricing)
        if output >= 0:
            outputs.append(output)
        model = str(body.get("model", ""))
        pending.append(
            _Pending(n, direct_total, proxy_total, direct, proxied, step, output, model, summaries)
        )
        if progress is not None:
            progress.advance(strategy_word(step.strategy, refused=False) or "untouched")
    models = [p.model for p in pending] + [p.summariser_model for p in pending if p.summaries]
    rates, result.price_note = _choose_rates(models, prices or PriceTable())
    result.unit = next(iter(rates.values())).unit if rates else CACHE_MODEL.unit
    mean_output = round(sum(outputs) / len(outputs)) if outputs else 0
    for p in pending:
        output = p.output if p.output >= 0 else mean_output
        summariser = rates[p.summariser_model]
        extra = sum(_cost(summariser, usage, out) for usage, out in p.summaries)
        result.turns.append(
            Turn(
                n=p.n + 1,
                direct_tokens=p.direct_total,
                proxy_tokens=p.proxy_total,
                direct=p.direct,
                proxied=p.proxied,
                output_tokens=output,
                direct_cost=_cost(rates[p.model], p.direct, output),
                proxy_cost=_cost(rates[p.model], p.proxied, output) + extra,
                summariser_cost=extra,
                strategy=p.step.strategy,
                summary_made=bool(p.summaries),
                window=p.step.policy.window,
            )
        )
    return result


@dataclass(frozen=True, slots=True)
class _Pending:
    """A turn counted but not yet priced (prices need every model of the trace)."""

    n: int
    direct_total: int
    proxy_total: int
    direct: CacheUsage
    proxied: CacheUsage
    step: Step
    output: int  # -1: the last turn, whose output is unknown
    model: str
    summaries: list[tuple[CacheUsage, int]]  # summariser calls: usage, output tokens

    @property
    def summariser_model(self) -> str:
        return self.step.policy.summariser_model or self.model


def money(value: float, unit: str) -> str:
    """A cost with its unit: relative units whole, a currency to the cent (or finer when
    the whole amount is below one)."""
    if unit == CACHE_MODEL.unit:
        return f"{value:,.0f} units"
    return f"{value:,.2f} {unit}" if value >= 1 else f"{value:,.4f} {unit}"


def summary_lines(result: Replay) -> list[str]:
    p = result.policy
    turns = result.turns
    unit = result.unit
    refused = [t for t in turns if t.direct_refused]
    possible = len(turns) - len(refused)
    with_all = money(result.proxy_cost, unit)
    lines = [
        f"turns: {len(turns)}"
        + (
            f"; policy {p.match!r}: window {p.window:,}, trigger {p.trigger_tokens:,},"
            f" target {p.target_tokens:,} tokens"
            if p
            else ""
        ),
        f"prices: {result.price_note}",
    ]
    if refused:
        lines.append(
            f"billed without the proxy: {money(result.direct_cost, unit)} for the {possible}"
            f" requests the API would take; {len(refused)} are over the window"
            f" (first: turn {refused[0].n}), which the API refuses (prompt is too long),"
            " so they are not billed: without the proxy the agent stops there"
        )
        where = result.proxy_cost_where_possible
        ratio = where / result.direct_cost if result.direct_cost else 0.0
        lines.append(
            f"billed with the proxy:    {with_all} for all {len(turns)} turns;"
            f" {money(where, unit)} ({ratio:.2f}x) for the same {possible} turns"
        )
    else:
        ratio = result.proxy_cost / result.direct_cost if result.direct_cost else 0.0
        lines.append(f"billed without the proxy: {money(result.direct_cost, unit)}")
        lines.append(f"billed with the proxy:    {with_all} ({ratio:.2f}x)")
    lines += [
        f"summariser calls: {result.summariser_calls}"
        f" ({money(sum(t.summariser_cost for t in turns), unit)}, in the cost with the proxy)",
        f"input read from cache: {100 * result.cache_read_share(False):.1f}% without,"
        f" {100 * result.cache_read_share(True):.1f}% with the proxy",
        f"largest request: {max((t.direct_tokens for t in turns), default=0):,} tokens without,"
        f" {max((t.proxy_tokens for t in turns), default=0):,} tokens with the proxy",
        f"requests over the window: {result.direct_over_window} without (refused by the API),"
        f" {result.proxy_over_window} with the proxy",
        f"crossings: {_crossings(result.crossings)}",
    ]
    return lines


def _crossings(turns: Sequence[Turn]) -> str:
    """The turns that made a new rewrite, by strategy: "offload at turns 11-17, 19;
    offload+summary at turn 18"."""
    by_strategy: dict[str, list[int]] = {}
    for t in turns:
        by_strategy.setdefault(t.strategy_word, []).append(t.n)
    parts = []
    for strategy, ns in by_strategy.items():
        runs: list[list[int]] = []
        for n in ns:
            if runs and n == runs[-1][-1] + 1:
                runs[-1].append(n)
            else:
                runs.append([n])
        spans = ", ".join(f"{r[0]}-{r[-1]}" if len(r) > 1 else str(r[0]) for r in runs)
        parts.append(f"{strategy} at turn{'s' if len(ns) > 1 else ''} {spans}")
    return "; ".join(parts) or "none"
