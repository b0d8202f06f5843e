"""What compaction saves: one long agent conversation billed with and without the proxy.

The scripted agent (proxy/testing/agent.py: one task, then turn after turn a tool call
answered with a large log) runs twice through the real anthropic SDK, in one process:

- direct to a stand-in with an unlimited window (what the conversation costs with no
  proxy, if the model could take it all);
- through the proxy (default policy for claude-* models: window 200,000, trigger
  100,000, target 80,000) to a stand-in with a 200,000-token window.

Billing uses the usage the stand-in reports (its prompt-cache model): uncached input
1.0, cache write 1.25, cache read 0.1, output 5.0. Summariser calls are billed too:
their whole input uncached, their output at its cap (an upper bound).

Then the proxy's added latency for a request whose history is 400,000 tokens and whose
summary is already stored: the same request through the proxy vs its rewritten body sent
straight to the stand-in, interleaved, p50/p99.

`--shape chat` runs bench/make_trace.py's chat-heavy shape instead (160 turns of long
reasoning, 300-character results); `--read-every 0` leaves out the read_result rounds
(as `compaction-proxy replay` does, for comparing the two); `--policy trigger=...,...`
replaces fields of the claude-* policy. Besides the figures from the agent's usage, the
whole upstream bill is also taken from the stand-in's records: every request it answered
(the agent's, read_result rounds, summariser calls) priced by the usage it reported.

Usage: .venv/bin/python bench/replay.py [--turns 60] [--result-chars 32000] [--write]
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import datetime
import platform
import statistics
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

import aiohttp
import anthropic
import orjson
from aiohttp import web

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench.make_trace import SHAPES, reasoning  # noqa: E402
from proxy.config import load_settings  # noqa: E402
from proxy.core.pricing import CACHE_MODEL  # noqa: E402
from proxy.core.tokens import default_counter  # noqa: E402
from proxy.server.app import RunningProxy, start  # noqa: E402
from proxy.store import EmbeddedRedis  # noqa: E402
from proxy.testing.agent import run_agent, tool_output  # noqa: E402
from proxy.testing.standin import RECORDED, StandInOptions, create_app  # noqa: E402

RESULTS = ROOT / "bench" / "RESULTS.md"
# The one price model (proxy/core/pricing.py), split by kind for the breakdown below.
PRICES = {
    "input": CACHE_MODEL.input,
    "write": CACHE_MODEL.cache_write,
    "read": CACHE_MODEL.cache_read,
    "output": CACHE_MODEL.output,
}
WINDOW = 200_000
PURPOSE = "x-compaction-proxy-purpose"


async def serve_standin(
    window: int,
    summary_delay: float = 0.0,
    summary_loss: int = 0,
    summary_keeps: tuple[str, ...] = (),
) -> tuple[str, web.Application, web.AppRunner]:
    options = StandInOptions(
        windows={"*": window},
        max_recorded=None,
        summary_delay=summary_delay,
        summary_loss=summary_loss,
        summary_keeps=summary_keeps,
    )
    app = create_app(options)
    runner = web.AppRunner(app, max_field_size=65_536)  # the chat shape's text is a header
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    return f"http://127.0.0.1:{runner.addresses[0][1]}", app, runner


def bill(usage: Any) -> dict[str, float]:
    return {
        "input": usage.input_tokens * PRICES["input"],
        "write": (usage.cache_creation_input_tokens or 0) * PRICES["write"],
        "read": (usage.cache_read_input_tokens or 0) * PRICES["read"],
        "output": usage.output_tokens * PRICES["output"],
    }


def summariser_bill(app: web.Application) -> tuple[int, float]:
    counter = default_counter()
    calls = [orjson.loads(r.body) for r in app[RECORDED] if r.headers.get(PURPOSE)]
    cost = sum(
        counter.count_request(b) * PRICES["input"] + b["max_tokens"] * PRICES["output"]
        for b in calls
    )
    return len(calls), cost


def records_bill(app: web.Application) -> tuple[float, int]:
    """Every Messages request the stand-in answered, priced by the usage it reported."""
    total, n = 0.0, 0
    for r in app[RECORDED]:
        if r.path_qs.split("?")[0] == "/v1/messages" and r.usage:
            total += CACHE_MODEL.cost(r.usage)
            n += 1
    return total, n


async def conversation(
    client: anthropic.AsyncAnthropic, turns: int, chars: int, args: argparse.Namespace
) -> list[Any]:
    low, high = SHAPES[args.shape][2]
    return await run_agent(
        client,
        turns=turns,
        result_chars=chars,
        read_every=args.read_every,
        conversation=uuid.uuid4().hex,
        text=reasoning(args.seed, low, high) if high else None,
        max_tokens=8_192 if high else 1024,
    )


def totals(turns: list[Any]) -> dict[str, float]:
    out = {"input": 0.0, "write": 0.0, "read": 0.0, "output": 0.0}
    tokens = {"input": 0, "write": 0, "read": 0}
    for t in turns:
        for k, v in bill(t.message.usage).items():
            out[k] += v
        u = t.message.usage
        tokens["input"] += u.input_tokens
        tokens["write"] += u.cache_creation_input_tokens or 0
        tokens["read"] += u.cache_read_input_tokens or 0
    out["tokens_in"] = float(sum(tokens.values()))
    out["read_share"] = tokens["read"] / max(1, sum(tokens.values()))
    return out


def with_policy(settings: Any, fields: str) -> Any:
    """The settings with fields of the built-in policy replaced ("trigger=100000,...")."""
    if not fields:
        return settings
    from proxy.core.policy import DEFAULT_POLICIES, FIELD_TYPES

    changes = {k: int(v) for k, v in (item.split("=", 1) for item in fields.split(","))}
    tables = []
    for p in DEFAULT_POLICIES:
        table = {f: getattr(p, f) for f in FIELD_TYPES}
        tables.append({**table, **changes})
    return dataclasses.replace(settings, policies=tuple(tables))


async def cost_runs(
    turns: int, chars: int, redis_url: str, args: argparse.Namespace
) -> dict[str, Any]:
    direct_url, direct_app, direct_runner = await serve_standin(100_000_000)
    proxied_url, proxied_app, proxied_runner = await serve_standin(WINDOW, args.summary_delay)
    settings = load_settings(
        None,
        environ={},
        overrides={"server.port": 0, "upstream.url": proxied_url, "store.redis_url": redis_url},
    )
    proxy = await start(with_policy(settings, args.policy))
    try:
        plain = await conversation(
            anthropic.AsyncAnthropic(base_url=direct_url, api_key="sk-bench", max_retries=0),
            turns,
            chars,
            args,
        )
        through = await conversation(
            anthropic.AsyncAnthropic(base_url=proxy.url, api_key="sk-bench", max_retries=0),
            turns,
            chars,
            args,
        )
    finally:
        await proxy.stop()
    counter = default_counter()
    sizes = [counter.count_request(orjson.loads(r.body)) for r in proxied_app[RECORDED]]
    direct_sizes = [counter.count_request(orjson.loads(r.body)) for r in direct_app[RECORDED]]
    calls, summary_cost = summariser_bill(proxied_app)
    upstream_without, _ = records_bill(direct_app)
    upstream_with, upstream_requests = records_bill(proxied_app)
    await direct_runner.cleanup()
    await proxied_runner.cleanup()
    without, with_ = totals(plain), totals(through)
    cost_without = sum(without[k] for k in ("input", "write", "read", "output"))
    cost_with = sum(with_[k] for k in ("input", "write", "read", "output")) + summary_cost
    strategies = [t.headers.get("x-compaction-strategy") or "untouched" for t in through]
    return {
        "turns": turns,
        "result_chars": chars,
        "largest_direct": max(direct_sizes),
        "largest_proxied": max(sizes),
        "within_window": all(s <= WINDOW for s in sizes),
        "upstream_requests": len(sizes),
        "cost_without": cost_without,
        "cost_with": cost_with,
        "summary_calls": calls,
        "summary_cost": summary_cost,
        "read_share_with": with_["read_share"],
        "read_share_without": without["read_share"],
        "tokens_in_without": without["tokens_in"],
        "tokens_in_with": with_["tokens_in"],
        "crossings": sum(1 for s in strategies if s not in ("untouched", "checkpoint")),
        "upstream_without": upstream_without,
        "upstream_with": upstream_with,
        "upstream_requests_with": upstream_requests,
        "strategies": sorted(set(strategies)),
    }


def big_history(tokens: int) -> list[dict[str, Any]]:
    """A history of about `tokens` tokens of mid-size tool results (below the offload
    threshold, so a crossing must summarise)."""
    counter = default_counter()
    messages: list[dict[str, Any]] = [{"role": "user", "content": "Fix the build."}]
    total, t = 0, 0
    while total < tokens:
        result = tool_output(t, 5_000)
        call = {"type": "tool_use", "id": f"toolu_b{t:05d}", "name": "Bash", "input": {"n": t}}
        answer = {"type": "tool_result", "tool_use_id": call["id"], "content": result}
        messages += [
            {"role": "assistant", "content": [call]},
            {"role": "user", "content": [answer]},
        ]
        total += counter.count_text(result) + 30
        t += 1
    return messages


async def latency_run(redis_url: str, rounds: int) -> dict[str, Any]:
    url, app, runner = await serve_standin(10_000_000)
    settings = load_settings(
        None,
        environ={},
        overrides={"server.port": 0, "upstream.url": url, "store.redis_url": redis_url},
    )
    settings = dataclasses.replace(
        settings,
        policies=({"match": "*", "window": 1_000_000, "trigger": 300_000, "target": 100_000},),
    )
    proxy: RunningProxy = await start(settings)
    history = big_history(400_000)
    body = orjson.dumps({"model": "claude-test-1", "max_tokens": 64, "messages": history})
    headers = {
        "x-api-key": "sk-bench",
        "anthropic-version": "2023-06-01",
        "content-type": "application/json",
        "x-conversation-id": uuid.uuid4().hex,
        "x-stand-in": '{"text": "ok"}',
    }
    timings: dict[str, list[float]] = {"proxy": [], "direct": []}
    async with aiohttp.ClientSession() as session:
        first = await session.post(proxy.url + "/v1/messages", data=body, headers=headers)
        assert first.status == 200, await first.text()
        strategy = first.headers.get("x-compaction-strategy")
        rewritten = app[RECORDED][-1].body
        for _ in range(rounds):
            for who, target, data in (
                ("proxy", proxy.url, body),
                ("direct", url, rewritten),
            ):
                start_at = time.perf_counter()
                async with session.post(target + "/v1/messages", data=data, headers=headers) as r:
                    await r.read()
                    assert r.status == 200
                    if who == "proxy":
                        assert r.headers.get("x-compaction-strategy") == "checkpoint"
                timings[who].append((time.perf_counter() - start_at) * 1000)
    await proxy.stop()
    await runner.cleanup()
    counter = default_counter()

    def pct(values: list[float], q: float) -> float:
        ordered = sorted(values)
        return ordered[min(len(ordered) - 1, int(q * len(ordered)))]

    return {
        "history_tokens": counter.count_request(orjson.loads(body)),
        "history_bytes": len(body),
        "rewritten_tokens": counter.count_request(orjson.loads(rewritten)),
        "first_strategy": strategy,
        "proxy_p50": statistics.median(timings["proxy"]),
        "proxy_p99": pct(timings["proxy"], 0.99),
        "direct_p50": statistics.median(timings["direct"]),
        "direct_p99": pct(timings["direct"], 0.99),
    }


def cost_report(cost: dict[str, Any]) -> str:
    ratio = cost["cost_with"] / cost["cost_without"]
    records = cost["upstream_with"] / cost["upstream_without"]
    return (
        f"turns {cost['turns']}: agent usage + summariser upper bound {ratio:.3f}x"
        f" ({cost['cost_with']:,.0f} / {cost['cost_without']:,.0f}); stand-in records"
        f" {records:.3f}x ({cost['upstream_with']:,.0f} / {cost['upstream_without']:,.0f},"
        f" {cost['upstream_requests_with']} upstream requests); cache read"
        f" {cost['read_share_with']:.1%}; crossings {cost['crossings']}; summariser calls"
        f" {cost['summary_calls']} ({cost['summary_cost']:,.0f} at the upper bound); largest"
        f" {cost['largest_proxied']:,} (within the window: {cost['within_window']})"
    )


def report(cost: dict[str, Any], lat: dict[str, Any]) -> str:
    ratio = cost["cost_with"] / cost["cost_without"]
    added = lat["proxy_p50"] - lat["direct_p50"]
    lines = [
        "## replay.py",
        "",
        f"`.venv/bin/python bench/replay.py --turns {cost['turns']} --result-chars"
        f" {cost['result_chars']}`, {datetime.date.today()}, {platform.machine()},"
        " 2 cores shared with other work, everything in one process (SDK client, proxy,"
        " stand-ins, embedded Redis).",
        "",
        f"One {cost['turns']}-turn agent conversation, each turn a tool call answered with a"
        f" {cost['result_chars']:,}-character log; the largest request without the proxy"
        f" holds {cost['largest_direct']:,} tokens (unlimited window), with it"
        f" {cost['largest_proxied']:,} (window {WINDOW:,}: every request within it:"
        f" {cost['within_window']}).",
        "",
        "| | without proxy | with proxy |",
        "|---|---:|---:|",
        f"| billed (input 1.0, write 1.25, read 0.1, output 5.0) | {cost['cost_without']:,.0f}"
        f" | {cost['cost_with']:,.0f} |",
        f"| input tokens sent | {cost['tokens_in_without']:,.0f} | {cost['tokens_in_with']:,.0f} |",
        f"| share of input read from cache | {cost['read_share_without']:.1%}"
        f" | {cost['read_share_with']:.1%} |",
        f"| summariser calls (billed in the with-proxy cost) | - | {cost['summary_calls']}"
        f" ({cost['summary_cost']:,.0f}) |",
        "",
        f"Billed cost with the proxy: **{ratio:.2f}x** of the run without it; crossings:"
        f" {cost['crossings']}; strategies seen: {', '.join(cost['strategies'])}.",
        "",
        f"Billed from the stand-in's records (every upstream request it answered, by the"
        f" usage it reported: {cost['upstream_requests_with']} with the proxy):"
        f" {cost['upstream_without']:,.0f} without, {cost['upstream_with']:,.0f} with:"
        f" **{cost['upstream_with'] / cost['upstream_without']:.3f}x**.",
        "",
        f"Added latency for a {lat['history_tokens']:,}-token history"
        f" ({lat['history_bytes'] / 1e6:.1f} MB) whose rewrite (first: {lat['first_strategy']})"
        f" is stored, rewritten to {lat['rewritten_tokens']:,} tokens: proxy p50 / p99"
        f" {lat['proxy_p50']:.1f} / {lat['proxy_p99']:.1f} ms vs the rewritten body direct"
        f" {lat['direct_p50']:.1f} / {lat['direct_p99']:.1f} ms: **{added:.1f} ms added at p50**.",
        "",
    ]
    return "\n".join(lines)


def write_section(text: str) -> None:
    current = RESULTS.read_text() if RESULTS.exists() else "# Benchmark results\n\n"
    start_at = current.find("## replay.py")
    if start_at >= 0:
        end = current.find("\n## ", start_at + 1)
        current = current[:start_at] + current[end + 1 :] if end >= 0 else current[:start_at]
    RESULTS.write_text(current.rstrip("\n") + "\n\n" + text)


async def main_async(args: argparse.Namespace) -> str:
    with tempfile.TemporaryDirectory() as tmp:
        redis = EmbeddedRedis(Path(tmp) / "redis")
        url = await redis.start()
        try:
            cost = await cost_runs(args.turns, args.result_chars, url, args)
            if args.rounds == 0:
                return cost_report(cost)
            lat = await latency_run(url, args.rounds)
        finally:
            await redis.stop()
    return report(cost, lat)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--shape", choices=sorted(SHAPES), default="long-tool")
    parser.add_argument("--turns", type=int, help="default: the shape's (60 or 160)")
    parser.add_argument("--result-chars", type=int, help="default: the shape's")
    parser.add_argument("--seed", type=int, default=12, help="of the chat shape's reasoning")
    parser.add_argument("--read-every", type=int, default=10, help="0: no read_result rounds")
    parser.add_argument("--policy", default="", help="built-in policy fields: trigger=100000,...")
    parser.add_argument("--rounds", type=int, default=30, help="latency rounds; 0: cost only")
    parser.add_argument(
        "--summary-delay", type=float, default=0.0, help="seconds each summariser call takes"
    )
    parser.add_argument("--write", action="store_true", help="update bench/RESULTS.md")
    args = parser.parse_args()
    turns, chars, _ = SHAPES[args.shape]
    args.turns = args.turns or turns
    args.result_chars = args.result_chars or chars
    text = asyncio.run(main_async(args))
    print(text)
    if args.write:
        write_section(text)


if __name__ == "__main__":
    main()
