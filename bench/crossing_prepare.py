"""The crossing's own work in one process, without sockets: `Compactor.prepare` on
crossing_cpu.py's default workload, this tree against another, alternated.

Each run is a child process with one tree first on its path: it starts an embedded
Redis, sends two warm conversations, then times (CPU, process_time) reading and preparing
every request (the body parsed as that tree parses it: through its reuse cache when it
has one; `Compactor.prepare` as that tree's takes it) of N fresh conversations of the
recorded Claude Code session (bench/sessions/, bench/fresh_session.py), at the shipped
policy. No upstream, no relay, no event loop's sockets but Redis's: the part of a
request that parsing, counting, the store calls and the planner make, with less noise
than the end-to-end run on shared cores. The trees are run in turn, `--rounds` times.

    .venv/bin/python bench/crossing_prepare.py --before DIR [--conversations 8] [--rounds 6]
"""

from __future__ import annotations

import argparse
import asyncio
import inspect
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
WARM = 2


async def measure(conversations: int, tag: str) -> float:
    """CPU µs per request read and prepared (in the child, its tree first)."""
    import orjson

    from proxy.server.compactor import Compactor
    from proxy.store import EmbeddedRedis, Store
    from proxy.wire import ANTHROPIC

    saved = list(sys.path)
    sys.path.append(str(ROOT / "bench"))
    from fresh_session import FreshSessions  # the workload (this tree's, whatever is tested)

    sys.path[:] = saved  # what prepare imports later comes from the tree under test
    where = str(sys.modules[Compactor.__module__].__file__)
    assert where.startswith(os.environ["PYTHONPATH"]), where
    sessions = FreshSessions()
    server = EmbeddedRedis(Path(tempfile.mkdtemp(prefix="crossing-prepare-")) / "redis")
    store = Store.from_url(server.start_sync())
    compactor = Compactor()
    exchange = "incoming" in inspect.signature(Compactor.prepare).parameters

    async def prepared(raw: bytes, headers: dict[str, str]) -> Any:
        if not exchange:  # a tree from before the exchange (issue 31)
            return await compactor.prepare(
                raw, orjson.loads(raw), headers, wire=ANTHROPIC, store=store, upstream=None,
                path="/v1/messages", upstream_headers=(),
            )  # fmt: skip
        import proxy.server.bodies as bodies
        from proxy.server.bodies import Incoming
        from proxy.server.compactor import Asked
        from proxy.server.record import current_or_throwaway

        parse = getattr(compactor, "parser", None)  # the reuse cache's parse, where it is
        if hasattr(bodies, "continuing"):
            payload, seen = bodies.continuing(compactor.reuse, ANTHROPIC, "t", headers)(raw)
            incoming = Incoming(raw, payload, seen=seen)
        elif parse is not None:
            payload, seen = parse(ANTHROPIC, "t", headers)(raw)
            incoming = Incoming(raw, payload, seen=seen)
        else:
            incoming = Incoming(raw, orjson.loads(raw))
        asked = Asked(headers, str(incoming.payload.get("model", "")))
        return await compactor.prepare(incoming, ANTHROPIC, store, asked, current_or_throwaway())

    async def conversation(name: str) -> float:
        spent = 0.0
        for request in sessions.conversation(name):
            start = time.process_time()
            await prepared(request.body, request.headers)
            spent += time.process_time() - start
        return spent

    try:
        for warm in range(WARM):  # code paths, pools, the counter's cache of the fixed parts
            await conversation(f"{tag}w{warm}")
        spent = [await conversation(f"{tag}c{c:03d}") for c in range(conversations)]
        return 1e6 * sum(spent) / (conversations * len(sessions))
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
    parser.add_argument("--conversations", type=int, default=8)
    parser.add_argument("--rounds", type=int, default=6)
    args = parser.parse_args()
    ratios = []
    print("| round | before µs/request | after µs/request | after / before |")
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
