"""CPU per request on a crossing-heavy workload, as a ratio to a bare byte relay.

A real Claude Code session (the recorded turn tests/fixtures/agent-requests/
claude-code-turn7.json: its system prompt, 31 KB of tool definitions, first user message
and request options) is replayed as many conversations, each with its own fresh tool
results (3-9 KB of code, logs and JSON from bench/codec.py's corpus, as fleet_load.py's
agents get), by 4 workers at once, through `compaction-proxy serve` at the documented
settings (config/proxy.toml; the claude-* policy with --offload-trigger 4,000 instead
of 20,000, so results are offloaded as they age; its own Redis, started here) and, with
the same bodies, through the floor of any Python relay (overhead.py's bare aiohttp byte
relay), both to the same stand-in upstream, in one run. Two workloads:

- small: the first turns of new conversations (the first request and one tool round),
  under every threshold of the policy: nothing is rewritten;
- crossing: conversations grown past the offload trigger (turns 0-3 sent first and not
  measured), then turns 4-23: with incremental offload each one is a crossing (it
  offloads the result that has just left the keep window).

For each workload: user + system CPU of the serve process (/proc) over the requests,
per request, and the same for the relay; the ratio proxy / relay. Also the Redis
commands per request (INFO commandstats) for the first and the second half of the
crossing turns: they should not grow with the conversation. Each repeat uses fresh
conversations and fresh results (nothing counted before); --profile DIR runs py-spy on
the serve process during the measured requests of each workload.

    .venv/bin/python bench/crossing_cpu.py [--conversations 32] [--repeat 3] [--profile DIR]
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
from pathlib import Path
from typing import Any

import aiohttp
import orjson

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

from fleet_load import Outputs, Servers  # noqa: E402
from overhead import cpu_seconds, free_port, process, wait_ready  # noqa: E402

from proxy.store import EmbeddedRedis  # noqa: E402

SESSION = ROOT / "tests" / "fixtures" / "agent-requests" / "claude-code-turn7.json"
PYTHON = sys.executable
CONCURRENCY = 4
SMALL_TURNS = 2  # the first request and one tool round: under every threshold
WARM_TURNS = 4  # sent before the crossing workload is measured (past the offload trigger)
TURNS = 24


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

    def body(self, conversation: str, turn: int) -> bytes:
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
        return orjson.dumps({**self.base, "messages": messages})

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
    urls: dict[str, str],
    pids: dict[str, int],
    plans: dict[str, list[tuple[str, list[bytes]]]],
    cc: Session,
    store: Servers | None = None,
    profile: Path | None = None,
) -> dict[str, Any]:
    """Replay each plan through proxy and relay; CPU µs per request of each."""
    out: dict[str, Any] = {}
    requests = sum(len(bodies) for _, bodies in plans["proxy"])
    for who in ("proxy", "relay"):
        commands = store.commands() if store and who == "proxy" else {}
        cpu = cpu_seconds(pids[who])
        with profiled(pids[who], profile if who == "proxy" else None):
            strategies = await replay(session, urls[who], plans[who], cc)
        out[who] = 1e6 * (cpu_seconds(pids[who]) - cpu) / requests
        if who == "proxy":
            out["strategies"] = dict(strategies)
            if store:
                after = store.commands()
                calls = sum(after.values()) - sum(commands.values())
                out["commands"] = calls / requests
    out["requests"] = requests
    out["ratio"] = out["proxy"] / out["relay"]
    return out


async def one_repeat(
    session: aiohttp.ClientSession,
    urls: dict[str, str],
    pids: dict[str, int],
    cc: Session,
    store: Servers,
    args: argparse.Namespace,
    repeat: int,
) -> dict[str, Any]:
    tag = f"r{repeat}x{os.getpid() % 10000}"
    names = [f"{tag}c{i:03d}" for i in range(args.conversations)]

    def plan(turns: range) -> list[tuple[str, list[bytes]]]:
        return [(name, [cc.body(name, t) for t in turns]) for name in names]

    # Small: other new conversations, four times as many (enough CPU to measure).
    small = [
        (f"{tag}s{i:03d}", [cc.body(f"{tag}s{i:03d}", t) for t in range(SMALL_TURNS)])
        for i in range(4 * args.conversations)
    ]
    profile_dir: Path | None = args.profile
    result: dict[str, Any] = {}
    result["small"] = await measured(
        session,
        urls,
        pids,
        {"proxy": small, "relay": small},
        cc,
        store,
        profile_dir / f"small-{repeat}.txt" if profile_dir else None,
    )
    # Grow the same conversations past the offload trigger, unmeasured.
    warm = plan(range(WARM_TURNS))
    await replay(session, urls["proxy"], warm, cc)
    half = (WARM_TURNS + TURNS) // 2
    early = plan(range(WARM_TURNS, half))
    late = plan(range(half, TURNS))
    crossing = [(n, a + b) for (n, a), (_, b) in zip(early, late, strict=True)]
    result["crossing"] = await measured(
        session,
        urls,
        pids,
        {"proxy": early, "relay": early},
        cc,
        store,
        profile_dir / f"crossing-{repeat}.txt" if profile_dir else None,
    )
    second = await measured(session, urls, pids, {"proxy": late, "relay": late}, cc, store)
    first = result["crossing"]
    both = first["requests"] + second["requests"]
    merged: dict[str, Any] = {"requests": both}
    for who in ("proxy", "relay"):
        merged[who] = (first[who] * first["requests"] + second[who] * second["requests"]) / both
    merged["ratio"] = merged["proxy"] / merged["relay"]
    merged["strategies"] = dict(Counter(first["strategies"]) + Counter(second["strategies"]))
    merged["commands_early"] = first["commands"]
    merged["commands_late"] = second["commands"]
    merged["bytes"] = sum(len(b) for _, bodies in crossing for b in bodies) / both
    result["crossing"] = merged
    result["small"]["bytes"] = sum(len(b) for _, bodies in small for b in bodies) / len(
        [b for _, bodies in small for b in bodies]
    )
    return result


async def run(args: argparse.Namespace) -> list[dict[str, Any]]:
    cc = Session()
    work = Path(tempfile.mkdtemp(prefix="crossing-cpu-"))
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    env.pop("REDIS_URL", None)
    config = work / "proxy.toml"
    # The documented settings; the session's model gets the claude-* defaults with an
    # offload trigger low enough (--offload-trigger) that its 3-9 KB results are offloaded
    # as they age from the first turns on, as at fleet_load.py's 10% of a 32k window.
    config.write_text(
        (ROOT / "config" / "proxy.toml").read_text()
        + f'\n[[policy]]\nmatch = "claude-*"\nwindow = 200000\ntrigger = 100000\n'
        f"target = 80000\noffload_trigger = {args.offload_trigger}\n"
    )
    redis_server = EmbeddedRedis(work / "redis")
    redis_url = redis_server.start_sync()
    store = Servers(redis_url, cluster=False)
    ports = {name: free_port() for name in ("standin", "proxy", "relay")}
    local = "http://127.0.0.1:{}".format
    standin_cmd = [
        PYTHON, "-m", "proxy", "--log-level", "WARNING", "stand-in",
        "--port", str(ports["standin"]), "--window", "100000000",
    ]  # fmt: skip
    proxy_cmd = [
        PYTHON, "-m", "proxy", "--log-level", "WARNING", "serve", "--port", str(ports["proxy"]),
        "--upstream", local(ports["standin"]), "--config", str(config), "--redis-url", redis_url,
    ]  # fmt: skip
    relay_cmd = [
        PYTHON, str(ROOT / "bench" / "overhead.py"), "--serve-floor", str(ports["relay"]),
        local(ports["standin"]), args.loop,
    ]  # fmt: skip
    results = []
    connector = aiohttp.TCPConnector(limit=0)
    timeout = aiohttp.ClientTimeout(total=None, sock_read=300)
    try:
        async with aiohttp.ClientSession(connector=connector, timeout=timeout) as session:
            with (
                process(standin_cmd, env) as standin,
                process(proxy_cmd, env, work / "proxy.log") as proxy,
                process(relay_cmd, env) as relay,
            ):
                await wait_ready(session, local(ports["standin"]) + "/v1/models", standin)
                await wait_ready(session, local(ports["proxy"]) + "/healthz", proxy)
                await wait_ready(session, local(ports["relay"]) + "/v1/models", relay)
                urls = {
                    "proxy": local(ports["proxy"]) + "/v1/messages?beta=true",
                    "relay": local(ports["relay"]) + "/v1/messages?beta=true",
                }
                pids = {"proxy": proxy.pid, "relay": relay.pid}
                # Warm both processes' code paths and pools (not measured).
                await one_repeat(session, urls, pids, cc, store, _warm(args), -1)
                for repeat in range(args.repeat):
                    result = await one_repeat(session, urls, pids, cc, store, args, repeat)
                    print(orjson.dumps(result).decode(), flush=True)
                    results.append(result)
    finally:
        store.close()
        redis_server.stop_sync()
    return results


def _warm(args: argparse.Namespace) -> argparse.Namespace:
    return argparse.Namespace(**{**vars(args), "conversations": 4, "profile": None})


def report(results: list[dict[str, Any]], args: argparse.Namespace) -> str:
    lines = [
        f"`.venv/bin/python bench/crossing_cpu.py --conversations {args.conversations} "
        f"--repeat {args.repeat}`, {time.strftime('%Y-%m-%d %H:%M', time.gmtime())} UTC, "
        f"{platform.machine()}, {os.cpu_count()} cores, Python {platform.python_version()}.",
        "",
        "| repeat | workload | requests | mean body | proxy CPU µs/req | relay CPU µs/req "
        "| proxy / relay | strategies | Redis commands/req (first / second half) |",
        "|---:|---|---:|---:|---:|---:|---:|---|---:|",
    ]
    for i, r in enumerate(results):
        for name in ("crossing", "small"):
            w = r[name]
            strategies = ", ".join(f"{k or 'none'} {v}" for k, v in sorted(w["strategies"].items()))
            commands = (
                f"{w['commands_early']:.2f} / {w['commands_late']:.2f}"
                if name == "crossing"
                else f"{w['commands']:.2f}"
            )
            lines.append(
                f"| {i + 1} | {name} | {w['requests']} | {w['bytes'] / 1000:.0f} KB "
                f"| {w['proxy']:.0f} | {w['relay']:.0f} | **{w['ratio']:.2f}x** "
                f"| {strategies} | {commands} |"
            )
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--conversations", type=int, default=32)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--offload-trigger", type=int, default=4000)
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
