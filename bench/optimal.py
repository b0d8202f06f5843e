"""The cost floor of a recorded conversation: its cheapest schedule of offloads and folds.

For each trace (bench/make_trace.py), proxy/ops/optimal.py finds the schedule of offload
and fold points that minimises the prompt-cache bill (read 0.1, write 1.25, output 5)
with every request inside the window, under the rules of the policy given (its window,
keep_last, keep_results, offload_threshold, stub head and summary cap; an ideal cache:
see that module's docstring for exactly what it optimises over and assumes), and prints
it next to the unmanaged run (unlimited window, same ideal cache):

    .venv/bin/python bench/optimal.py /tmp/agent-60.jsonl /tmp/chat-160.jsonl
"""

from __future__ import annotations

import argparse
import dataclasses
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from proxy.core.policy import DEFAULT_POLICIES, policy_for  # noqa: E402
from proxy.core.tokens import default_counter  # noqa: E402
from proxy.ops.optimal import cheapest, rules_for, shape_of, unmanaged  # noqa: E402
from proxy.ops.requests import load_trace  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("traces", nargs="+", type=Path)
    parser.add_argument("--model", default="claude-test-1", help="whose default policy")
    parser.add_argument("--keep-last", type=int, help="instead of the policy's")
    parser.add_argument("--summary-tokens", type=int, help="instead of the policy's cap")
    parser.add_argument("--window", type=int, help="instead of the model's (1000000: a 1M model)")
    args = parser.parse_args()
    policy = policy_for(args.model, DEFAULT_POLICIES)
    if args.window is not None:
        policy = dataclasses.replace(policy, window=args.window)
    rules = rules_for(policy)
    if args.keep_last is not None:
        rules = type(rules)(rules.window, args.keep_last, rules.keep_results, rules.summary_tokens)
    if args.summary_tokens is not None:
        rules = type(rules)(rules.window, rules.keep_last, rules.keep_results, args.summary_tokens)
    print(
        f"rules: window {rules.window:,}, keep_last {rules.keep_last}, keep_results"
        f" {rules.keep_results}, summary {rules.summary_tokens:,} tokens, offload_threshold"
        f" {policy.offload_threshold:,}, stub head {policy.stub_head_chars} characters"
    )
    counter = default_counter()
    for trace in args.traces:
        started = time.perf_counter()
        shape = shape_of(list(load_trace(trace)), counter, policy)
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


if __name__ == "__main__":
    main()
