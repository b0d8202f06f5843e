"""What writing a rewrite with the client's bytes kept costs (proxy/core/exact_json.py).

A 1 MB Messages request (Claude Code's recorded turn, its history repeated with fresh
tool ids until 1 MB), rewritten as an offload step would: the oldest tool result's
message replaced by a rebuilt one, the rest kept. Three spellings of the same body:
compact (what agents send), compact with one integer beyond 64 bits in an old tool call,
and Python's json.dumps default (spaces after separators, non-ASCII escaped). Times are
the median of repeated runs, against orjson.dumps of the rewritten body (what a rewrite
cost before), in one run.

    python bench/exact_json.py [--size 1000000]
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path
from typing import Any

import orjson

from proxy.core.exact_json import ClientJSON

FIXTURE = Path("/work/shared/fixtures/agent-requests/claude-code-turn7.json")


def grown(size: int) -> dict[str, Any]:
    body = orjson.loads(FIXTURE.read_bytes())["body"]
    base = body["messages"]
    messages: list[Any] = []
    n = 0
    while len(orjson.dumps({**body, "messages": messages})) < size:
        n += 1
        copy = orjson.loads(orjson.dumps(base).replace(b"toolu_", f"toolu_{n}x".encode()))
        messages.extend(copy[:-1] if messages else copy)
    messages.append(base[-1])
    return {**body, "messages": messages}


def rewrite(parsed: dict[str, Any]) -> dict[str, Any]:
    messages = list(parsed["messages"])
    for i, m in enumerate(messages):
        if m["role"] == "user" and isinstance(m["content"], list):
            messages[i] = {**m, "content": [*m["content"][:-1], {"type": "text", "text": "stub"}]}
            break
    return {**parsed, "messages": messages}


def timed(run: Any, repeat: int = 15) -> float:
    times = []
    for _ in range(repeat):
        start = time.perf_counter()
        run()
        times.append(time.perf_counter() - start)
    return statistics.median(times) * 1000


def case(name: str, raw: bytes) -> None:
    parsed = orjson.loads(raw)
    value = rewrite(parsed)
    baseline = timed(lambda: orjson.dumps(value))
    exact = timed(lambda: ClientJSON(raw, parsed).encode(value))
    print(
        f"{name:34} {len(raw) / 1e6:5.2f} MB  orjson.dumps {baseline:6.2f} ms"
        f"  exact {exact:6.2f} ms  ({exact / baseline:4.1f}x)"
    )


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--size", type=int, default=1_000_000)
    size = parser.parse_args().size
    body = grown(size)
    compact = orjson.dumps(body)
    case("compact (canonical)", compact)
    call = next(
        b
        for m in body["messages"]
        if m["role"] == "assistant" and isinstance(m["content"], list)
        for b in m["content"]
        if b.get("type") == "tool_use"
    )
    marker = b'"id":' + orjson.dumps(call["id"])
    huge = compact.replace(marker, b'"build":123456789012345678901234567890,' + marker, 1)
    case("compact, one integer > 64 bits", huge)
    case("json.dumps default (spaces, \\u escapes)", json.dumps(body).encode())


if __name__ == "__main__":
    main()
