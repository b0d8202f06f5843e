"""The crossing's own work in one process, without sockets: `Compactor.prepare` on the
crossing workload of crossing_cpu.py, this tree against another, alternated.

Each run is a child process with one tree first on its path: it starts an embedded
Redis, grows a few warm conversations, then times (CPU, process_time) `Compactor.prepare`
(parsing included) for turns 4-23 of N fresh conversations of the recorded Claude Code
session, each with its own tool results, at crossing_cpu.py's policy (offload_trigger
4,000). No upstream, no relay, no event loop's sockets but Redis's: the part of a
crossing that counting, the store calls and the planner make, with less noise than the
end-to-end run on shared cores. The trees are run in turn, `--rounds` times.

    .venv/bin/python bench/crossing_prepare.py --before DIR [--conversations 12] [--rounds 6]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
TURNS, WARM_TURNS = 24, 4


async def measure(conversations: int, tag: str) -> float:
    """CPU µs per prepare over the measured turns (in the child, its tree first)."""
    import orjson

    from proxy.server.compactor import Compactor
    from proxy.store import EmbeddedRedis, Store
    from proxy.wire import ANTHROPIC

    saved = list(sys.path)
    sys.path.append(str(ROOT / "bench"))
    from crossing_cpu import Session  # the workload (it puts this tree first on the path)

    sys.path[:] = saved  # what prepare imports later comes from the tree under test
    where = str(sys.modules[Compactor.__module__].__file__)
    assert where.startswith(os.environ["PYTHONPATH"]), where
    cc = Session()
    server = EmbeddedRedis(Path(tempfile.mkdtemp(prefix="crossing-prepare-")) / "redis")
    store = Store.from_url(server.start_sync())
    policy = {
        "match": cc.base["model"], "window": 200_000, "trigger": 100_000, "target": 80_000,
        "offload_trigger": 4_000,
    }  # fmt: skip
    compactor = Compactor([policy])

    async def turn(name: str, t: int) -> float:
        raw = cc.body(name, t)
        start = time.process_time()
        await compactor.prepare(
            raw, orjson.loads(raw), cc.request_headers(name), wire=ANTHROPIC, store=store,
            upstream=None, path="/v1/messages", upstream_headers=(),  # type: ignore[arg-type]
        )  # fmt: skip
        return time.process_time() - start

    try:
        for warm in range(4):  # code paths, pools, the counter's cache of the fixed parts
            for t in range(TURNS):
                await turn(f"{tag}w{warm}", t)
        spent = [
            await turn(f"{tag}c{c:03d}", t) for c in range(conversations) for t in range(TURNS)
        ]
        measured = [s for i, s in enumerate(spent) if i % TURNS >= WARM_TURNS]
        return 1e6 * sum(measured) / len(measured)
    finally:
        await compactor.close()
        await store.close()
        server.stop_sync()


def run_tree(tree: Path, conversations: int, tag: str) -> float:
    env = {**os.environ, "PYTHONPATH": str(tree)}
    env.pop("REDIS_URL", None)
    out = subprocess.run(
        [sys.executable, __file__, "--child", str(conversations), tag],
        env=env, check=True, capture_output=True, text=True,
    )  # fmt: skip
    return float(out.stdout.split()[-1])


def main() -> None:
    if len(sys.argv) == 4 and sys.argv[1] == "--child":
        print(f"{asyncio.run(measure(int(sys.argv[2]), sys.argv[3])):.1f}")
        return
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--before", type=Path, required=True, help="another version's tree")
    parser.add_argument("--conversations", type=int, default=12)
    parser.add_argument("--rounds", type=int, default=6)
    args = parser.parse_args()
    ratios = []
    print("| round | before µs/prepare | after µs/prepare | after / before |")
    print("|---:|---:|---:|---:|")
    for n in range(args.rounds):
        tag = f"r{n}p{os.getpid()}"
        after = run_tree(ROOT, args.conversations, tag)
        before = run_tree(args.before.resolve(), args.conversations, tag)
        ratios.append(after / before)
        print(f"| {n + 1} | {before:.0f} | {after:.0f} | {after / before:.2f} |", flush=True)
    spread = f"{min(ratios):.2f}-{max(ratios):.2f}"
    load = os.getloadavg()[0]
    print(f"\nafter / before: median {statistics.median(ratios):.2f}, {spread}; load {load:.1f}")


if __name__ == "__main__":
    main()
