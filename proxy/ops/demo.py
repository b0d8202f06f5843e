"""`compaction-proxy demo`: watch the proxy compact a conversation, with no API key.

Everything runs in this process, on free loopback ports: the stand-in upstream (both APIs),
the proxy with the embedded Redis in a temporary state directory and a small policy (a
24,000-token window, so compaction comes within a few turns instead of 60,000 tokens),
and the scripted coding agent (proxy/testing/agent.py) through the real anthropic SDK, or
the openai SDK with `--api chat`. Each turn prints one line: what the proxy did, the
history tokens before and after, and the share of the prompt read from the upstream's
cache. At the end the requests the agent sent are replayed (as `compaction-proxy replay`
does) into the HTML report, with and without the proxy.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import sys
import tempfile
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TextIO

import orjson

from proxy.config import ServerSettings, Settings, StoreSettings, UpstreamSettings
from proxy.console import fail
from proxy.core import facts
from proxy.core.offload import ref_for, refs_in
from proxy.core.policy import Policy
from proxy.core.tokens import default_counter
from proxy.core.wire_format import Dialect
from proxy.ops.progress import Progress
from proxy.wire import ANTHROPIC, CHAT

# A small window, so compaction comes within a few turns; the rest is the built-in policy.
DEMO_POLICY: dict[str, Any] = {"match": "*", "window": 24_000, "trigger": 12_000, "target": 5_000}
RESULT_CHARS = 3_000  # each tool result: a build log of about 1,200 tokens
MODELS = {"messages": "claude-sonnet-4-6", "chat": "gpt-5-mini"}
API_PATHS = ("/v1/messages", "/v1/chat/completions")
PURPOSE = "x-compaction-proxy-purpose"  # the header of the proxy's own calls (a summary)
PACE = 0.15  # seconds between turns on a terminal: the stand-in answers in milliseconds


def add_command(commands: Any) -> None:
    demo = commands.add_parser(
        "demo",
        help="watch the proxy compact a scripted agent's conversation (no API key needed)",
        description="Start the stand-in upstream and the proxy (free ports, embedded Redis"
        " in a temporary directory, a small demo policy), drive a scripted coding agent"
        " through them with one line per turn, and write the replay report.",
    )
    demo.add_argument("--turns", type=int, default=30, help="agent turns (default 30)")
    demo.add_argument(
        "--api",
        choices=("messages", "chat"),
        default="messages",
        help="messages: the anthropic SDK (default); chat: the openai SDK, Chat Completions",
    )
    demo.add_argument(
        "--out", type=Path, default=Path("demo-report.html"), help="the report (HTML)"
    )
    demo.add_argument(
        "--pace",
        type=float,
        help=f"seconds to pause after each turn (default {PACE} on a terminal, else 0)",
    )
    demo.set_defaults(ops_run=run_demo)


@dataclass
class Observed:
    """What the client saw, turn by turn, and the request bodies it sent."""

    bodies: list[dict[str, Any]] = field(default_factory=list)
    strategies: list[str] = field(default_factory=list)
    prompt_tokens: int = 0
    cached_tokens: int = 0

    async def capture(self, request: Any) -> None:
        """An httpx event hook: keep each API request's body as the proxy received it."""
        if request.method == "POST" and request.url.path in API_PATHS:
            self.bodies.append(orjson.loads(request.content))

    def record(self, headers: dict[str, str], usage: dict[str, int]) -> None:
        self.strategies.append(headers.get("x-compaction-strategy", "untouched"))
        self.prompt_tokens += usage["input"] + usage["read"] + usage["write"]
        self.cached_tokens += usage["read"]

    def by_strategy(self) -> str:
        """How many turns each strategy had, in order of first use; the turns themselves
        for a strategy that came at most three times (a summary, a pack)."""
        turns: dict[str, list[int]] = {}
        for n, strategy in enumerate(self.strategies, 1):
            turns.setdefault(strategy, []).append(n)
        return ", ".join(
            f"{s} {len(ns)}" + (f" (turn {', '.join(map(str, ns))})" if len(ns) <= 3 else "")
            for s, ns in turns.items()
        )


def turn_line(n: int, turns: int, headers: dict[str, str], usage: dict[str, int]) -> str:
    """One turn: what the proxy did, history tokens before and after, cache-read share."""
    strategy = headers.get("x-compaction-strategy", "untouched")
    prompt = usage["input"] + usage["read"] + usage["write"]
    share = 100 * usage["read"] / prompt if prompt else 0.0
    if "x-compaction-tokens-before" in headers:
        before = int(headers["x-compaction-tokens-before"])
        after = int(headers.get("x-compaction-tokens-after", before))
        history = f"history {before:>6,} -> {after:>6,} tokens"
    else:
        history = f"{'(under the trigger)':>30}"
    width = len(str(turns))
    return (
        f"turn {n:>{width}}/{turns}  {strategy:<16} {history}  prompt {prompt:>6,} tokens,"
        f" {share:3.0f}% read from cache"
    )


def _anthropic_usage(message: Any) -> dict[str, int]:
    u = message.usage
    return {
        "input": u.input_tokens,
        "read": u.cache_read_input_tokens or 0,
        "write": u.cache_creation_input_tokens or 0,
    }


def _chat_usage(completion: Any) -> dict[str, int]:
    u = completion.usage
    details = u.prompt_tokens_details
    read = (details.cached_tokens or 0) if details else 0
    return {"input": u.prompt_tokens - read, "read": read, "write": 0}


async def _drive(
    api: str,
    proxy_url: str,
    turns: int,
    observed: Observed,
    on_turn: Callable[[dict[str, str], dict[str, int]], None],
    pace: float,
) -> None:
    import anthropic
    import openai

    from proxy.testing.agent import run_agent
    from proxy.testing.agent_openai import run_openai_agent

    hooks = {"request": [observed.capture]}
    if api == "chat":
        chat = openai.AsyncOpenAI(
            base_url=proxy_url + "/v1",
            api_key="demo-key",
            max_retries=0,
            http_client=openai.DefaultAsyncHttpxClient(event_hooks=hooks),
        )

        async def on_chat_turn(_: int, turn: Any) -> None:
            on_turn(turn.headers, _chat_usage(turn.completion))
            await asyncio.sleep(pace)

        async with chat:
            await run_openai_agent(
                chat,
                turns=turns,
                result_chars=RESULT_CHARS,
                model=MODELS[api],
                on_turn=on_chat_turn,
            )
        return
    client = anthropic.AsyncAnthropic(
        base_url=proxy_url,
        api_key="demo-key",
        max_retries=0,
        http_client=anthropic.DefaultAsyncHttpxClient(event_hooks=hooks),
    )

    async def on_message_turn(_: int, turn: Any) -> None:
        on_turn(turn.headers, _anthropic_usage(turn.message))
        await asyncio.sleep(pace)

    async with client:
        await run_agent(
            client,
            turns=turns,
            result_chars=RESULT_CHARS,
            model=MODELS[api],
            on_turn=on_message_turn,
        )


async def demo(api: str, turns: int, out: Path, stream: TextIO, pace: float = 0.0) -> Observed:
    from proxy.server.app import start
    from proxy.server.state import STORE
    from proxy.testing.standin import RECORDED, StandInOptions
    from proxy.testing.standin import start as start_standin

    def say(line: str = "") -> None:
        print(line, file=stream, flush=True)

    with tempfile.TemporaryDirectory(prefix="compaction-proxy-demo-") as state_dir:
        standin, standin_url = await start_standin(
            "127.0.0.1", 0, StandInOptions(windows={"*": DEMO_POLICY["window"]})
        )
        try:
            settings = Settings(
                server=ServerSettings(port=0),
                upstream=UpstreamSettings(url=standin_url, openai_url=standin_url),
                store=StoreSettings(state_dir=state_dir),
                policies=(DEMO_POLICY,),
            )
            proxy = await start(settings)
        except BaseException:
            await standin.cleanup()
            raise
        try:
            store = proxy.app[STORE].embedded
            where = f"embedded Redis in {store.state_dir}" if store else "none"
            say(f"stand-in upstream (Messages and OpenAI APIs, any key): {standin_url}")
            say(f"proxy: {proxy.url}, store: {where}")
            for line in _setup_lines(api, turns):
                say(line)
            progress = Progress(turns, "demo")
            observed = Observed()

            def on_turn(headers: dict[str, str], usage: dict[str, int]) -> None:
                observed.record(headers, usage)
                n = len(observed.strategies)
                progress.print_above(turn_line(n, turns, headers, usage), stream)
                progress.advance(observed.strategies[-1])

            try:
                await _drive(api, proxy.url, turns, observed, on_turn, pace)
            finally:
                progress.close()
            recorded = standin.app[RECORDED]
            sent = _last_sent(recorded)
        finally:
            await proxy.stop()
            await standin.cleanup()
    _report(api, observed, out, say, sent)
    return observed


def _last_sent(recorded: Sequence[Any]) -> list[Any]:
    """The messages of the last agent request the stand-in answered (not a summariser's
    call, not the proxy's read_result rounds' continuations: the last one is the turn's)."""
    for r in reversed(recorded):
        if r.path_qs.split("?")[0] in API_PATHS and not r.headers.get(PURPOSE):
            messages = orjson.loads(r.body).get("messages")
            return messages if isinstance(messages, list) else []
    return []


def _demo_policies() -> list[Policy]:
    return list(Settings(policies=(DEMO_POLICY,)).model_policies)


def _setup_lines(api: str, turns: int) -> list[str]:
    p = _demo_policies()[0]
    sdk = "openai SDK (Chat Completions)" if api == "chat" else "anthropic SDK (Messages)"
    return [
        f"demo policy: window {p.window:,}, trigger {p.trigger_tokens:,}, target"
        f" {p.target_tokens:,} history tokens; tool results over {p.offload_threshold:,}"
        " tokens may be offloaded",
        f"agent: {turns} turns of a scripted coding agent through the {sdk}, model"
        f" {MODELS[api]}; each turn answers a Bash call with a {RESULT_CHARS:,}-character"
        " build log",
        "",
    ]


@dataclass(frozen=True, slots=True)
class FactsKept:
    """The facts of a conversation (identifiers of a rare shape, proxy/core/facts.py) and
    where its last request upstream has them: in its messages, or behind a ref it names."""

    facts: tuple[str, ...]
    kept: tuple[str, ...]
    readable: tuple[str, ...]
    identifiers: int = 0  # every identifier of the conversation, template values too
    identifiers_kept: int = 0  # ... in the last request's messages

    def line(self) -> str:
        behind = f", {len(self.readable)} more through a ref it names" if self.readable else ""
        lost = [f for f in self.facts if f not in self.kept and f not in self.readable]
        shown = ", ".join(lost[:5]) + (", ..." if len(lost) > 5 else "")
        return (
            f"facts of the conversation (identifiers of a rare shape) in the last request"
            f" the proxy sent: {len(self.kept)} of {len(self.facts)}{behind}"
            + (f" (not kept: {shown})" if lost else "")
            + f"; all identifiers, template values too: {self.identifiers_kept}"
            f" of {self.identifiers}"
        )


def facts_kept(client: Sequence[Any], sent: Sequence[Any], fmt: Dialect) -> FactsKept:
    """What of the conversation the agent holds (`client`, its last request's messages)
    the last request the proxy sent upstream (`sent`) still carries: each fact found in
    its messages, else in the result of a ref it names (read_result serves it whole)."""
    sources: list[facts.Source] = []
    results: list[str] = []
    for message in client:
        tool_results = fmt.tool_results(message)
        kind = facts.TOOL_RESULT if tool_results else facts.CONVERSATION
        sources.append(facts.Source(kind, fmt.render_transcript([message])))
        results.extend(t for t in (r.text for r in tool_results) if t is not None)
    ranked = facts.rank(sources)
    shapes = Counter(facts.shape(f) for f in ranked)
    telling = tuple(f for f in ranked if shapes[facts.shape(f)] < facts.TEMPLATED)
    text = "\n".join(fmt.render_transcript([m]) for m in sent)
    named = set(refs_in(text))
    behind = "\n".join(r for r in results if ref_for(r) in named)
    kept = tuple(f for f in telling if f in text)
    readable = tuple(f for f in telling if f not in kept and f in behind)
    present = sum(1 for f in ranked if f in text)
    return FactsKept(telling, kept, readable, len(ranked), present)


def _report(
    api: str,
    observed: Observed,
    out: Path,
    say: Callable[[str], None],
    sent: Sequence[Any] = (),
) -> None:
    from proxy.ops.replay import replay, summary_lines
    from proxy.ops.report import render_report

    share = 100 * observed.cached_tokens / observed.prompt_tokens if observed.prompt_tokens else 0
    say("")
    say(f"turns by strategy: {observed.by_strategy()}")
    say(f"prompt tokens read from the upstream's cache: {share:.0f}%")
    policies = _demo_policies()
    fmt = CHAT if api == "chat" else ANTHROPIC
    if observed.bodies and sent:
        say(facts_kept(observed.bodies[-1]["messages"], sent, fmt).line())
    result = replay(observed.bodies, policies, default_counter(), fmt=fmt)
    say("replayed without and with the proxy (as `compaction-proxy replay` does):")
    for line in summary_lines(result):
        say("  " + line)
    out.write_text(render_report(result, f"the demo ({api})"), encoding="utf-8")
    say(f"report: {out.resolve()}")


def run_demo(args: argparse.Namespace) -> int:
    if args.turns < 1:
        return fail(f"demo --turns must be 1 or more, got {args.turns}")
    if args.log_level == "INFO":  # the proxy's request lines would bury the turn lines
        logging.getLogger().setLevel(logging.WARNING)
    pace = args.pace if args.pace is not None else (PACE if sys.stdout.isatty() else 0.0)
    asyncio.run(demo(args.api, args.turns, args.out, sys.stdout, max(pace, 0.0)))
    return 0
