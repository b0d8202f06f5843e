"""CPU per request on a crossing-heavy workload, as a ratio to a bare byte relay.

A real Claude Code session (the recorded turn tests/fixtures/agent-requests/
claude-code-turn7.json: its system prompt, 31 KB of tool definitions, first user message
and request options) is replayed as many conversations, each with its own fresh tool
results (3-9 KB of code, logs and JSON from bench/codec.py's corpus, as fleet_load.py's
agents get), by 4 workers at once, through `compaction-proxy serve` at the documented
settings (config/proxy.toml; for the session's model, the claude-* policy with
--offload-trigger 4,000 instead of 20,000, so results are offloaded as they age; its own
Redis, started here) and, with the same bodies, through the floor of any Python relay
(overhead.py's bare aiohttp byte relay), each to a stand-in upstream of its own, in one
run. Two workloads:

- small: the first turns of new conversations (the first request and one tool round),
  as claude-sonnet-4-5 (the claude-* policy as documented), under every threshold of
  the policy: nothing is rewritten;
- crossing: conversations grown past the offload trigger (turns 0-3 sent first and not
  measured), then turns 4-23: with incremental offload each one is a crossing (it
  offloads the result that has just left the keep window).

For each workload: the CPU time of the serve process (every thread's, /proc schedstat)
over the requests, per request, and the same for the relay; the ratio proxy / relay (the
targets are measured one after the other, in another order at each repeat). Also the Redis
commands per request (INFO commandstats) for the first and the second half of the
crossing turns: they should not grow with the conversation. Each repeat uses fresh
conversations and fresh results (nothing counted before); --profile DIR runs py-spy on
each serve process and the relay during the measured requests of each workload; --before DIR runs a
second serve from another version's source tree (e.g. `git archive` of the base commit
unpacked in DIR), with its own Redis, on the same requests in the same run.

    .venv/bin/python bench/crossing_cpu.py [--conversations 32] [--repeat 3] [--profile DIR]
        [--before DIR] [--offload-trigger 4000]
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import platform
import signal
import subprocess
import sys
import tempfile
import time
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import aiohttp
import orjson

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

from fleet_load import Outputs, Servers  # noqa: E402
from overhead import free_port, process, wait_ready  # noqa: E402

from proxy.store import EmbeddedRedis  # noqa: E402

SESSION = ROOT / "tests" / "fixtures" / "agent-requests" / "claude-code-turn7.json"
PYTHON = sys.executable
CONCURRENCY = 4
SMALL_TURNS = 2  # the first request and one tool round: under every threshold
WARM_TURNS = 4  # sent before the crossing workload is measured (past the offload trigger)
TURNS = 24
SMALL_MODEL = "claude-sonnet-4-5"  # the documented claude-* policy: offload from 20,000


class Session:
    """The recorded session's fixed parts, and one conversation's request at a turn."""

    def __init__(self) -> None:
        recorded = orjson.loads(SESSION.read_bytes())
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

    def body(self, conversation: str, turn: int, model: str = "") -> bytes:
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
        return orjson.dumps(
            {**self.base, "model": model or self.base["model"], "messages": messages}
        )

    def request_headers(self, conversation: str) -> dict[str, str]:
        return {**self.headers, "X-Claude-Code-Session-Id": conversation}


async def replay(
    session: aiohttp.ClientSession,
    url: str,
    plan: list[tuple[str, list[bytes]]],
    cc: Session,
) -> Counter[str]:
    """Send each conversation's bodies in order, CONCURRENCY conversations at a time;
    how many answers carried each x-compaction-strategy ("" for none)."""
    queue = list(plan)
    strategies: Counter[str] = Counter()

    async def worker() -> None:
        while queue:
            conversation, bodies = queue.pop(0)
            headers = cc.request_headers(conversation)
            for body in bodies:
                async with session.post(url, data=body, headers=headers) as r:
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
    plan: list[tuple[str, list[bytes]]],
    cc: Session,
    profile: Path | None = None,
) -> dict[str, Any]:
    """Replay the plan through each target in turn; CPU µs per request of each, the
    proxies' answers' strategies and Redis commands per request."""
    out: dict[str, Any] = {}
    requests = sum(len(bodies) for _, bodies in plan)
    for who, target in targets.items():
        commands = target.store.commands() if target.store else {}
        cpu = cpu_seconds(target.pid)
        where = profile.with_name(f"{who}-{profile.name}") if profile else None
        with profiled(target.pid, where):
            strategies = await replay(session, target.url, plan, cc)
        out[who] = 1e6 * (cpu_seconds(target.pid) - cpu) / requests
        if target.store:
            out[f"{who}_strategies"] = dict(strategies)
            after = target.store.commands()
            calls = {k: v - commands.get(k, 0) for k, v in after.items()}
            out[f"{who}_commands"] = sum(calls.values()) / requests
            top = sorted(calls.items(), key=lambda kv: -kv[1])  # every command, most first
            out[f"{who}_top"] = {k: round(v / requests, 2) for k, v in top if v}
    out["requests"] = requests
    return out


async def one_repeat(
    session: aiohttp.ClientSession,
    targets: dict[str, Target],
    cc: Session,
    args: argparse.Namespace,
    repeat: int,
) -> dict[str, Any]:
    tag = f"r{repeat}x{os.getpid() % 10000}"
    # Each repeat measures the targets in another order: on shared cores the load drifts
    # within a repeat, and the one measured first would always meet the same part of it.
    order = list(targets)
    turn = repeat % len(order) if repeat >= 0 else 0
    targets = {who: targets[who] for who in order[turn:] + order[:turn]}
    names = [f"{tag}c{i:03d}" for i in range(args.conversations)]

    def plan(turns: range) -> list[tuple[str, list[bytes]]]:
        return [(name, [cc.body(name, t) for t in turns]) for name in names]

    # Small: other new conversations, four times as many (enough CPU to measure).
    small = [
        (f"{tag}s{i:03d}", [cc.body(f"{tag}s{i:03d}", t, SMALL_MODEL) for t in range(SMALL_TURNS)])
        for i in range(4 * args.conversations)
    ]
    profile_dir: Path | None = args.profile
    result: dict[str, Any] = {}
    result["small"] = await measured(
        session, targets, small, cc, profile_dir / f"small-{repeat}.txt" if profile_dir else None
    )
    # Grow the same conversations past the offload trigger, unmeasured.
    warm = plan(range(WARM_TURNS))
    for target in targets.values():
        if target.store:
            await replay(session, target.url, warm, cc)
    half = (WARM_TURNS + TURNS) // 2
    early = plan(range(WARM_TURNS, half))
    late = plan(range(half, TURNS))
    first = await measured(
        session,
        targets,
        early,
        cc,
        profile_dir / f"crossing-{repeat}.txt" if profile_dir else None,
    )
    second = await measured(session, targets, late, cc)
    both = first["requests"] + second["requests"]
    merged: dict[str, Any] = {"requests": both}
    for who, target in targets.items():
        merged[who] = (first[who] * first["requests"] + second[who] * second["requests"]) / both
        if target.store:
            key = f"{who}_strategies"
            merged[key] = dict(Counter(first[key]) + Counter(second[key]))
            merged[f"{who}_commands_early"] = first[f"{who}_commands"]
            merged[f"{who}_commands_late"] = second[f"{who}_commands"]
            merged[f"{who}_top_early"] = first[f"{who}_top"]
            merged[f"{who}_top"] = second[f"{who}_top"]
    crossing = early + late
    merged["bytes"] = sum(len(b) for _, bodies in crossing for b in bodies) / both
    result["crossing"] = merged
    small_bodies = [b for _, bodies in small for b in bodies]
    result["small"]["bytes"] = sum(len(b) for b in small_bodies) / len(small_bodies)
    return result


@dataclass
class Target:
    url: str
    pid: int
    store: Servers | None  # a proxy's Redis


async def run(args: argparse.Namespace) -> list[dict[str, Any]]:
    cc = Session()
    work = Path(tempfile.mkdtemp(prefix="crossing-cpu-"))
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    env.pop("REDIS_URL", None)
    config = work / "proxy.toml"
    # The documented settings; the session's model gets the claude-* defaults with an
    # offload trigger low enough (--offload-trigger) that its 3-9 KB results are offloaded
    # as they age from the first turns on, as at fleet_load.py's 10% of a 32k window.
    # The small workload's model (SMALL_MODEL) keeps the claude-* defaults as documented.
    config.write_text(
        (ROOT / "config" / "proxy.toml").read_text()
        + f'\n[[policy]]\nmatch = "{cc.base["model"]}"\nwindow = 200000\ntrigger = 100000\n'
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
        targets: dict[str, Target] = {}
        children: dict[str, Any] = {}
        for who, source in proxies.items():
            redis_server = EmbeddedRedis(work / f"redis-{who}")
            redis_url = redis_server.start_sync()
            stack.callback(redis_server.stop_sync)
            store = Servers(redis_url, cluster=False)
            stack.callback(store.close)
            command = [
                PYTHON, "-P", "-m", "proxy", "--log-level", "WARNING", "serve",
                "--port", str(ports[who]), "--upstream", local(upstreams[who]),
                "--config", str(config), "--redis-url", redis_url,
            ]  # fmt: skip
            own = {**env, "PYTHONPATH": str(source)}
            children[who] = stack.enter_context(process(command, own, work / f"{who}.log"))
            targets[who] = Target(local(ports[who]) + "/v1/messages?beta=true", 0, store)
        for port in upstreams.values():
            standin_cmd = [
                PYTHON, "-m", "proxy", "--log-level", "WARNING", "stand-in",
                "--port", str(port), "--window", "100000000",
            ]  # fmt: skip
            child = stack.enter_context(process(standin_cmd, env))
            await wait_ready_once(local(port) + "/v1/models", child)
        children["relay"] = stack.enter_context(process(relay_cmd, env))
        targets["relay"] = Target(local(ports["relay"]) + "/v1/messages?beta=true", 0, None)
        async with aiohttp.ClientSession(connector=connector, timeout=timeout) as session:
            for who, child in children.items():
                probe = "/healthz" if who in proxies else "/v1/models"
                await wait_ready(session, local(ports[who]) + probe, child)
                if who in targets:
                    targets[who].pid = child.pid
            # Warm every process's code paths and pools (not measured).
            await one_repeat(session, targets, cc, _warm(args), -1)
            for repeat in range(args.repeat):
                result = await one_repeat(session, targets, cc, args, repeat)
                print(orjson.dumps(result).decode(), flush=True)
                results.append(result)
    return results


async def wait_ready_once(url: str, child: Any) -> None:
    async with aiohttp.ClientSession() as session:
        await wait_ready(session, url, child)


def _warm(args: argparse.Namespace) -> argparse.Namespace:
    return argparse.Namespace(**{**vars(args), "conversations": 4, "profile": None})


def report(results: list[dict[str, Any]], args: argparse.Namespace) -> str:
    before = bool(args.before)
    command = f"--conversations {args.conversations} --repeat {args.repeat}"
    if before:
        command += " --before DIR"
    lines = [
        f"`.venv/bin/python bench/crossing_cpu.py {command}`, "
        f"{time.strftime('%Y-%m-%d %H:%M', time.gmtime())} UTC, "
        f"{platform.machine()}, {os.cpu_count()} cores, Python {platform.python_version()}.",
        "",
        "| repeat | workload | requests | mean body | relay CPU µs/req "
        + ("| before: proxy µs/req | before / relay " if before else "")
        + "| proxy CPU µs/req | proxy / relay | strategies | Redis commands/req |",
        "|---:|---|---:|---:|---:|" + ("---:|---:|" if before else "") + "---:|---:|---|---:|",
    ]
    for i, r in enumerate(results):
        for name in ("crossing", "small"):
            w = r[name]
            strategies = ", ".join(
                f"{k or 'none'} {v}" for k, v in sorted(w["proxy_strategies"].items())
            )
            commands = " (before: ".join(
                f"{w[f'{who}_commands_early']:.2f} / {w[f'{who}_commands_late']:.2f}"
                if name == "crossing"
                else f"{w[f'{who}_commands']:.2f}"
                for who in (("proxy", "before") if before else ("proxy",))
            ) + (")" if before else "")
            cells = [
                str(i + 1), name, str(w["requests"]), f"{w['bytes'] / 1000:.0f} KB",
                f"{w['relay']:.0f}",
            ]  # fmt: skip
            if before:
                cells += [f"{w['before']:.0f}", f"{w['before'] / w['relay']:.2f}x"]
            cells += [
                f"{w['proxy']:.0f}", f"**{w['proxy'] / w['relay']:.2f}x**", strategies, commands,
            ]  # fmt: skip
            lines.append("| " + " | ".join(cells) + " |")
    lines.append("")
    lines.append("Redis commands per request of the crossing workload: turns 4-13 / turns 14-23.")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--conversations", type=int, default=32)
    parser.add_argument("--repeat", type=int, default=3)
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
