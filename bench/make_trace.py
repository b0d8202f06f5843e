"""Record the long agent conversation as a replay trace (JSONL, one request body a line).

The scripted agent (proxy/testing/agent.py) runs against the stand-in directly, without
the proxy, through the real anthropic SDK: one task, then turn after turn a Bash call
answered with a large build log (the conversation of the compaction issue: 60 turns,
32,000-character results). The stand-in's window is unlimited, so nothing is refused.
Every request it received is written as the client sent it (bodies only: no headers, so
no credentials). The file is large (about 60 MB for 60 turns), so it is not committed:

    .venv/bin/python bench/make_trace.py /tmp/agent-60.jsonl
    .venv/bin/python -m proxy replay /tmp/agent-60.jsonl --out bench/replay-report.html
"""

from __future__ import annotations

import argparse
import asyncio
import sys
from pathlib import Path

import anthropic
from aiohttp import web

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from proxy.testing.agent import run_agent  # noqa: E402
from proxy.testing.standin import RECORDED, StandInOptions, create_app  # noqa: E402


async def record(out: Path, turns: int, result_chars: int, model: str) -> int:
    app = create_app(StandInOptions(windows={"*": 100_000_000}, max_recorded=None))
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    url = f"http://127.0.0.1:{runner.addresses[0][1]}"
    try:
        client = anthropic.AsyncAnthropic(base_url=url, api_key="sk-trace", max_retries=0)
        await run_agent(client, turns=turns, result_chars=result_chars, model=model)
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
    parser.add_argument("--turns", type=int, default=60)
    parser.add_argument("--result-chars", type=int, default=32_000)
    parser.add_argument("--model", default="claude-test-1")
    args = parser.parse_args()
    n = asyncio.run(record(args.out, args.turns, args.result_chars, args.model))
    size = args.out.stat().st_size / 1e6
    print(f"{args.out}: {n} requests, {size:.1f} MB", file=sys.stderr)


if __name__ == "__main__":
    main()
