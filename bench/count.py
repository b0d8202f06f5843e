"""Counting a ~200,000-token agent history cold (fresh counter) vs warm (one new turn).

Run: .venv/bin/python bench/count.py [--repeats N]

The history looks like a coding agent's: a long system prompt, tool definitions with
JSON schemas, then many turns of assistant text + tool_use and user tool_result holding
source code, logs and JSON. Every turn is distinct, so a cold count really encodes it all.
Target: warm at most 5% of cold.
"""

from __future__ import annotations

import argparse
import random
import statistics
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import orjson

from proxy.core.tokens import TokenCounter

VOCABULARY = (
    "the request handler config value cache token budget history message group result file "
    "path error retry stream event block index parse encode decode write read user assistant "
    "system tool call summary state checkpoint offset length limit"
)
WORDS = VOCABULARY.split()
TOOLS = ["Read", "Bash", "Grep", "Edit", "Write", "Glob", "WebFetch", "TodoWrite"]


def prose(rng: random.Random, words: int) -> str:
    sentences = []
    while words > 0:
        n = min(words, rng.randint(6, 18))
        words -= n
        sentences.append(" ".join(rng.choice(WORDS) for _ in range(n)).capitalize() + ".")
    return " ".join(sentences)


def code(rng: random.Random, lines: int) -> str:
    out = []
    for i in range(lines):
        name, word, n = (
            f"{rng.choice(WORDS)}_{rng.choice(WORDS)}",
            rng.choice(WORDS),
            rng.randint(0, 999),
        )
        kind = rng.randrange(5)
        if kind == 0:
            out.append(f"{i + 1:>6}\tdef {name}(self, {word}: int = {n}) -> str:")
        elif kind == 1:
            out.append(
                f"{i + 1:>6}\t    return self._{name}[{rng.randint(0, 64)}] + {rng.random():.4f}"
            )
        elif kind == 2:
            out.append(f"{i + 1:>6}\t    # {prose(rng, rng.randint(4, 12))}")
        elif kind == 3:
            out.append(f'{i + 1:>6}\t    {name} = {{"{word}": {n}, "ok": True}}')
        else:
            out.append(
                f"{i + 1:>6}\t    if {name} is None or len({name}) > {rng.randint(1, 4096)}:"
            )
    return "\n".join(out)


def log(rng: random.Random, lines: int) -> str:
    levels = ["INFO", "DEBUG", "WARN", "ERROR"]
    out = []
    for _ in range(lines):
        minute, second, ms = rng.randint(0, 59), rng.randint(0, 59), rng.randint(0, 999)
        stamp = f"2026-11-29T13:{minute:02d}:{second:02d}.{ms:03d}Z"
        where = f"[{rng.choice(WORDS)}.{rng.choice(WORDS)}] req={rng.getrandbits(48):012x}"
        what = f"{prose(rng, rng.randint(3, 10))} took={rng.randint(1, 900)}ms"
        out.append(f"{stamp} {rng.choice(levels):5} {where} {what}")
    return "\n".join(out)


def json_output(rng: random.Random, items: int) -> str:
    rows = [
        {
            "id": rng.getrandbits(32),
            "name": f"{rng.choice(WORDS)}-{i}",
            "tags": rng.sample(WORDS, 3),
            "score": rng.random(),
        }
        for i in range(items)
    ]
    return orjson.dumps({"count": items, "items": rows}).decode()


def tool_definitions(rng: random.Random) -> list[dict[str, Any]]:
    return [
        {
            "name": name,
            "description": prose(rng, 150),
            "input_schema": {
                "type": "object",
                "properties": {
                    f"{rng.choice(WORDS)}_{j}": {
                        "type": rng.choice(["string", "integer"]),
                        "description": prose(rng, 20),
                    }
                    for j in range(5)
                },
                "required": [],
            },
        }
        for name in TOOLS
    ]


def turn(rng: random.Random, n: int) -> list[dict[str, Any]]:
    """One assistant tool call and its result, sized like a real agent step."""
    tool = rng.choice(TOOLS[:4])
    kind = rng.randrange(3)
    result = (
        code(rng, rng.randint(40, 160))
        if kind == 0
        else log(rng, rng.randint(30, 120))
        if kind == 1
        else json_output(rng, rng.randint(10, 60))
    )
    call_id = f"toolu_{n:06d}"
    return [
        {
            "role": "assistant",
            "content": [
                {"type": "text", "text": prose(rng, rng.randint(10, 60))},
                {
                    "type": "tool_use",
                    "id": call_id,
                    "name": tool,
                    "input": {"path": f"/src/{rng.choice(WORDS)}/{n}.py", "limit": 400},
                },
            ],
        },
        {
            "role": "user",
            "content": [{"type": "tool_result", "tool_use_id": call_id, "content": result}],
        },
    ]


def history(target_tokens: int, seed: int = 1) -> dict[str, Any]:
    rng = random.Random(seed)
    body: dict[str, Any] = {
        "model": "claude-x",
        "max_tokens": 8192,
        "system": [{"type": "text", "text": prose(rng, 2500)}],
        "tools": tool_definitions(rng),
        "messages": [{"role": "user", "content": prose(rng, 80)}],
    }
    counter = TokenCounter()
    n = 0
    while counter.count_request(body) < target_tokens:
        body["messages"].extend(turn(rng, n))
        n += 1
    return body


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--repeats", type=int, default=7)
    parser.add_argument("--tokens", type=int, default=200_000)
    args = parser.parse_args()

    body = history(args.tokens)
    size = len(orjson.dumps(body))
    TokenCounter().count_text("load the encoding before timing anything")

    colds, warms, unchanged = [], [], []
    for i in range(args.repeats):
        grown = {**body, "messages": [*body["messages"], *turn(random.Random(1000 + i), 10**6 + i)]}
        counter = TokenCounter()
        start = time.perf_counter()
        total = counter.count_request(body)
        colds.append(time.perf_counter() - start)
        start = time.perf_counter()
        grown_total = counter.count_request(grown)
        warms.append(time.perf_counter() - start)
        start = time.perf_counter()
        counter.count_request(grown)
        unchanged.append(time.perf_counter() - start)

    cold, warm = statistics.median(colds), statistics.median(warms)
    print(f"history: {total:,} tokens, {len(body['messages'])} messages, {size / 1e6:.2f} MB JSON")
    print(f"one new turn: +{grown_total - total:,} tokens")
    print(
        f"cold (fresh counter):         median {cold * 1e3:8.2f} ms  min {min(colds) * 1e3:8.2f} ms"
    )
    print(
        f"warm (same counter, +1 turn): median {warm * 1e3:8.2f} ms  min {min(warms) * 1e3:8.2f} ms"
    )
    print(f"warm (same counter, nothing new): median {statistics.median(unchanged) * 1e3:.2f} ms")
    print(f"warm / cold: {warm / cold:.2%} (target <= 5%), {args.repeats} repeats")

    pathological = "a" * 2_000_000
    start = time.perf_counter()
    TokenCounter().count_text(pathological)
    print(f"2 MB without whitespace: {(time.perf_counter() - start) * 1e3:.1f} ms")


if __name__ == "__main__":
    main()
