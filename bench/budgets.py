"""What budget enforcement adds per request: a ratio against the same proxy without it.

Starts a Redis (the embedded redis-server), a canned upstream (answers every Messages
request at once with the same small body and usage, so the proxy's own work is what is
measured) and three `compaction-proxy serve` processes in front of it:

- `keys off`: the caller's credential is forwarded; no key check, no budget;
- `keys, no budget`: a proxy key is checked (cached) and swapped for the upstream one;
- `keys + budgets`: the same with limits on the key and on its team, so every request
  runs the reserve script on two slots before forwarding and settles on both after.

This process is the load generator (an aiohttp client). Latency at concurrency 1 is
measured in interleaved rounds (all three see the same machine load); throughput at
concurrency 16. The figure asked for is `keys + budgets` over `keys, no budget`.

Usage: .venv/bin/python bench/budgets.py [--requests 300] [--rounds 5] [--seconds 4] [--write]
(--write replaces the "budgets.py" section of bench/RESULTS.md).
"""

from __future__ import annotations

import argparse
import asyncio
import datetime
import os
import platform
import re
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import aiohttp
import orjson

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "bench" / "RESULTS.md"
PYTHON = sys.executable
ENV_NAME = "CP_BENCH_UPSTREAM_KEY"
BODY = orjson.dumps(
    {
        "model": "claude-haiku-4-5",
        "max_tokens": 256,
        "messages": [{"role": "user", "content": "Status of the build, in one line."}],
    }
)
ANSWER = orjson.dumps(
    {
        "id": "msg_bench",
        "type": "message",
        "role": "assistant",
        "model": "claude-haiku-4-5",
        "content": [{"type": "text", "text": "All green."}],
        "stop_reason": "end_turn",
        "stop_sequence": None,
        "usage": {"input_tokens": 14, "output_tokens": 4},
    }
)


def serve_canned(port: int) -> None:
    from aiohttp import web

    async def handle(request: web.Request) -> web.Response:
        await request.read()
        return web.Response(body=ANSWER, content_type="application/json")

    app = web.Application()
    app.router.add_post("/v1/messages", handle)
    web.run_app(app, host="127.0.0.1", port=port, access_log=None, print=None)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def wait_for(url: str, seconds: float = 30) -> None:
    import urllib.request

    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        try:
            with urllib.request.urlopen(url, timeout=1):
                return
        except OSError:
            time.sleep(0.05)
    raise RuntimeError(f"{url} did not come up")


async def create_key(redis_url: str, prefix: str, *, limits: bool) -> str:
    sys.path.insert(0, str(ROOT))
    from proxy.store import Store
    from proxy.store.accounts import Accounts, Scope

    store = Store.from_url(redis_url, prefix=prefix, op_timeout=5.0)
    try:
        accounts = Accounts(store)
        team = "bench-budgets" if limits else "bench-free"
        text, record = await accounts.create_key(team=team, upstream_env=ENV_NAME)
        if limits:
            big = 10**12
            await accounts.set_conf(
                Scope("key", record["id"]), {"minute:input": big, "day:output": big}
            )
            await accounts.set_conf(Scope("team", team), {"month:weighted": big})
        return text
    finally:
        await store.close()


def start_proxy(
    config: Path, upstream: str, redis_url: str, env: dict[str, str]
) -> tuple[subprocess.Popen[bytes], str]:
    port = free_port()
    command = [
        PYTHON, "-m", "proxy", "--log-level", "WARNING", "serve", "--config", str(config),
        "--port", str(port), "--upstream", upstream, "--redis-url", redis_url,
    ]  # fmt: skip
    process = subprocess.Popen(command, env=env, cwd=ROOT, stdout=subprocess.DEVNULL)
    url = f"http://127.0.0.1:{port}"
    wait_for(f"{url}/healthz")
    return process, url


async def latencies(session: aiohttp.ClientSession, url: str, key: str, count: int) -> list[float]:
    headers = {
        "x-api-key": key,
        "anthropic-version": "2023-06-01",
        "content-type": "application/json",
    }
    out = []
    for _ in range(count):
        began = time.perf_counter()
        async with session.post(f"{url}/v1/messages", data=BODY, headers=headers) as response:
            await response.read()
            assert response.status == 200, response.status
        out.append(time.perf_counter() - began)
    return out


async def throughput(url: str, key: str, seconds: float, concurrency: int = 16) -> float:
    headers = {
        "x-api-key": key,
        "anthropic-version": "2023-06-01",
        "content-type": "application/json",
    }
    done = 0
    deadline = time.perf_counter() + seconds
    connector = aiohttp.TCPConnector(limit=concurrency)
    async with aiohttp.ClientSession(connector=connector) as session:

        async def worker() -> None:
            nonlocal done
            while time.perf_counter() < deadline:
                async with session.post(f"{url}/v1/messages", data=BODY, headers=headers) as r:
                    await r.read()
                    assert r.status == 200, r.status
                done += 1

        began = time.perf_counter()
        await asyncio.gather(*(worker() for _ in range(concurrency)))
        return done / (time.perf_counter() - began)


async def measure(
    args: argparse.Namespace, targets: dict[str, tuple[str, str]]
) -> dict[str, dict[str, float]]:
    results: dict[str, dict[str, list[float]]] = {name: {"lat": []} for name in targets}
    async with aiohttp.ClientSession() as session:
        for url, key in targets.values():  # warm up: tokenizer, pools, caches
            await latencies(session, url, key, 50)
        for _ in range(args.rounds):
            for name, (url, key) in targets.items():
                results[name]["lat"] += await latencies(session, url, key, args.requests)
    summary: dict[str, dict[str, float]] = {}
    for name, (url, key) in targets.items():
        lat = sorted(results[name]["lat"])
        summary[name] = {
            "p50_ms": statistics.median(lat) * 1000,
            "p99_ms": lat[int(len(lat) * 0.99) - 1] * 1000,
            "rps16": await throughput(url, key, args.seconds),
        }
    return summary


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--requests", type=int, default=300, help="per round and setting")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--seconds", type=float, default=4.0, help="throughput run length")
    parser.add_argument("--write", action="store_true")
    args = parser.parse_args()

    sys.path.insert(0, str(ROOT))
    from proxy.store import EmbeddedRedis

    processes: list[subprocess.Popen[bytes]] = []
    with tempfile.TemporaryDirectory() as tmp, EmbeddedRedis(Path(tmp) / "redis") as redis:
        try:
            upstream_port = free_port()
            canned = subprocess.Popen(
                [PYTHON, "-c", f"import sys; sys.path.insert(0, {str(ROOT / 'bench')!r});"
                 f" from budgets import serve_canned; serve_canned({upstream_port})"],
                cwd=ROOT,
            )  # fmt: skip
            processes.append(canned)
            upstream = f"http://127.0.0.1:{upstream_port}"
            env = {k: v for k, v in os.environ.items() if not k.startswith("COMPACTION_PROXY_")}
            env[ENV_NAME] = "sk-bench-upstream"
            prefix = "cpbench:"
            configs = {}
            for name, keys in (
                ("keys off", "off"),
                ("keys, no budget", "required"),
                ("keys + budgets", "required"),
            ):
                config = Path(tmp) / f"{keys}-{len(configs)}.toml"
                config.write_text(f'[store]\nkey_prefix = "{prefix}"\n[auth]\nkeys = "{keys}"\n')
                configs[name] = config
            targets = {}
            for name, config in configs.items():
                process, url = start_proxy(config, upstream, redis.url, env)
                processes.append(process)
                if name == "keys off":
                    key = "sk-bench-caller"
                else:
                    key = asyncio.run(
                        create_key(redis.url, prefix, limits=name == "keys + budgets")
                    )
                targets[name] = (url, key)
            summary = asyncio.run(measure(args, targets))
        finally:
            for process in processes:
                process.terminate()
            for process in processes:
                process.wait(10)
    report(args, summary)


def report(args: argparse.Namespace, summary: dict[str, dict[str, float]]) -> None:
    base = summary["keys, no budget"]
    off = summary["keys off"]
    on = summary["keys + budgets"]
    lines = [
        "| setting | p50 (ms) | p99 (ms) | req/s at 16 |",
        "|---|---:|---:|---:|",
    ]
    for name, row in summary.items():
        lines.append(f"| {name} | {row['p50_ms']:.2f} | {row['p99_ms']:.2f} | {row['rps16']:.0f} |")
    lines += [
        "",
        f"Budgets on / keys without budgets: p50 x{on['p50_ms'] / base['p50_ms']:.2f},"
        f" throughput x{on['rps16'] / base['rps16']:.2f}"
        f" (added {on['p50_ms'] - base['p50_ms']:.2f} ms per request at p50).",
        f"Budgets on / keys off: p50 x{on['p50_ms'] / off['p50_ms']:.2f},"
        f" throughput x{on['rps16'] / off['rps16']:.2f}.",
    ]
    table = "\n".join(lines)
    print(table)
    if args.write:
        when = datetime.date.today().isoformat()
        head = (
            f"## budgets.py\n\n`.venv/bin/python bench/budgets.py --requests {args.requests}"
            f" --rounds {args.rounds} --seconds {args.seconds:g}`, {when}, {os.cpu_count()} cores"
            f" (shared with other work), Python {platform.python_version()}. Canned upstream,"
            " three `serve` processes, one embedded Redis (unix socket) and the load generator"
            " on one machine. `keys + budgets`: limits on the key (minute input, day output)"
            " and its team (month weighted), so each request reserves on two slots and settles"
            " on both.\n\n"
        )
        text = RESULTS.read_text()
        section = head + table + "\n"
        pattern = re.compile(r"## budgets\.py\n.*?(?=\n## |\Z)", re.S)
        text = (
            pattern.sub(section, text) if pattern.search(text) else text.rstrip() + "\n\n" + section
        )
        RESULTS.write_text(text)


if __name__ == "__main__":
    main()
