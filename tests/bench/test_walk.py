"""bench/walk.py: how a walk is counted, what the tracer takes for an entry, and that the
script still runs end to end on this tree (the issue 25 walk stays measurable)."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
from collections import Counter
from pathlib import Path
from typing import Any

from bench.walk import (
    Entry,
    Tracer,
    every_call,
    read_once,
    read_once_no_leaves,
    walk_of,
)

ROOT = Path(__file__).resolve().parents[2]

B = """
def helper(x):
    return x + 1

def gen(n):
    for i in range(n):
        yield helper(i)
"""
A = """
import asyncio

def tail():
    return 0

def outer():
    total = sum(gen(3))
    tail()
    return helper(total)

async def coro():
    await asyncio.sleep(0)
    await asyncio.sleep(0)
    return outer()
"""
T = """
def standin():
    return helper(0)
"""


def test_a_walk_collapses_repeats_and_counts_each_return_to_a_module_left() -> None:
    walk = walk_of(["a", "a", "b", "a", "c", "c", "b", "a"])
    assert walk.sequence == ("a", "b", "a", "c", "b", "a")
    assert walk.passed == 3
    assert walk.reentries == Counter({"a": 2, "b": 1})
    assert walk.total_reentries == len(walk.sequence) - walk.passed


def test_first_calls_read_a_function_once_and_leaves_drop_out() -> None:
    entries = [
        Entry("a", "outer", leaf=False),
        Entry("b", "helper", leaf=True),
        Entry("a", "tail", leaf=True),
        Entry("b", "helper", leaf=True),
        Entry("b", "work", leaf=False),
    ]
    assert every_call(entries).sequence == ("a", "b", "a", "b")
    assert read_once(entries).sequence == ("a", "b", "a", "b")  # helper once, then work
    assert read_once_no_leaves(entries).sequence == ("a", "b")


def _load(tree: Path, name: str, source: str, names: dict[str, Any]) -> dict[str, Any]:
    space = dict(names)
    exec(compile(source, str(tree / "proxy" / name), "exec"), space)
    return space


def test_the_tracer_counts_fresh_calls_of_proxy_code_and_knows_leaves(tmp_path: Path) -> None:
    b = _load(tmp_path, "b.py", B, {})
    a = _load(tmp_path, "a.py", A, {"gen": b["gen"], "helper": b["helper"]})
    t = _load(tmp_path, "testing/t.py", T, {"helper": b["helper"]})
    tracer = Tracer(tmp_path)
    tracer.active = True
    sys.setprofile(tracer.hook)
    try:
        asyncio.run(a["coro"]())
        t["standin"]()
    finally:
        sys.setprofile(None)
    calls = [(e.module, e.function, e.leaf) for e in tracer.entries()]
    # A coroutine resumed after each await, a generator after each item: one entry each;
    # proxy/testing is not the proxy (the helper it calls is).
    assert calls == [
        ("a.py", "coro", False),
        ("a.py", "outer", False),
        ("b.py", "gen", False),
        *[("b.py", "helper", True)] * 3,
        ("a.py", "tail", True),
        ("b.py", "helper", True),
        ("b.py", "helper", True),
    ]
    assert every_call(tracer.entries()).reentries == Counter({"a.py": 1, "b.py": 1})


# The most re-entries the walk of this tree may take (first calls, no leaves): what it
# takes today (bench/RESULTS.md, "walk.py"); lower it as the walk gets shorter, and say
# in the commit why when a change must raise it.
MOST_REENTRIES = 30


def test_the_walk_runs_on_this_tree_and_reads_route_exchange_driver_transport_merger() -> None:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    done = subprocess.run(
        [sys.executable, str(ROOT / "bench" / "walk.py"), "--top", "3", "--sequence"],
        capture_output=True,
        text=True,
        env=env,
        timeout=90,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    assert "the model was called 2 times" in done.stdout
    assert "| modules passed |" in done.stdout
    line = next(x for x in done.stdout.splitlines() if x.startswith("the walk (first calls"))
    walk = walk_of(line.partition(": ")[2].split(" -> "))
    assert walk.total_reentries <= MOST_REENTRIES, walk.reentries.most_common(10)
    seq = walk.sequence
    # The route hands the request to one exchange, and neither is ever gone back to.
    assert seq.count("server/routes.py") == seq.count("server/exchange.py") == 1
    # Then the compaction driver decides, and is done before anything is sent upstream.
    driver = [n for n, m in enumerate(seq) if m == "core/driver.py"]
    sent = seq.index("server/upstream.py")
    assert seq.index("server/exchange.py") < driver[0] and driver[-1] < sent
    # The read rounds' driver sends round 1 through the transport; the merger reads it.
    rounds = seq.index("core/rounds.py")
    assert driver[-1] < rounds < sent < seq.index("wire/anthropic_rounds.py")
    assert seq[rounds:sent].count("server/http_transport.py") == 1
