"""What summaries made in place read from the prompt cache, through the real Claude Code CLI.

The pinned Claude Code CLI runs the agent tests' log scenario (proxy/testing/scenario.py:
turn after turn a Bash call printing a 12,000-character build log, read_result calls
before some turns) through a proxy whose small policy makes it offload and fold, against
the stand-in (its prompt-cache model, proxy/testing/cache.py). Printed: the tool counts of
the conversation's requests and of each summariser call, and each call's share of its
prompt read from the cache (issue 23, finding 1: the calls lacked `read_result`, so they
read only the tool definitions).

Usage: .venv/bin/python bench/summary_cache_claude_code.py [--cli DIR]
(DIR holds node_modules with @anthropic-ai/claude-code; default tests/agents).
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import tempfile
from pathlib import Path

import orjson
from aiohttp import web

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from proxy.config import load_settings  # noqa: E402
from proxy.server.app import start  # noqa: E402
from proxy.server.state import COMPACTOR  # noqa: E402
from proxy.testing.claude_code import claude_command, run_claude_code  # noqa: E402
from proxy.testing.standin import RECORDED, StandInOptions, create_app  # noqa: E402
from tests.agents.checks import log_scenario, write_logs  # noqa: E402

MODEL = "claude-sonnet-4-6"
FINAL = "All build logs were read: the failure is in src/build/module_7_3.py."
PROMPT = "Read the build logs under logs/ one by one and tell me where the build fails."
TURNS = 24
POLICY = f"""[[policy]]
match = "{MODEL}"
window = 60000
trigger = 14000
target = 9000
offload_trigger = 7000
stub_head_chars = 3000
summary_max_tokens = 1500
keep_last = 2
"""
PURPOSE = "x-compaction-proxy-purpose"


async def main(cli: Path) -> None:
    reads = {n: 2 for n in range(6, TURNS, 3)}
    options = StandInOptions(
        windows={"*": 200_000, MODEL: 60_000},
        scenario=log_scenario(TURNS, reads, FINAL),
        max_recorded=None,
    )
    app = create_app(options)
    runner = web.AppRunner(app, max_field_size=65_536)
    await runner.setup()
    await web.TCPSite(runner, "127.0.0.1", 0).start()
    upstream = f"http://127.0.0.1:{runner.addresses[0][1]}"
    tmp = Path(tempfile.mkdtemp(prefix="summary-cache-"))
    (tmp / "proxy.toml").write_text(POLICY)
    overrides = {"server.port": 0, "upstream.url": upstream, "store.state_dir": str(tmp)}
    proxy = await start(load_settings(tmp / "proxy.toml", {}, overrides))
    work, home = tmp / "work", tmp / "home"
    work.mkdir()
    home.mkdir()
    write_logs(work, [12_000] * TURNS)
    try:
        run = await run_claude_code(
            claude_command(cli),
            base_url=proxy.url,
            prompt=PROMPT,
            workdir=work,
            home=home,
            model=MODEL,
            max_turns=TURNS + 10,
            extra_env={"CLAUDE_CODE_AUTO_COMPACT_WINDOW": "100000"},
            time_limit=900,
        )
        await proxy.app[COMPACTOR].settled()
    finally:
        await proxy.stop()
    print(f"Claude Code exited {run.returncode}, final text as scripted: {run.final_text == FINAL}")
    turns: set[int] = set()
    for r in app[RECORDED]:
        if not r.body:
            continue
        tools = len(orjson.loads(r.body).get("tools") or [])
        if r.headers.get(PURPOSE) != "summary":
            turns.add(tools)
            continue
        u = r.usage
        read = u.get("cache_read_input_tokens", 0)
        total = read + u.get("input_tokens", 0) + u.get("cache_creation_input_tokens", 0)
        print(f"summariser call: {tools} tools, {read:,} of {total:,} read ({read / total:.3f})")
    print(f"the conversation's requests: {sorted(turns)} tools")
    await runner.cleanup()


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cli", type=Path, default=ROOT / "tests" / "agents")
    asyncio.run(main(parser.parse_args().cli))
