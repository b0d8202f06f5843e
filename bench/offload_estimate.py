"""What deciding the offload step with the estimate costs in accuracy, on what agents send.

The planner offloads once the working set is over the offload trigger, judged with the
large tool results' estimates (proxy/core/estimate.py) rather than their exact counts
(proxy/core/planner.py). This replays `--conversations` fresh conversations of the
recorded Claude Code session (bench/sessions/, bench/fresh_session.py) through
`Compactor.prepare` at the shipped policy twice, each with its own embedded Redis and
counter: as shipped, and with every message counted exactly (no estimates). Per request
it compares the decision (offloaded or not) and the tokens of what is sent (counted
exactly, the same counter for both), and the CPU each run spent preparing.

    .venv/bin/python bench/offload_estimate.py [--conversations 8]
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

from fresh_session import FreshSessions  # noqa: E402

from proxy.core import counting  # noqa: E402
from proxy.core.tokens import TokenCounter  # noqa: E402
from proxy.server.bodies import Incoming, continuing  # noqa: E402
from proxy.server.compactor import Asked, Compactor  # noqa: E402
from proxy.server.record import current_or_throwaway  # noqa: E402
from proxy.store import EmbeddedRedis, Store  # noqa: E402
from proxy.wire import ANTHROPIC  # noqa: E402


@contextmanager
def exact_counts(on: bool) -> Iterator[None]:
    """Every message counted exactly (no estimate made) while `on`."""
    kept = counting.ESTIMATE_MIN_BYTES
    if on:
        counting.ESTIMATE_MIN_BYTES = 1 << 62
    try:
        yield
    finally:
        counting.ESTIMATE_MIN_BYTES = kept


async def replay(names: list[str], exact: bool) -> tuple[list[tuple[str, bytes]], float]:
    """Each request's strategy and the body sent, and the CPU seconds prepare took."""
    sessions = FreshSessions()
    server = EmbeddedRedis(Path(tempfile.mkdtemp(prefix="offload-estimate-")) / "redis")
    store = Store.from_url(server.start_sync())
    compactor = Compactor(counter=TokenCounter())  # nothing counted by the other run
    out: list[tuple[str, bytes]] = []
    spent = 0.0
    try:
        with exact_counts(exact):
            for name in names:
                for request in sessions.conversation(name):
                    start = time.process_time()
                    parse = continuing(compactor.reuse, ANTHROPIC, "t", request.headers)
                    payload, seen = parse(request.body)
                    betas = request.headers.get("anthropic-beta", "")
                    asked = Asked(request.headers, str(payload["model"]), betas)
                    incoming = Incoming(request.body, payload, seen=seen)
                    prepared = await compactor.prepare(
                        incoming, ANTHROPIC, store, asked, current_or_throwaway()
                    )
                    spent += time.process_time() - start
                    strategy = dict(prepared.headers).get("x-compaction-strategy", "")
                    out.append((strategy, prepared.body))
    finally:
        await compactor.close()
        await store.close()
        server.stop_sync()
    return out, spent


def sent_tokens(counter: TokenCounter, body: bytes) -> int:
    import orjson

    payload: Any = orjson.loads(body)
    messages = payload["messages"]
    return counting.count_tokens(ANTHROPIC, counter, payload, messages).total


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--conversations", type=int, default=8)
    args = parser.parse_args()
    names = [f"e{n:03d}" for n in range(args.conversations)]
    estimated, cpu_estimated = asyncio.run(replay(names, exact=False))
    exact, cpu_exact = asyncio.run(replay(names, exact=True))
    counter = TokenCounter()
    differ, diffs, offloads = 0, [], [0, 0]
    with exact_counts(True):
        for (s_est, b_est), (s_exact, b_exact) in zip(estimated, exact, strict=True):
            offloads[0] += s_est == "offload"
            offloads[1] += s_exact == "offload"
            if (s_est == "offload") != (s_exact == "offload"):
                differ += 1
            if b_est != b_exact:
                t_est, t_exact = sent_tokens(counter, b_est), sent_tokens(counter, b_exact)
                diffs.append((t_est - t_exact) / t_exact)
    requests = len(estimated)
    print(f"`.venv/bin/python bench/offload_estimate.py --conversations {args.conversations}`")
    print(f"- requests: {requests}; offload steps: estimated {offloads[0]}, exact {offloads[1]}")
    share = f"{differ} ({differ / requests:.1%})"
    print(f"- offload decided otherwise than exact counts would: {share}")
    if diffs:
        spread = f"{min(diffs):+.1%} to {max(diffs):+.1%}"
        print(
            f"- bodies sent that differ: {len(diffs)} ({len(diffs) / requests:.1%}); their tokens"
            f" against the exact run's: median {statistics.median(diffs):+.1%}, {spread}"
        )
    else:
        print("- bodies sent that differ: 0")
    print(
        f"- CPU per request prepared: estimated {1e6 * cpu_estimated / requests:.0f} µs,"
        f" exact {1e6 * cpu_exact / requests:.0f} µs"
    )


if __name__ == "__main__":
    main()
