"""The cost floor of a recorded conversation: its cheapest schedule of offloads and folds.

For each trace (bench/make_trace.py), proxy/ops/optimal.py finds the schedule of offload
and fold points that minimises the prompt-cache bill (read 0.1, write 1.25, output 5)
with every request inside the window, under the rules of the policy given (its window,
keep_last, keep_results, offload_threshold, stub head and summary cap; an ideal cache:
see that module's docstring for exactly what it optimises over and assumes), and prints
it next to the unmanaged run (unlimited window, same ideal cache), and what the floor
pays for (proxy/ops/optimal.py's `bill`: system and tools, output, each message's first
write and the reads of the context are the same in every schedule; kept results, stubs,
rewrites and summaries are what the policy's rules move):

    .venv/bin/python bench/optimal.py /tmp/agent-60.jsonl /tmp/chat-160.jsonl

The stub head and the keep window are priced by giving other values
(`--stub-head-chars 0,100,200 --keep-results 1,3 --keep-tokens 0,4000`: every
combination, one line each).
"""

from __future__ import annotations

import argparse
import dataclasses
import itertools
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from proxy.core.policy import DEFAULT_POLICIES, policy_for  # noqa: E402
from proxy.core.tokens import default_counter  # noqa: E402
from proxy.ops.optimal import PARTS, bill, cheapest, rules_for, shape_of, unmanaged  # noqa: E402
from proxy.ops.requests import load_trace  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("traces", nargs="+", type=Path)
    parser.add_argument("--model", default="claude-test-1", help="whose default policy")
    parser.add_argument("--keep-last", type=int, help="instead of the policy's")
    parser.add_argument("--summary-tokens", type=int, help="instead of the policy's cap")
    parser.add_argument("--window", type=int, help="instead of the model's (1000000: a 1M model)")
    parser.add_argument("--stub-head-chars", type=_ints, help="instead of the policy's (a,b,..)")
    parser.add_argument("--keep-results", type=_ints, help="instead of the policy's (a,b,..)")
    parser.add_argument("--keep-tokens", type=_ints, help="instead of the policy's (a,b,..)")
    args = parser.parse_args()
    base = policy_for(args.model, DEFAULT_POLICIES)
    if args.window is not None:
        base = dataclasses.replace(base, window=args.window)
    heads = args.stub_head_chars or [base.stub_head_chars]
    keeps = args.keep_results or [base.keep_results]
    bounds = args.keep_tokens or [base.keep_results_tokens]
    counter = default_counter()
    traces = [(trace, list(load_trace(trace))) for trace in args.traces]
    for head, keep, bound in itertools.product(heads, keeps, bounds):
        policy = dataclasses.replace(
            base, stub_head_chars=head, keep_results=keep, keep_results_tokens=bound
        )
        rules = rules_for(policy)
        if args.keep_last is not None:
            rules = dataclasses.replace(rules, keep_last=args.keep_last)
        if args.summary_tokens is not None:
            rules = dataclasses.replace(rules, summary_tokens=args.summary_tokens)
        within = f"{rules.keep_tokens:,}" if rules.keep_tokens else "any"
        print(
            f"rules: window {rules.window:,}, keep_last {rules.keep_last}, keep_results"
            f" {rules.keep_results} within {within} tokens, summary"
            f" {rules.summary_tokens:,} tokens, offload_threshold {policy.offload_threshold:,},"
            f" stub head {policy.stub_head_chars} characters"
        )
        for trace, bodies in traces:
            started = time.perf_counter()
            shape = shape_of(bodies, counter, policy)
            floor = cheapest(shape, rules)
            plain = unmanaged(shape)
            took = time.perf_counter() - started
            if floor is None:
                print(f"{trace.name}: no schedule keeps every request in the window ({took:.1f} s)")
                continue
            print(
                f"{trace.name}: {len(shape.requests)} requests; unmanaged {plain:,.0f} units;"
                f" floor {floor.cost:,.0f} units (**{floor.cost / plain:.3f}x**); folds at"
                f" {floor.folds or 'none'} (summariser {floor.summariser_cost:,.0f});"
                f" {len(floor.offloads)} offload steps; largest request {floor.largest:,}"
                f" ({took:.1f} s)"
            )
            parts = bill(shape, rules, floor.states)
            print("  pays for: " + ", ".join(f"{p} {parts[p] / plain:.3f}x" for p in PARTS))
            tail = sum(bill(shape, rules, floor.states, uncached_tail=True).values())
            print(
                f"  the same schedule with each result the next request stubs sent uncached:"
                f" {tail:,.0f} units ({tail / plain:.3f}x)"
            )


def _ints(text: str) -> list[int]:
    return [int(part) for part in text.split(",")]


if __name__ == "__main__":
    main()
