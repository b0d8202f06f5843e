"""`compaction-proxy replay TRACE`: a saved conversation billed with and without the proxy.

Each request of the trace goes two ways, in memory: as the client sent it, and as the
proxy would send it (proxy/ops/simulate.py: the pure planner, checkpoints kept between
requests, a placeholder summary of the slot's size), in the trace's wire format (given,
or its first request's: proxy/ops/formats.py). Both are priced with the prompt-cache model
of that format's stand-in (proxy/testing/cache.py; chat_standin.prompt_units for Chat
Completions, responses_items.ItemCounter for Responses), each with its own cache, on a clock that
advances a fixed time per turn: uncached input 1.0, cache write 1.25, cache read 0.1,
output 5.0 per token. A summary the proxy makes costs one more call: its prompt uncached
and its output at the cap (an upper bound). A turn's output is the assistant message the
next request adds (the last turn: the mean of the others); it is the same both ways.
The run without the proxy is priced as if the model's window had no limit.

Not simulated: read_result rounds (the model's choice; each would add a call), and
calibration (the local count is taken as the real one).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

from proxy.core.policy import Policy
from proxy.core.tokens import TokenCounter
from proxy.core.wire_format import WireFormat
from proxy.ops.formats import format_for
from proxy.ops.progress import Progress
from proxy.ops.simulate import Simulator, Step
from proxy.testing.cache import CacheUsage, PromptCache, Unit, prompt_units
from proxy.testing.chat_standin import prompt_units as chat_prompt_units
from proxy.testing.responses_items import ItemCounter
from proxy.wire import ANTHROPIC, CHAT, RESPONSES
from proxy.wire.chat import ChatCounter
from proxy.wire.responses_units import input_items, units_of

PRICES = {"input": 1.0, "write": 1.25, "read": 0.1, "output": 5.0}
SECONDS_PER_TURN = 10.0  # well inside the cache's 5-minute lifetime, as an agent runs


def price(usage: CacheUsage, output_tokens: int) -> float:
    return (
        usage.input_tokens * PRICES["input"]
        + usage.cache_creation_input_tokens * PRICES["write"]
        + usage.cache_read_input_tokens * PRICES["read"]
        + output_tokens * PRICES["output"]
    )


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
    strategy: str  # "" untouched, "checkpoint", or the crossing's strategy
    summary_made: bool
    window: int  # the policy's window


@dataclass(slots=True)
class Replay:
    turns: list[Turn] = field(default_factory=list)
    policy: Policy | None = None

    @property
    def direct_cost(self) -> float:
        return sum(t.direct_cost for t in self.turns)

    @property
    def proxy_cost(self) -> float:
        return sum(t.proxy_cost for t in self.turns)

    @property
    def crossings(self) -> list[Turn]:
        return [t for t in self.turns if t.strategy not in ("", "checkpoint")]

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


def _summariser_cost(step: Step) -> float:
    s = step.summary
    if s is None or s.reused:
        return 0.0
    return s.input_tokens * PRICES["input"] + s.slot * PRICES["output"]


def replay(
    bodies: Iterable[dict[str, Any]],
    policies: Sequence[Policy],
    counter: TokenCounter,
    progress: Progress | None = None,
    fmt: WireFormat | None = None,
) -> Replay:
    """`fmt` None: the first request's (proxy/ops/formats.py)."""
    now = [0.0]
    direct_cache = PromptCache(clock=lambda: now[0])
    proxy_cache = PromptCache(clock=lambda: now[0])
    result = Replay()
    pending: list[tuple[int, int, int, CacheUsage, CacheUsage, Step, int]] = []
    outputs: list[int] = []
    simulator: Simulator | None = None
    pricing = _pricing(ANTHROPIC, counter)
    for n, (body, following) in enumerate(_with_next(bodies)):
        if simulator is None:
            fmt = fmt or format_for("auto", body)
            simulator = Simulator(policies, counter, fmt=fmt)
            pricing = _pricing(fmt, counter)
        now[0] += SECONDS_PER_TURN
        step = simulator.step(body)
        result.policy = result.policy or step.policy
        direct_total = pricing.count(body)
        direct = direct_cache.account("replay", pricing.units(body), direct_total)
        sent = step.body
        proxy_total = direct_total if sent is body else pricing.count(sent)
        proxied = proxy_cache.account("replay", pricing.units(sent), proxy_total)
        output = _output_of(body, following, pricing)
        if output >= 0:
            outputs.append(output)
        pending.append((n, direct_total, proxy_total, direct, proxied, step, output))
        if progress is not None:
            progress.advance(step.strategy or "untouched")
    mean_output = round(sum(outputs) / len(outputs)) if outputs else 0
    for n, direct_total, proxy_total, direct, proxied, step, output in pending:
        output = output if output >= 0 else mean_output
        extra = _summariser_cost(step)
        result.turns.append(
            Turn(
                n=n + 1,
                direct_tokens=direct_total,
                proxy_tokens=proxy_total,
                direct=direct,
                proxied=proxied,
                output_tokens=output,
                direct_cost=price(direct, output),
                proxy_cost=price(proxied, output) + extra,
                summariser_cost=extra,
                strategy=step.strategy,
                summary_made=step.summary is not None and not step.summary.reused,
                window=step.policy.window,
            )
        )
    return result


def summary_lines(result: Replay) -> list[str]:
    ratio = result.proxy_cost / result.direct_cost if result.direct_cost else 0.0
    p = result.policy
    turns = result.turns
    lines = [
        f"turns: {len(turns)}"
        + (
            f"; policy {p.match!r}: window {p.window:,}, trigger {p.trigger_tokens:,},"
            f" target {p.target_tokens:,}"
            if p
            else ""
        ),
        f"billed without the proxy: {result.direct_cost:,.0f}",
        f"billed with the proxy:    {result.proxy_cost:,.0f} ({ratio:.2f}x), summariser"
        f" calls {result.summariser_calls} ({sum(t.summariser_cost for t in turns):,.0f})",
        f"input read from cache: {100 * result.cache_read_share(False):.1f}% without,"
        f" {100 * result.cache_read_share(True):.1f}% with the proxy",
        f"largest request: {max((t.direct_tokens for t in turns), default=0):,} tokens without,"
        f" {max((t.proxy_tokens for t in turns), default=0):,} with the proxy",
        f"requests over the window: {result.direct_over_window} without,"
        f" {result.proxy_over_window} with the proxy",
        "crossings: "
        + (", ".join(f"turn {t.n} ({t.strategy})" for t in result.crossings) or "none"),
    ]
    return lines
