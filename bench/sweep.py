"""Policy sweep: `replay`'s simulation of recorded traces for a grid of policy knobs.

For each combination of trigger, target, offload_trigger, offload_threshold, keep_results,
stub_head_chars, keep_last and summary_max_tokens (one `*` policy, window 200,000 unless
--window), every trace is
run through proxy/ops/replay.py (the planner, checkpoints in memory, the stand-in's
prompt-cache model; summariser calls billed) and compared with the same trace sent
unmanaged to a model with an unlimited window (every request billed, none refused).
Printed per combination and trace: cost ratio, share of input read from cache, crossings
(requests that made a new rewrite), summariser calls, largest request and requests over
the window; a combination with any request over the window is marked and never ranked.
Rows are ranked by the worst ratio over the traces.

    .venv/bin/python bench/make_trace.py /tmp/agent-60.jsonl
    .venv/bin/python bench/make_trace.py --shape chat /tmp/chat-160.jsonl
    .venv/bin/python bench/sweep.py /tmp/agent-60.jsonl /tmp/chat-160.jsonl \\
        --trigger 100000,140000 --target 40000,60000

Lists are comma-separated; a value 0 means the policy's own default (offload_trigger 0:
20,000, at most 10% of the window). `replay` bills each summary at its cap's size (a
placeholder of that length): a smaller summary_max_tokens is cheaper here, but what a
summary keeps is not measured. The sweep runs on --jobs processes (default 2).
"""

from __future__ import annotations

import argparse
import itertools
import multiprocessing
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from proxy.core.policy import Policy, PolicyError  # noqa: E402
from proxy.core.tokens import TokenCounter, default_counter  # noqa: E402
from proxy.ops.replay import Replay, replay  # noqa: E402
from proxy.ops.requests import load_trace  # noqa: E402

KNOBS = ("trigger", "target", "offload_trigger", "offload_threshold", "keep_results",
         "stub_head_chars", "keep_last", "summary_max_tokens")  # fmt: skip
UNLIMITED = 1_000_000_000


@dataclass(frozen=True, slots=True)
class Row:
    trace: str
    knobs: tuple[int, ...]
    ratio: float  # cost with the proxy / cost unmanaged (unlimited window)
    cost: float
    direct: float
    read_share: float
    crossings: int
    summaries: int
    summary_cost: float
    largest: int
    over: int  # requests over the window, with the proxy


_TRACES: dict[str, list[dict[str, Any]]] = {}
_DIRECT: dict[str, float] = {}
_COUNTER: list[TokenCounter] = []


def counter() -> TokenCounter:
    if not _COUNTER:
        _COUNTER.append(default_counter())
    return _COUNTER[0]


def bodies(trace: str) -> list[dict[str, Any]]:
    if trace not in _TRACES:
        _TRACES[trace] = list(load_trace(Path(trace)))
    return _TRACES[trace]


def unmanaged_cost(trace: str) -> float:
    """The trace sent as is to a model whose window takes it all (nothing refused)."""
    if trace not in _DIRECT:
        nothing = [Policy(match="*", window=UNLIMITED)]
        _DIRECT[trace] = replay(bodies(trace), nothing, counter()).direct_cost
    return _DIRECT[trace]


def policy_of(knobs: tuple[int, ...], window: int) -> Policy:
    return Policy(match="*", window=window, **dict(zip(KNOBS, knobs, strict=True))).validate()


def measure(trace: str, policy: Policy) -> Row:
    result: Replay = replay(bodies(trace), [policy], counter())
    direct = unmanaged_cost(trace)
    knobs = tuple(int(getattr(policy, k)) for k in KNOBS)
    return Row(
        trace=Path(trace).name,
        knobs=knobs,
        ratio=result.proxy_cost / direct,
        cost=result.proxy_cost,
        direct=direct,
        read_share=result.cache_read_share(True),
        crossings=len(result.crossings),
        summaries=result.summariser_calls,
        summary_cost=sum(t.summariser_cost for t in result.turns),
        largest=max(t.proxy_tokens for t in result.turns),
        over=result.proxy_over_window,
    )


def _job(args: tuple[str, tuple[int, ...], int]) -> Row:
    trace, knobs, window = args
    return measure(trace, policy_of(knobs, window))


def grid(args: argparse.Namespace) -> list[tuple[int, ...]]:
    lists = [[int(v) for v in str(getattr(args, k)).split(",")] for k in KNOBS]
    out = []
    for knobs in itertools.product(*lists):
        try:
            policy_of(knobs, args.window)
        except PolicyError:
            continue  # target over trigger, offload_trigger over trigger: not a policy
        out.append(knobs)
    return out


def header() -> str:
    return (
        "| trigger | target | offload_trigger | offload_threshold | keep_results"
        " | stub_head_chars | keep_last | summary_max_tokens | trace | ratio | cache read"
        " | crossings | summaries | largest | over window |\n|" + "---:|" * 8 + "---|" + "---:|" * 6
    )


def line(row: Row) -> str:
    knobs = " | ".join(f"{v:,}" for v in row.knobs)
    return (
        f"| {knobs} | {row.trace} | {row.ratio:.3f}x | {row.read_share:.1%} | {row.crossings}"
        f" | {row.summaries} | {row.largest:,} | {row.over} |"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("traces", nargs="+", help="JSONL traces (bench/make_trace.py)")
    parser.add_argument("--window", type=int, default=200_000)
    parser.add_argument("--trigger", default="100000,120000,140000")
    parser.add_argument("--target", default="40000,50000,60000")
    parser.add_argument("--offload-trigger", dest="offload_trigger", default="0")
    parser.add_argument("--offload-threshold", dest="offload_threshold", default="500,2000")
    parser.add_argument("--keep-results", dest="keep_results", default="1")
    parser.add_argument("--stub-head-chars", dest="stub_head_chars", default="200")
    parser.add_argument("--keep-last", dest="keep_last", default="6")
    parser.add_argument("--summary-max-tokens", dest="summary_max_tokens", default="8000")
    parser.add_argument("--jobs", type=int, default=2)
    parser.add_argument("--top", type=int, default=15, help="ranked rows to print at the end")
    args = parser.parse_args()
    combos = grid(args)
    jobs = [(t, k, args.window) for k in combos for t in args.traces]
    print(f"{len(combos)} policies x {len(args.traces)} traces", file=sys.stderr)
    started = time.perf_counter()
    rows: list[Row] = []
    print(header())
    with multiprocessing.Pool(args.jobs) as pool:
        for row in pool.imap(_job, jobs):
            rows.append(row)
            print(line(row), flush=True)
    print(f"{time.perf_counter() - started:.0f} s", file=sys.stderr)
    by_knobs: dict[tuple[int, ...], list[Row]] = {}
    for row in rows:
        by_knobs.setdefault(row.knobs, []).append(row)
    ranked = sorted(
        (rs for rs in by_knobs.values() if not any(r.over for r in rs)),
        key=lambda rs: max(r.ratio for r in rs),
    )
    print(f"\nTop {args.top} by the worst ratio over the traces (none over the window):\n")
    print(header())
    for rs in ranked[: args.top]:
        for r in rs:
            print(line(r))


if __name__ == "__main__":
    main()
