"""Record a long agent conversation as a replay trace (JSONL, one request body a line).

The scripted agent (proxy/testing/agent.py) runs against the stand-in directly, without
the proxy, through the real anthropic SDK. Two shapes (issue 12):

- `long-tool` (the default): one task, then turn after turn a Bash call answered with a
  large build log (60 turns, 32,000-character results);
- `chat`: 160 turns, each the model's long reasoning text (seeded prose full of
  identifiers, 4,000-12,000 characters, about 1,900 tokens on average) before a Bash call
  answered with a short log (300 characters): the history passes a 200,000-token window
  on text alone, so offloading cannot help and only folding (summaries) can.

The stand-in's window is unlimited, so nothing is refused. Every request it received is
written as the client sent it (bodies only: no headers, so no credentials). The files are
large (about 60 MB for the long-tool shape, 90 MB for chat), so they are not committed:

    .venv/bin/python bench/make_trace.py /tmp/agent-60.jsonl
    .venv/bin/python bench/make_trace.py --shape chat /tmp/chat-160.jsonl
    .venv/bin/python -m proxy replay /tmp/agent-60.jsonl --out bench/replay-report.html
"""

from __future__ import annotations

import argparse
import asyncio
import random
import sys
from collections.abc import Callable
from pathlib import Path

import anthropic
from aiohttp import web

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from proxy.testing.agent import run_agent  # noqa: E402
from proxy.testing.standin import RECORDED, StandInOptions, create_app  # noqa: E402

# shape -> (turns, result characters, reasoning characters per turn: low, high)
SHAPES = {"long-tool": (60, 32_000, (0, 0)), "chat": (160, 300, (4_000, 12_000))}
PROSE = (
    "the build step fails because the cache key is computed before the lockfile is read"
    " so every module rebuilds and the pipeline times out; I will check the config, the"
    " test fixtures, the retry loop and the error path, then compare with the last green"
    " run and keep the change small"
)
WORDS = PROSE.split()


def reasoning(seed: int, low: int, high: int) -> Callable[[int], str]:
    """The model's text of each turn: seeded prose of low..high characters that names
    files, functions, line numbers and error codes (what a summary must keep)."""

    def text(turn: int) -> str:
        rng = random.Random(seed * 100_003 + turn)
        size = rng.randint(low, high)
        words: list[str] = [f"Turn {turn}:"]
        length = 0
        while length < size:
            pick = rng.random()
            if pick < 0.06:
                word = f"src/build/module_{rng.randint(0, 99)}.py:{rng.randint(1, 900)}"
            elif pick < 0.09:
                word = f"E{rng.randint(1000, 9999)}"
            elif pick < 0.12:
                word = f"test_{rng.choice(WORDS)}_{rng.randint(0, 50)}()"
            else:
                word = rng.choice(WORDS)
            words.append(word)
            length += len(word) + 1
        return " ".join(words)[:size] + "."

    return text


async def record(
    out: Path,
    turns: int,
    result_chars: int,
    model: str,
    text: Callable[[int], str] | None = None,
    max_tokens: int = 1024,
) -> int:
    app = create_app(StandInOptions(windows={"*": 100_000_000}, max_recorded=None))
    runner = web.AppRunner(app, max_field_size=65_536)  # the reasoning rides in a header
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    url = f"http://127.0.0.1:{runner.addresses[0][1]}"
    try:
        client = anthropic.AsyncAnthropic(base_url=url, api_key="sk-trace", max_retries=0)
        await run_agent(
            client,
            turns=turns,
            result_chars=result_chars,
            model=model,
            text=text,
            max_tokens=max_tokens,
        )
        with out.open("wb") as f:
            for request in app[RECORDED]:
                if request.path_qs.split("?")[0] == "/v1/messages":
                    f.write(request.body.replace(b"\n", b"") + b"\n")
        return len(app[RECORDED])
    finally:
        await runner.cleanup()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("out", type=Path, help="the JSONL trace to write")
    parser.add_argument("--shape", choices=sorted(SHAPES), default="long-tool")
    parser.add_argument("--turns", type=int, help="default: the shape's (60 or 160)")
    parser.add_argument("--result-chars", type=int, help="default: the shape's (32,000 or 300)")
    parser.add_argument("--seed", type=int, default=12, help="of the chat shape's reasoning")
    parser.add_argument(
        "--reasoning-chars",
        metavar="LOW,HIGH",
        help="the chat shape's reasoning per turn, in characters (default 4000,12000)",
    )
    parser.add_argument("--model", default="claude-test-1")
    args = parser.parse_args()
    turns, chars, (low, high) = SHAPES[args.shape]
    if args.reasoning_chars:
        low, high = (int(n) for n in args.reasoning_chars.split(","))
    text = reasoning(args.seed, low, high) if high else None
    n = asyncio.run(
        record(
            args.out,
            args.turns or turns,
            args.result_chars or chars,
            args.model,
            text,
            max_tokens=8_192 if text else 1024,
        )
    )
    size = args.out.stat().st_size / 1e6
    print(f"{args.out}: {n} requests, {size:.1f} MB", file=sys.stderr)


if __name__ == "__main__":
    main()
