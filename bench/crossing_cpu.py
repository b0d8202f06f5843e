"""CPU per request on what agents send, as a ratio to a bare byte relay, in one run.

Requests go through `compaction-proxy serve` at the shipped settings (config/proxy.toml;
its own Redis, started here) and, with the same bodies, through the floor of any Python
relay (overhead.py's bare aiohttp byte relay), each to a stand-in upstream of its own.
Two workloads (`--workloads`, both by default), each with two lines:

- session (the default): the recorded Claude Code session (bench/sessions/, made by
  bench/record_session.py: 43 requests of claude-opus-5-5 with its 1M window, a 15-30 KB
  result from Read, Grep or Bash each turn, growing to 0.9 MB), replayed as
  `--conversations` conversations with fresh results (bench/fresh_session.py), 4 at a
  time, at the shipped policy:
  - crossing: every request of each conversation (the history crosses the offload
    trigger early and the fold trigger later on: the requests the proxy rewrites);
  - first: the first three requests of four times as many other new conversations,
    under every threshold (forwarded untouched);
- synthetic (the earlier workload): the recorded turn tests/fixtures/agent-requests/
  claude-code-turn7.json (its system prompt, 31 KB of tool definitions, first message and
  options) as conversations of 24 turns, each a Bash call with its own fresh 3-9 KB result
  from bench/codec.py's corpus, sent as model claude-opus-5-5-synthetic, whose policy
  lowers the offload trigger to `--offload-trigger` (4,000) so results are offloaded as
  they age:
  - crossing: turns 4-23 (turns 0-3 sent first, not measured): each a crossing;
  - small: the first two turns of new conversations as claude-sonnet-4-5, under every
    threshold.

For each line: the CPU time of the serve process (every thread's, /proc schedstat) over
its requests, per request, and the same for the relay; the ratio proxy / relay (the
targets are measured one after the other, in another order at each repeat). Also the Redis
commands per request (INFO commandstats) for the first and the second half of the
crossing lines' turns: they should not grow with the conversation. Each repeat uses fresh
conversations and fresh results (nothing counted before); --profile DIR runs py-spy on
each serve process and the relay during the measured requests of each line; --before DIR
runs a second serve from another version's source tree (e.g. `git archive` of the base
commit unpacked in DIR), with its own Redis, on the same requests in the same run.

    .venv/bin/python bench/crossing_cpu.py [--conversations 32] [--repeat 3]
        [--workloads session,synthetic] [--profile DIR] [--before DIR] [--offload-trigger 4000]
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import platform
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import aiohttp
import orjson

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

from fleet_load import Outputs, Servers  # noqa: E402
from fresh_session import SESSION, FreshSessions, Request  # noqa: E402
from overhead import free_port, process, wait_ready  # noqa: E402

from proxy.store import EmbeddedRedis  # noqa: E402

SYNTHETIC = ROOT / "tests" / "fixtures" / "agent-requests" / "claude-code-turn7.json"
SYNTHETIC_MODEL = "claude-opus-5-5-synthetic"  # its own policy: the lowered offload trigger
MESSAGES = "/v1/messages?beta=true"
PYTHON = sys.executable
CONCURRENCY = 4
FIRST_REQUESTS = 3  # the session's first requests: under every threshold
SMALL_TURNS = 2  # the first request and one tool round: under every threshold
WARM_TURNS = 4  # sent before the synthetic crossing line is measured (past its trigger)
TURNS = 24
SMALL_MODEL = "claude-sonnet-4-5"  # the documented claude-* policy: offload from 20,000


@dataclass(frozen=True)
class Conversation:
    name: str
    requests: Callable[[], Iterable[Request]]  # made as they are sent


Plan = list[Conversation]


class Synthetic:
    """The earlier workload: the recorded turn's fixed parts, and one conversation's
    request at a turn."""

    def __init__(self) -> None:
        recorded = orjson.loads(SYNTHETIC.read_bytes())
        self.headers = {
            k: v for k, v in recorded["headers"].items() if k.lower() not in {"connection"}
        }
        self.headers["x-api-key"] = "sk-bench-crossing"
        body = recorded["body"]
        self.base = {k: v for k, v in body.items() if k != "messages"}
        self.first = body["messages"][0]
        self.outputs = Outputs()

    def result(self, conversation: str, turn: int) -> str:
        seed = int.from_bytes(conversation.encode()[-6:], "big") * 131 + turn
        return f"$ make step-{turn}  # {conversation}\n" + self.outputs.piece(seed)

    def body(self, conversation: str, turn: int, model: str) -> bytes:
        """The request at `turn`: the first message, then `turn` tool rounds."""
        messages: list[dict[str, Any]] = [self.first]
        for t in range(turn):
            call = f"toolu_{conversation}_{t:03d}"
            command = {"command": f"make step-{t}", "description": "Build the next step"}
            messages.append(
                {
                    "role": "assistant",
                    "content": [{"type": "tool_use", "id": call, "name": "Bash", "input": command}],
                }
            )
            messages.append(
                {
                    "role": "user",
                    "content": [
                        {
                            "type": "tool_result",
                            "tool_use_id": call,
                            "content": self.result(conversation, t),
                            "is_error": False,
                        }
                    ],
                }
            )
        return orjson.dumps({**self.base, "model": model, "messages": messages})

    def conversation(self, name: str, turns: range, model: str = SYNTHETIC_MODEL) -> Conversation:
        headers = {**self.headers, "X-Claude-Code-Session-Id": name}

        def requests() -> Iterable[Request]:
            return (Request(MESSAGES, headers, self.body(name, t, model)) for t in turns)

        return Conversation(name, requests)


def recorded(sessions: FreshSessions, name: str, start: int, stop: int) -> Conversation:
    def requests() -> Iterable[Request]:
        made = sessions.conversation(name, stop)
        return (r for n, r in enumerate(made) if n >= start)

    return Conversation(name, requests)


async def replay(session: aiohttp.ClientSession, base: str, plan: Plan) -> Counter[str]:
    """Send each conversation's requests in order, CONCURRENCY conversations at a time;
    how many answers carried each x-compaction-strategy ("" for none)."""
    queue = list(plan)
    strategies: Counter[str] = Counter()

    async def worker() -> None:
        while queue:
            conversation = queue.pop(0)
            for request in conversation.requests():
                url = base + request.path
                async with session.post(url, data=request.body, headers=request.headers) as r:
                    raw = await r.read()
                    if r.status != 200:
                        raise RuntimeError(f"{url}: {r.status} {raw[:300]!r}")
                    strategies[r.headers.get("x-compaction-strategy", "")] += 1

    await asyncio.gather(*(worker() for _ in range(CONCURRENCY)))
    return strategies


def cpu_seconds(pid: int) -> float:
    """CPU time of every thread of `pid`, in ns resolution (/proc/PID/task/*/schedstat:
    the tick-based /proc/PID/stat counts 10 ms steps, a tenth of a small run)."""
    total = 0
    for stat in Path(f"/proc/{pid}/task").glob("*/schedstat"):
        with contextlib.suppress(OSError):  # a thread that just ended
            total += int(stat.read_text().split()[0])
    return total / 1e9


@contextlib.contextmanager
def profiled(pid: int, out: Path | None) -> Any:
    """py-spy on `pid` for the length of the block, when `out` is given."""
    if out is None:
        yield
        return
    spy = subprocess.Popen(
        [
            str(Path(PYTHON).parent / "py-spy"),
            "record",
            "-p",
            str(pid),
            "-r",
            "400",
            "--format",
            "raw",
            "-o",
            str(out),
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    time.sleep(1.0)
    try:
        yield
    finally:
        spy.send_signal(signal.SIGINT)
        spy.wait(timeout=60)


async def measured(
    session: aiohttp.ClientSession,
    targets: dict[str, Target],
    plan: Plan,
    profile: Path | None = None,
) -> dict[str, Any]:
    """Replay the plan through each target in turn; CPU µs per request of each, the
    proxies' answers' strategies, Redis commands per request, and the requests' sizes."""
    out: dict[str, Any] = {}
    sizes = [len(r.body) for c in plan for r in c.requests()]
    requests = len(sizes)
    for who, target in targets.items():
        commands = target.store.commands() if target.store else {}
        cpu = cpu_seconds(target.pid)
        where = profile.with_name(f"{who}-{profile.name}") if profile else None
        with profiled(target.pid, where):
            strategies = await replay(session, target.url, plan)
        out[who] = 1e6 * (cpu_seconds(target.pid) - cpu) / requests
        if target.store:
            out[f"{who}_strategies"] = dict(strategies)
            after = target.store.commands()
            calls = {k: v - commands.get(k, 0) for k, v in after.items()}
            out[f"{who}_commands"] = sum(calls.values()) / requests
            # A crossing writes a new rewrite (every strategy but a checkpoint reapplied).
            crossings = sum(n for k, n in strategies.items() if k and k != "checkpoint")
            out[f"{who}_crossings"] = crossings
            out[f"{who}_per_crossing"] = sum(calls.values()) / max(1, crossings)
            top = sorted(calls.items(), key=lambda kv: -kv[1])  # every command, most first
            out[f"{who}_top"] = {k: round(v / requests, 2) for k, v in top if v}
    out["requests"] = requests
    out["bytes"] = sum(sizes) / requests
    return out


async def halves(
    session: aiohttp.ClientSession,
    targets: dict[str, Target],
    early: Plan,
    late: Plan,
    profile: Path | None,
) -> dict[str, Any]:
    """A crossing line measured in two halves of its turns (all conversations' early
    turns, then their late ones), merged; Redis commands per request of each half."""
    first = await measured(session, targets, early, profile)
    second = await measured(session, targets, late)
    both = first["requests"] + second["requests"]
    merged: dict[str, Any] = {"requests": both}
    for who, target in targets.items():
        merged[who] = (first[who] * first["requests"] + second[who] * second["requests"]) / both
        if target.store:
            key = f"{who}_strategies"
            merged[key] = dict(Counter(first[key]) + Counter(second[key]))
            merged[f"{who}_commands_early"] = first[f"{who}_commands"]
            merged[f"{who}_commands_late"] = second[f"{who}_commands"]
            merged[f"{who}_per_crossing_early"] = first[f"{who}_per_crossing"]
            merged[f"{who}_per_crossing_late"] = second[f"{who}_per_crossing"]
            merged[f"{who}_top_early"] = first[f"{who}_top"]
            merged[f"{who}_top"] = second[f"{who}_top"]
    merged["bytes"] = (
        first["bytes"] * first["requests"] + second["bytes"] * second["requests"]
    ) / both
    return merged


async def one_repeat(
    session: aiohttp.ClientSession,
    targets: dict[str, Target],
    workloads: dict[str, Any],
    args: argparse.Namespace,
    repeat: int,
) -> dict[str, Any]:
    tag = f"r{repeat}x{os.getpid() % 10000}"
    # Each repeat measures the targets in another order: on shared cores the load drifts
    # within a repeat, and the one measured first would always meet the same part of it.
    order = list(targets)
    turn = repeat % len(order) if repeat >= 0 else 0
    targets = {who: targets[who] for who in order[turn:] + order[:turn]}
    profile_dir: Path | None = args.profile

    def profile(name: str) -> Path | None:
        return profile_dir / f"{name}-{repeat}.txt" if profile_dir else None

    count = args.conversations
    result: dict[str, Any] = {}
    sessions: FreshSessions | None = workloads.get("session")
    if sessions is not None:
        first = [recorded(sessions, f"{tag}f{i:03d}", 0, FIRST_REQUESTS) for i in range(4 * count)]
        result["session first"] = await measured(session, targets, first, profile("first"))
        names = [f"{tag}s{i:03d}" for i in range(count)]
        half = len(sessions) // 2
        early = [recorded(sessions, name, 0, half) for name in names]
        late = [recorded(sessions, name, half, len(sessions)) for name in names]
        result["session crossing"] = await halves(session, targets, early, late, profile("session"))
    synthetic: Synthetic | None = workloads.get("synthetic")
    if synthetic is not None:
        small = [
            synthetic.conversation(f"{tag}m{i:03d}", range(SMALL_TURNS), SMALL_MODEL)
            for i in range(4 * count)
        ]
        result["synthetic small"] = await measured(session, targets, small, profile("small"))
        names = [f"{tag}c{i:03d}" for i in range(count)]
        # Grow the same conversations past the offload trigger, unmeasured.
        warm = [synthetic.conversation(name, range(WARM_TURNS)) for name in names]
        for target in targets.values():
            if target.store:
                await replay(session, target.url, warm)
        mid = (WARM_TURNS + TURNS) // 2
        early = [synthetic.conversation(name, range(WARM_TURNS, mid)) for name in names]
        late = [synthetic.conversation(name, range(mid, TURNS)) for name in names]
        result["synthetic crossing"] = await halves(
            session, targets, early, late, profile("crossing")
        )
    return result


@dataclass
class Target:
    url: str
    pid: int
    store: Servers | None  # a proxy's Redis


async def run(args: argparse.Namespace) -> list[dict[str, Any]]:
    workloads: dict[str, Any] = {}
    if "session" in args.workloads:
        workloads["session"] = FreshSessions(args.session)
    if "synthetic" in args.workloads:
        workloads["synthetic"] = Synthetic()
    work = Path(tempfile.mkdtemp(prefix="crossing-cpu-"))
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    env.pop("REDIS_URL", None)
    policy = (
        f'\n[[policy]]\nmatch = "{SYNTHETIC_MODEL}"\nwindow = 200000\ntrigger = 100000\n'
        f"target = 80000\noffload_trigger = {args.offload_trigger}\n"
    )
    proxies = {"proxy": ROOT}
    if args.before:
        proxies["before"] = args.before.resolve()
    names = ("relay", *proxies)
    ports = {name: free_port() for name in names}
    # Each target its own stand-in: the stand-in memoises what it answered by the body's
    # digest, so a target sending a body another target sent first would be answered
    # faster (and in fewer chunks) and pay less CPU for it.
    upstreams = {name: free_port() for name in names}
    local = "http://127.0.0.1:{}".format
    relay_cmd = [
        PYTHON, str(ROOT / "bench" / "overhead.py"), "--serve-floor", str(ports["relay"]),
        local(upstreams["relay"]), args.loop,
    ]  # fmt: skip
    results = []
    connector = aiohttp.TCPConnector(limit=0)
    timeout = aiohttp.ClientTimeout(total=None, sock_read=300)
    with contextlib.ExitStack() as stack:
        stack.callback(shutil.rmtree, work, True)
        targets: dict[str, Target] = {}
        children: dict[str, Any] = {}
        for who, source in proxies.items():
            redis_server = EmbeddedRedis(work / f"redis-{who}")
            redis_url = redis_server.start_sync()
            stack.callback(redis_server.stop_sync)
            store = Servers(redis_url, cluster=False)
            stack.callback(store.close)
            config = work / f"{who}.toml"  # the tree's own shipped settings, and the policy
            config.write_text((source / "config" / "proxy.toml").read_text() + policy)
            command = [
                PYTHON, "-P", "-m", "proxy", "--log-level", "WARNING", "serve",
                "--port", str(ports[who]), "--upstream", local(upstreams[who]),
                "--config", str(config), "--redis-url", redis_url,
            ]  # fmt: skip
            own = {**env, "PYTHONPATH": str(source)}
            children[who] = stack.enter_context(process(command, own, work / f"{who}.log"))
            targets[who] = Target(local(ports[who]), 0, store)
        for port in upstreams.values():
            standin_cmd = [
                PYTHON, "-m", "proxy", "--log-level", "WARNING", "stand-in",
                "--port", str(port), "--window", "100000000",
            ]  # fmt: skip
            child = stack.enter_context(process(standin_cmd, env))
            await wait_ready_once(local(port) + "/v1/models", child)
        children["relay"] = stack.enter_context(process(relay_cmd, env))
        targets["relay"] = Target(local(ports["relay"]), 0, None)
        async with aiohttp.ClientSession(connector=connector, timeout=timeout) as session:
            for who, child in children.items():
                probe = "/healthz" if who in proxies else "/v1/models"
                await wait_ready(session, local(ports[who]) + probe, child)
                if who in targets:
                    targets[who].pid = child.pid
            # Warm every process's code paths and pools (not measured).
            await one_repeat(session, targets, workloads, _warm(args), -1)
            for repeat in range(args.repeat):
                result = await one_repeat(session, targets, workloads, args, repeat)
                result["load"] = os.getloadavg()[0]
                print(orjson.dumps(result).decode(), flush=True)
                results.append(result)
    return results


async def wait_ready_once(url: str, child: Any) -> None:
    async with aiohttp.ClientSession() as session:
        await wait_ready(session, url, child)


def _warm(args: argparse.Namespace) -> argparse.Namespace:
    return argparse.Namespace(**{**vars(args), "conversations": 2, "profile": None})


LINES = ("session crossing", "session first", "synthetic crossing", "synthetic small")


def report(results: list[dict[str, Any]], args: argparse.Namespace) -> str:
    before = bool(args.before)
    command = f"--conversations {args.conversations} --repeat {args.repeat}"
    if args.workloads != "session,synthetic":
        command += f" --workloads {args.workloads}"
    if before:
        command += " --before DIR"
    lines = [
        f"`.venv/bin/python bench/crossing_cpu.py {command}`, "
        f"{time.strftime('%Y-%m-%d %H:%M', time.gmtime())} UTC, "
        f"{platform.machine()}, {os.cpu_count()} cores, Python {platform.python_version()}.",
        "",
        "| repeat | load | line | requests | mean body | relay CPU µs/req "
        + ("| before: proxy µs/req | before / relay " if before else "")
        + "| proxy CPU µs/req | proxy / relay | strategies "
        + "| Redis commands per request; per crossing |",
        "|---:|---:|---|---:|---:|---:|" + ("---:|---:|" if before else "") + "---:|---:|---|---:|",
    ]
    for i, r in enumerate(results):
        for name in (line for line in LINES if line in r):
            w = r[name]
            strategies = ", ".join(
                f"{k or 'none'} {v}" for k, v in sorted(w["proxy_strategies"].items())
            )
            commands = " (before: ".join(
                f"{w[f'{who}_commands_early']:.2f} / {w[f'{who}_commands_late']:.2f}"
                f"; {w[f'{who}_per_crossing_early']:.2f} / {w[f'{who}_per_crossing_late']:.2f}"
                if name.endswith("crossing")
                else f"{w[f'{who}_commands']:.2f}"
                for who in (("proxy", "before") if before else ("proxy",))
            ) + (")" if before else "")
            cells = [
                str(i + 1), f"{r['load']:.1f}", name, str(w["requests"]),
                f"{w['bytes'] / 1000:.0f} KB", f"{w['relay']:.0f}",
            ]  # fmt: skip
            if before:
                cells += [f"{w['before']:.0f}", f"{w['before'] / w['relay']:.2f}x"]
            cells += [
                f"{w['proxy']:.0f}", f"**{w['proxy'] / w['relay']:.2f}x**", strategies, commands,
            ]  # fmt: skip
            lines.append("| " + " | ".join(cells) + " |")
    lines.append("")
    lines.append(
        "Redis commands of the crossing lines, per request and per crossing (a request"
        " that writes a new rewrite): the first half of the turns / the second half. Load:"
        " the 1-minute load average after the repeat."
    )
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--conversations", type=int, default=32)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--workloads", default="session,synthetic")
    parser.add_argument("--session", type=Path, default=SESSION)
    parser.add_argument("--offload-trigger", type=int, default=4000)
    parser.add_argument(
        "--before", type=Path, help="a source tree of another version: its serve measured too"
    )
    parser.add_argument("--loop", choices=("asyncio", "uvloop"), default="uvloop")
    parser.add_argument("--profile", type=Path, help="py-spy raw profiles into this folder")
    args = parser.parse_args()
    if args.profile:
        args.profile.mkdir(parents=True, exist_ok=True)
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    results = asyncio.run(run(args))
    print(report(results, args))


if __name__ == "__main__":
    main()
