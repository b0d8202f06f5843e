"""The walk of issue 25: which modules one offloaded Anthropic streaming request with one
read_result round passes, and how often it re-enters a module it had left.

Usage: python bench/walk.py [--top 15] [--tree DIR] [--sequence] [--functions]

The tree measured is --tree, else the first PYTHONPATH entry holding a `proxy` package,
else this script's own tree; so `git archive <commit> | tar -x -C DIR` and
`PYTHONPATH=DIR python bench/walk.py` measures an old commit with today's script.

Everything runs in this process but Redis: a private embedded Redis (proxy/store/
embedded.py, a temporary directory, removed afterwards), the stand-in upstream
(proxy/testing) on its own thread and event loop, the proxy (`proxy.server.app.start`)
with one small policy, and an aiohttp client on the main loop. Two requests:

1. set-up (not measured): a task and three large tool results; the history is over the
   policy's offload trigger, so the two older results are offloaded (the newest is kept);
   the stand-in answers with another tool call;
2. measured, streaming: that history, the stand-in's call and a fourth large result, so
   the third result leaves the keep window (an incremental offload: the request is a
   crossing, loaded and saved in Redis); the stand-in is scripted (`read_result: true`)
   to call read_result once for the first stub; the proxy answers that round itself and
   the stand-in then writes text, which streams back (route -> compactor -> driver ->
   executor -> store -> upstream -> read rounds -> merger -> calibration).

Tracing, during the measured request only, from just before it is sent until every task
it started has finished: `sys.setprofile` on the main thread and on the threads of the
loop's default executor (the driver steps and counting run there via asyncio.to_thread).
An event counts when it is the start of a Python function whose file is under proxy/ but
not proxy/testing/ (module bodies left out); on the main thread only when the running
task is none that existed before (the proxy's periodic tasks are not the walk).

Definitions:
- an entry is a fresh call of a traced function: a coroutine or generator resumed (after
  an await, or when the executor sends the driver its next reply) is not a new entry;
- a module is its path under proxy/ (`wire/anthropic.py`);
- the walk is the sequence of the entries' modules with consecutive repeats collapsed
  (a module calling its own functions stays in it); a module is left when the walk
  moves on to another module and re-entered when it comes back to it;
- modules passed: the distinct modules of the walk; re-entries of a module: its
  appearances in the walk after its first; the total is the walk's length less the
  modules passed.
Three measures, on the same trace, differing in the entries the walk is made of:
- every call: all entries (a loop over blocks or SSE events re-enters at each turn);
- first calls: only the first entry of each function (the walk as read: a function
  called again, from a loop or elsewhere, is not read again);
- first calls, no leaves (issue 25's): those first entries that entered another traced
  function before returning; a leaf helper's (an accessor, a predicate, a record setter,
  a counter's count) are left out. Of the definitions tried on dabb9f8, the commit the
  issue counted on, this one gives its figures best: 31 modules, 60 re-entries,
  wire/anthropic.py 9, core/checkpoint.py 5 (every call: 42 and 271; first calls: 42
  and 104; bench/RESULTS.md, "walk.py").
"""

from __future__ import annotations

import argparse
import asyncio
import os
import shutil
import sys
import tempfile
import threading
import time
from collections import Counter
from collections.abc import Iterable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from types import CodeType, FrameType
from typing import Any

HERE = Path(__file__).resolve().parents[1]
# CO_GENERATOR, CO_COROUTINE, CO_ITERABLE_COROUTINE, CO_ASYNC_GENERATOR: frames resumed
RESUMABLE = 0x20 | 0x80 | 0x100 | 0x200


def tree_to_measure(given: str | None) -> Path:
    if given:
        return Path(given).resolve()
    for entry in os.environ.get("PYTHONPATH", "").split(os.pathsep):
        if entry and (Path(entry) / "proxy" / "__init__.py").is_file():
            return Path(entry).resolve()
    return HERE


# -- counting (pure) --------------------------------------------------------------------


@dataclass(frozen=True)
class Entry:
    """One fresh call of a traced function, in the order the calls began."""

    module: str
    function: str
    leaf: bool  # entered no other traced function before returning


@dataclass(frozen=True)
class Walk:
    sequence: tuple[str, ...]  # modules, consecutive repeats collapsed
    reentries: Counter[str]

    @property
    def passed(self) -> int:
        return len(set(self.sequence))

    @property
    def total_reentries(self) -> int:
        return sum(self.reentries.values())


def collapse(modules: Iterable[str]) -> tuple[str, ...]:
    walk: list[str] = []
    for module in modules:
        if not walk or walk[-1] != module:
            walk.append(module)
    return tuple(walk)


def walk_of(modules: Iterable[str]) -> Walk:
    sequence = collapse(modules)
    seen: set[str] = set()
    reentries: Counter[str] = Counter()
    for module in sequence:
        if module in seen:
            reentries[module] += 1
        seen.add(module)
    return Walk(sequence, reentries)


def every_call(entries: Sequence[Entry]) -> Walk:
    return walk_of(e.module for e in entries)


def first_calls(entries: Iterable[Entry]) -> list[Entry]:
    """The first call of each function only: a loop over blocks or events, or a helper
    called again, is read once."""
    seen: set[tuple[str, str]] = set()
    first = []
    for entry in entries:
        if (entry.module, entry.function) not in seen:
            seen.add((entry.module, entry.function))
            first.append(entry)
    return first


def read_once(entries: Sequence[Entry]) -> Walk:
    return walk_of(e.module for e in first_calls(entries))


def read_once_no_leaves(entries: Sequence[Entry]) -> Walk:
    """Issue 25's measure: first calls, those that entered no other traced function
    (leaf helpers) left out."""
    return walk_of(e.module for e in first_calls(entries) if not e.leaf)


MEASURES = {
    "every call": every_call,
    "first calls": read_once,
    "first calls, no leaves": read_once_no_leaves,
}


# -- tracing ----------------------------------------------------------------------------


@dataclass(slots=True)
class _Call:
    module: str
    function: str
    leaf: bool = True


class Tracer:
    """A profile hook recording fresh calls of the proxy's functions. Per thread, a stack
    of the traced frames running (a resumed one with the call that started it), so that
    a call marks the one it came from as no leaf."""

    def __init__(self, tree: Path) -> None:
        proxy = tree / "proxy"
        self.roots = tuple({f"{proxy}{os.sep}", f"{os.path.realpath(proxy)}{os.sep}"})
        self.modules: dict[CodeType, str] = {}  # "" for code not traced
        self.calls: list[_Call] = []
        self.stacks: dict[int, list[tuple[FrameType, _Call]]] = {}
        # Coroutine and generator frames started, by id, kept alive so no other takes it.
        self.started: dict[int, tuple[FrameType, _Call]] = {}
        self.active = False
        self.loop: asyncio.AbstractEventLoop | None = None
        self.tasks_before: set[asyncio.Task[Any]] = set()

    def module_of(self, code: CodeType) -> str:
        module = self.modules.get(code)
        if module is None:
            module = ""
            if code.co_name != "<module>":
                for root in self.roots:
                    if code.co_filename.startswith(root):
                        relative = code.co_filename[len(root) :].replace(os.sep, "/")
                        module = "" if relative.startswith("testing/") else relative
            self.modules[code] = module
        return module

    def hook(self, frame: FrameType, event: str, arg: object) -> None:
        if not self.active or (event != "call" and event != "return"):
            return
        code = frame.f_code
        if not self.module_of(code):
            return
        stack = self.stacks.setdefault(threading.get_ident(), [])
        if event == "return":  # a return, a yield, an await that suspends, or a raise
            if stack and stack[-1][0] is frame:
                stack.pop()
            return
        resumed = self.started.get(id(frame))
        if resumed is not None:
            stack.append((frame, resumed[1]))
            return
        if self.loop is not None and threading.current_thread() is threading.main_thread():
            task = asyncio.current_task(self.loop)
            if task is not None and task in self.tasks_before:
                return
        call = _Call(self.modules[code], code.co_qualname)
        self.calls.append(call)
        if stack:
            stack[-1][1].leaf = False
        stack.append((frame, call))
        if code.co_flags & RESUMABLE:
            self.started[id(frame)] = (frame, call)

    def install_in_thread(self) -> None:
        sys.setprofile(self.hook)

    def entries(self) -> list[Entry]:
        return [Entry(c.module, c.function, c.leaf) for c in self.calls]


# -- the two requests -------------------------------------------------------------------

POLICY: dict[str, Any] = {
    "match": "*",
    "window": 200_000,  # the stand-in's
    "offload_trigger": 2_000,  # three results of about 2,400 tokens are well over it
    "offload_threshold": 300,
    "keep_results": 1,
    "keep_last": 2,
    "stub_head_chars": 200,
    "max_read_rounds": 2,
}
RESULT_CHARS = 6_000
TOOLS = [{"name": "Bash", "description": "run", "input_schema": {"type": "object"}}]
READ_ONCE = '{"read_result": true}'
CALL_BASH = '{"tool": {"name": "Bash", "input": {"cmd": "pytest"}}}'


def tool_round(n: int, output: str) -> list[dict[str, Any]]:
    call = {"type": "tool_use", "id": f"toolu_{n:03d}", "name": "Bash", "input": {"n": n}}
    result = {"type": "tool_result", "tool_use_id": call["id"], "content": output}
    return [{"role": "assistant", "content": [call]}, {"role": "user", "content": [result]}]


def headers(script: str) -> dict[str, str]:
    return {
        "x-api-key": "sk-walk",
        "anthropic-version": "2023-06-01",
        "content-type": "application/json",
        "x-stand-in": script,
        "connection": "close",  # the server's connection task ends with the answer
    }


class StandInThread:
    """The stand-in upstream on its own thread and loop: its counting (proxy.core.tokens)
    is not traced, since only the main thread and the proxy's executor are."""

    def __init__(self) -> None:
        self.url = ""
        self.recorded: list[Any] = []  # the requests it received (app[RECORDED])
        self._ready = threading.Event()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._stop: asyncio.Event | None = None
        self._thread = threading.Thread(target=lambda: asyncio.run(self._serve()), daemon=True)

    async def _serve(self) -> None:
        from proxy.testing.standin import RECORDED, StandInOptions, start

        runner, self.url = await start("127.0.0.1", 0, StandInOptions())
        self.recorded = runner.app[RECORDED]
        self._loop, self._stop = asyncio.get_running_loop(), asyncio.Event()
        self._ready.set()
        try:
            await self._stop.wait()
        finally:
            await runner.cleanup()

    def __enter__(self) -> StandInThread:
        self._thread.start()
        if not self._ready.wait(30):
            raise RuntimeError("the stand-in did not start")
        return self

    def __exit__(self, *exc: object) -> None:
        if self._loop is not None and self._stop is not None:
            self._loop.call_soon_threadsafe(self._stop.set)
        self._thread.join(10)


async def settle(before: set[asyncio.Task[Any]], within: float = 10.0) -> None:
    """Wait for the tasks started since `before` (the server's handler and what it left
    running) to finish."""
    deadline = time.monotonic() + within
    while time.monotonic() < deadline:
        me = asyncio.current_task()
        pending = [t for t in asyncio.all_tasks() if t not in before and t is not me]
        if not pending:
            return
        await asyncio.wait(pending, timeout=deadline - time.monotonic())


async def post(session: Any, url: str, body: dict[str, Any], script: str) -> bytes:
    async with session.post(f"{url}/v1/messages", json=body, headers=headers(script)) as answer:
        raw: bytes = await answer.read()
        if answer.status != 200:
            raise RuntimeError(f"HTTP {answer.status}: {raw[:500]!r}")
        strategy = answer.headers.get("x-compaction-strategy", "")
        print(f"  answer: {answer.status}, {len(raw)} bytes, x-compaction-strategy {strategy!r}")
        return raw


def model_calls(recorded: Sequence[Any]) -> int:
    """Messages requests the stand-in received, the proxy's own (summaries) left out."""
    return sum(
        1
        for r in recorded
        if r.path_qs.split("?")[0] == "/v1/messages"
        and "x-compaction-proxy-purpose" not in {k.lower() for k in r.headers}
    )


async def send_requests(tree: Path, tracer: Tracer, redis_url: str, standin: StandInThread) -> None:
    import dataclasses

    import aiohttp
    import orjson

    from proxy.config import load_settings
    from proxy.server.app import start
    from proxy.testing.agent import tool_output

    loop = asyncio.get_running_loop()
    # The default executor's threads carry the hook (inactive until the measured request).
    loop.set_default_executor(ThreadPoolExecutor(initializer=tracer.install_in_thread))
    tracer.loop = loop
    overrides = {
        "server.port": 0,
        "upstream.url": standin.url,
        "store.redis_url": redis_url,
        "store.key_prefix": "walk:",
    }
    config = tree / "config" / "proxy.toml"  # the tree's own defaults, whatever the cwd
    settings = load_settings(config if config.is_file() else None, environ={}, overrides=overrides)
    proxy = await start(dataclasses.replace(settings, policies=(POLICY,)))
    try:
        messages: list[dict[str, Any]] = [{"role": "user", "content": "Find the failing test."}]
        for n in range(3):
            messages += tool_round(n, tool_output(n, RESULT_CHARS))
        body: dict[str, Any] = {"model": "claude-test", "max_tokens": 300, "tools": TOOLS}
        async with aiohttp.ClientSession() as session:
            print("set-up request (not measured)")
            before = set(asyncio.all_tasks())
            raw = await post(session, proxy.url, {**body, "messages": messages}, CALL_BASH)
            call = next(b for b in orjson.loads(raw)["content"] if b["type"] == "tool_use")
            messages.append({"role": "assistant", "content": [call]})
            result = {"type": "tool_result", "tool_use_id": call["id"]}
            result["content"] = tool_output(3, RESULT_CHARS)
            messages.append({"role": "user", "content": [result]})
            await settle(before)
            await asyncio.sleep(0.2)

            print("measured request (stream, one read_result round)")
            measured = {**body, "messages": messages, "stream": True}
            calls_before = model_calls(standin.recorded)
            tracer.tasks_before = set(asyncio.all_tasks())
            tracer.active = True
            sys.setprofile(tracer.hook)
            try:
                raw = await post(session, proxy.url, measured, READ_ONCE)
                await settle(tracer.tasks_before)
            finally:
                sys.setprofile(None)
                tracer.active = False
        rounds = model_calls(standin.recorded) - calls_before
        print(f"  the model was called {rounds} times")
        if rounds != 2 or b"read_result" in raw:
            raise RuntimeError("the measured request did not have exactly one read round")
    finally:
        await proxy.stop()


@dataclass(frozen=True)
class Run:
    entries: list[Entry]
    seconds: float


def run(tree: Path) -> Run:
    sys.path.insert(0, str(tree))
    from proxy.store.embedded import EmbeddedRedis

    tracer = Tracer(tree)
    state = Path(tempfile.mkdtemp(prefix="walk-redis-"))
    began = time.monotonic()
    try:
        with EmbeddedRedis(state, role="bench") as redis, StandInThread() as standin:
            asyncio.run(send_requests(tree, tracer, redis.url, standin))
    finally:
        shutil.rmtree(state, ignore_errors=True)
    return Run(tracer.entries(), time.monotonic() - began)


# -- report -----------------------------------------------------------------------------


def table(walks: dict[str, Walk], top: int) -> Iterator[str]:
    names = list(walks)
    yield "| | " + " | ".join(names) + " |"
    yield "|---|" + "---:|" * len(names)
    yield "| modules passed | " + " | ".join(str(w.passed) for w in walks.values()) + " |"
    yield "| re-entries | " + " | ".join(str(w.total_reentries) for w in walks.values()) + " |"
    yield "| walk length | " + " | ".join(str(len(w.sequence)) for w in walks.values()) + " |"
    for name, walk in walks.items():
        most = ", ".join(f"{m} {n}" for m, n in walk.reentries.most_common(top))
        yield f"\nmost re-entered, {name}: {most or 'none'}"


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--top", type=int, default=15, help="re-entered modules listed")
    parser.add_argument("--tree", help="the source tree to measure (holding proxy/)")
    parser.add_argument("--sequence", action="store_true", help="print issue 25's walk")
    parser.add_argument(
        "--functions", action="store_true", help="print the entries of issue 25's walk"
    )
    args = parser.parse_args(argv)
    tree = tree_to_measure(args.tree)
    print(f"tree {tree}, Python {sys.version.split()[0]}, load average {os.getloadavg()[0]:.2f}")
    measured = run(tree)
    entries = measured.entries
    walks = {name: measure(entries) for name, measure in MEASURES.items()}
    print(f"{len(entries)} calls traced, of {len(first_calls(entries))} functions")
    print("\n".join(table(walks, args.top)))
    if args.sequence:
        issue = walks["first calls, no leaves"]
        print("\nthe walk (first calls, no leaves): " + " -> ".join(issue.sequence))
    if args.functions:  # which function entered each module (a re-entry marked *)
        print("\nits entries:")
        seen: set[str] = set()
        last = ""
        for entry in first_calls(entries):
            if entry.leaf:
                continue
            mark = "*" if entry.module in seen and entry.module != last else " "
            print(f"  {mark} {entry.module} {entry.function}")
            seen.add(entry.module)
            last = entry.module
    print(f"\n({measured.seconds:.1f} s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
