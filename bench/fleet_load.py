"""A fleet under load: N agents through three `serve` replicas sharing one Redis.

Processes: the stand-in upstream (`compaction-proxy stand-in`), a Redis (the embedded
redis-server, or a local three-master Cluster), three `compaction-proxy serve` replicas,
and this load generator. Each simulated agent runs one conversation: a task, then turn
after turn the stand-in calls a Bash tool and the agent answers with tool output (code,
logs, JSON from bench/codec.py's corpus, 3-9 KB each, every 5th turn preceded by a
read_result round), sending each request to the next replica in turn (a load balancer
with no affinity). Agents come in tenants of 25 sharing an API key; a quarter of each
agent's results are output another agent of its tenant also got (the same file read),
the rest its own. The policy is small (window 32k tokens) so conversations cross and
offload within the run.

For each N: the same agents first straight to the stand-in (direct), then through the
replicas; latency per request (p50, p99) both ways and what the proxy adds; requests/s;
Redis commands per request (INFO commandstats, every server); Redis memory (used_memory
over the run, summed over nodes) per conversation; the blobs' memory (MEMORY USAGE)
over their raw size; how many results the conversations offloaded over how many blobs are
stored (deduplication), and the blobs' memory over the raw size a store per conversation
would have held. Stand-in, Redis, replicas and load share this machine's cores.

Also each replica's resident and peak memory at the end, and what its reuse cache
(proxy/core/reuse.py; `--reuse BYTES`, 0 for off) held.

    .venv/bin/python bench/fleet_load.py [--agents 25,50,100,200] [--turns 24] [--cluster]
        [--reuse 268435456]
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import platform
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp
import orjson
import redis

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

from codec import sources  # noqa: E402

from proxy.core.identity import tenant_of  # noqa: E402
from proxy.core.offload import ref_for  # noqa: E402
from proxy.store import EmbeddedRedis  # noqa: E402
from proxy.store.codec import unpack  # noqa: E402
from proxy.testing.agent import TOOLS  # noqa: E402
from tests.plugins.redis_cluster import LocalRedisCluster  # noqa: E402

PYTHON = sys.executable
PREFIX = "fl:"
TENANT_SIZE = 25
REPLICAS = 3
MODEL = "claude-fleet-1"
SYSTEM = "You are a careful coding agent. Follow the repository rules. " * 40
CONFIG = f"""
[store]
key_prefix = "{PREFIX}"

[[policy]]
match = "*"
window = 32000
trigger = 20000
target = 8000
keep_last = 4
keep_results = 1
offload_threshold = 500
stub_head_chars = 600
summary_max_tokens = 1500
"""


# -- the agents' tool output ----------------------------------------------------------


class Outputs:
    """Deterministic tool results from the codec corpus: 3-9 KB pieces of real text."""

    def __init__(self) -> None:
        texts = [t for named in sources().values() for t in named.values() if t]
        self.corpus = "\n".join(texts)

    def piece(self, seed: int) -> str:
        size = 3_000 + (seed * 7919) % 6_000
        start = (seed * 104_729) % max(1, len(self.corpus) - size)
        return self.corpus[start : start + size]

    def result(self, agent: int, turn: int) -> str:
        if (agent + turn) % 4 == 0:  # the same output for every agent of the tenant
            return f"$ cat shared/file_{turn}.txt\n" + self.piece(10_000 + turn)
        return f"$ make step-{turn}  # agent {agent}\n" + self.piece(agent * 1_000 + turn)


# -- one agent ------------------------------------------------------------------------


@dataclass
class Agent:
    index: int
    key: str
    conversation: str
    messages: list[dict[str, Any]] = field(default_factory=list)

    def request(self, turn: int) -> tuple[bytes, dict[str, str]]:
        script: dict[str, Any] = {"tool": {"name": "Bash", "input": {"command": f"step {turn}"}}}
        if turn % 5 == 4:
            script["read_result"] = True
        body = {
            "model": MODEL,
            "max_tokens": 512,
            "system": SYSTEM,
            "tools": TOOLS,
            "messages": self.messages,
        }
        headers = {
            "x-api-key": self.key,
            "anthropic-version": "2023-06-01",
            "content-type": "application/json",
            "x-conversation-id": self.conversation,
            "x-stand-in": orjson.dumps(script).decode(),
        }
        return orjson.dumps(body), headers

    def answer(self, message: dict[str, Any], output: str) -> None:
        content = message["content"]
        self.messages.append({"role": "assistant", "content": content})
        calls = [b for b in content if b.get("type") == "tool_use"]
        if not calls:
            self.messages.append({"role": "user", "content": "Go on."})
            return
        results = [
            {"type": "tool_result", "tool_use_id": c["id"], "content": output} for c in calls
        ]
        self.messages.append({"role": "user", "content": results})


async def run_agents(
    urls: list[str],
    agents: int,
    turns: int,
    outputs: Outputs,
    run_id: str,
    sent: list[tuple[tuple[str, str], str, int]] | None = None,
) -> tuple[list[float], float]:
    """Latency of every request, and the wall time of the whole run; `sent` gets each
    conversation's distinct results as ((tenant, ref), ref, characters)."""
    latencies: list[float] = []
    turn_counter = 0
    connector = aiohttp.TCPConnector(limit=0)
    timeout = aiohttp.ClientTimeout(total=300)
    async with aiohttp.ClientSession(connector=connector, timeout=timeout) as session:

        async def one(agent: Agent) -> None:
            nonlocal turn_counter
            agent.messages.append({"role": "user", "content": "Find out why the build fails."})
            tenant = tenant_of({"x-api-key": agent.key})
            seen: set[str] = set()
            for turn in range(turns):
                body, headers = agent.request(turn)
                url = urls[turn_counter % len(urls)]
                turn_counter += 1
                began = time.perf_counter()
                async with session.post(f"{url}/v1/messages", data=body, headers=headers) as r:
                    raw = await r.read()
                    if r.status != 200:
                        raise RuntimeError(f"{url}: {r.status} {raw[:300]!r}")
                latencies.append(time.perf_counter() - began)
                output = outputs.result(agent.index, turn)
                agent.answer(orjson.loads(raw), output)
                ref = ref_for(output)
                if sent is not None and ref not in seen:
                    seen.add(ref)
                    sent.append(((tenant, ref), ref, len(output)))

        fleet = [
            Agent(i, f"sk-fleet-{run_id}-{i // TENANT_SIZE}", f"{run_id}-agent-{i}")
            for i in range(agents)
        ]
        began = time.perf_counter()
        await asyncio.gather(*(one(a) for a in fleet))
        return latencies, time.perf_counter() - began


# -- processes --------------------------------------------------------------------------


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@contextlib.contextmanager
def started(command: list[str], url: str, log: Path) -> Iterator[subprocess.Popen[bytes]]:
    """A server process (its stderr to `log`, never a pipe a busy server could fill),
    once its port accepts connections; stopped on the way out."""
    port = int(url.rsplit(":", 1)[1])
    with log.open("ab") as stderr:
        child = subprocess.Popen(command, cwd=ROOT, stdout=subprocess.DEVNULL, stderr=stderr)
    try:
        deadline = time.monotonic() + 60
        while True:
            if child.poll() is not None:
                raise RuntimeError(f"{command[3:6]} exited: {log.read_text()[-2000:]}")
            with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", port), 0.5):
                break
            if time.monotonic() > deadline:
                raise RuntimeError(f"{url} did not come up")
            time.sleep(0.1)
        yield child
    finally:
        child.terminate()
        try:
            child.wait(timeout=20)
        except subprocess.TimeoutExpired:
            child.kill()
            child.wait()


class Servers:
    """The servers of one Redis (one standalone, or a Cluster's primaries)."""

    def __init__(self, url: str, cluster: bool) -> None:
        self.url = url
        self.cluster = cluster
        base = url.split("?")[0]
        self.client: Any = (
            redis.RedisCluster.from_url(base) if cluster else redis.Redis.from_url(base)
        )

    def nodes(self) -> list[Any]:
        if self.cluster:
            return [n.redis_connection for n in self.client.get_primaries()]
        return [self.client]

    def flush(self) -> None:
        for node in self.nodes():
            node.flushall()
            node.config_resetstat()

    def cpu(self) -> float:
        """CPU seconds the servers have used (user + system)."""
        total = 0.0
        for node in self.nodes():
            info = node.info("cpu")
            total += float(info["used_cpu_user"]) + float(info["used_cpu_sys"])
        return total

    def used_memory(self) -> int:
        return sum(int(n.info("memory")["used_memory"]) for n in self.nodes())

    def commands(self) -> dict[str, int]:
        out: dict[str, int] = {}
        for node in self.nodes():
            for name, stat in node.info("commandstats").items():
                command = name.removeprefix("cmdstat_")
                out[command] = out.get(command, 0) + int(stat["calls"])
        # Not the proxy's work per request: this script's own calls, and connection set-up
        # (a replica's pool grows to its peak concurrency, then reuses its connections).
        for bookkeeping in (
            "info",
            "config",
            "flushall",
            "cluster",
            "command",
            "ping",
            "hello",
            "client",
            "memory",
            "scan",
        ):
            out.pop(bookkeeping, None)
        return out

    def blobs(self) -> tuple[set[tuple[str, str]], int, int]:
        """The (tenant, ref) of every blob stored, their raw size and their memory."""
        stored: set[tuple[str, str]] = set()
        raw = memory = 0
        for node in self.nodes():
            for key in node.scan_iter(match=f"{PREFIX}{{*}}:blob:*", count=1000):
                tag, _, ref = key.decode().partition("}:blob:")
                stored.add((tag.removeprefix(PREFIX + "{").rsplit("/", 1)[0], ref))
                raw += len(unpack(node.get(key)))
                memory += int(node.memory_usage(key, samples=0) or 0)
        return stored, raw, memory

    def close(self) -> None:
        self.client.close()


# -- one measurement --------------------------------------------------------------------


def cpu_seconds(pid: int) -> float:
    """User + system CPU a process has used (Linux)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(len(ordered) * q))] * 1000


async def scrape(urls: list[str]) -> tuple[dict[str, float], dict[float, float]]:
    """Every replica's metrics summed by name (the Messages route's timings only), and
    the buckets of the proxy's own time per request."""
    totals: dict[str, float] = {}
    own: dict[float, float] = {}
    async with aiohttp.ClientSession() as session:
        for url in urls:
            async with session.get(f"{url}/metrics") as r:
                text = await r.text()
            for line in text.splitlines():
                if not line.startswith("compaction_proxy_"):
                    continue
                sample, value = line.rsplit(" ", 1)
                if "_seconds" in sample and 'route="/v1/messages"' not in sample:
                    continue  # timings of probes and scrapes
                name = sample.split("{", 1)[0].removeprefix("compaction_proxy_")
                totals[name] = totals.get(name, 0.0) + float(value)
                if name == "proxy_overhead_seconds_bucket":
                    bound = float(sample.split('le="', 1)[1].split('"', 1)[0])
                    own[bound] = own.get(bound, 0.0) + float(value)
    return totals, own


def memory_mib(pid: int) -> tuple[float, float]:
    """A process's resident memory now and at its peak (VmRSS, VmHWM), MiB."""
    fields = dict(
        line.split(":", 1) for line in Path(f"/proc/{pid}/status").read_text().splitlines()
    )
    return int(fields["VmRSS"].split()[0]) / 1024, int(fields["VmHWM"].split()[0]) / 1024


def bucket_pct(buckets: dict[float, float], q: float) -> float:
    """The upper bound (ms) of the histogram bucket holding the q-quantile."""
    total = max(buckets.values())
    for bound in sorted(buckets):
        if buckets[bound] >= q * total:
            return bound * 1000
    return float("inf")


def measure(
    args: argparse.Namespace, store: Servers, standin: str, agents: int, outputs: Outputs
) -> dict[str, Any]:
    run_id = f"n{agents}-{os.getpid()}-{int(time.time())}"
    direct, direct_wall = asyncio.run(run_agents([standin], agents, args.turns, outputs, run_id))
    store.flush()
    before = store.used_memory()
    redis_cpu = store.cpu()
    config = Path(tempfile.mkdtemp(prefix="fleet-")) / "proxy.toml"
    server = f"[server]\nreuse_max_bytes = {args.reuse}\n\n"
    config.write_text(CONFIG.replace("[store]", server + "[store]"))
    with contextlib.ExitStack() as stack:
        urls: list[str] = []
        replicas: list[int] = []
        for _ in range(REPLICAS):
            port = free_port()
            url = f"http://127.0.0.1:{port}"
            command = [
                PYTHON, "-m", "proxy", "--log-level", "WARNING", "serve", "--config",
                str(config), "--port", str(port), "--upstream", standin,
                "--redis-url", store.url,
            ]  # fmt: skip
            log = config.parent / f"replica-{port}.log"
            replicas.append(stack.enter_context(started(command, url, log)).pid)
            print(f"replica {url}: log {log}", file=sys.stderr)
            urls.append(url)
        sent: list[tuple[tuple[str, str], str, int]] = []
        started_cpu = sum(cpu_seconds(pid) for pid in replicas)  # start-up is not load
        proxied, proxied_wall = asyncio.run(
            run_agents(urls, agents, args.turns, outputs, run_id + "-p", sent)
        )
        metrics, own = asyncio.run(scrape(urls))
        replica_cpu = sum(cpu_seconds(pid) for pid in replicas) - started_cpu
        rss = [memory_mib(pid) for pid in replicas]
    commands = store.commands()
    redis_cpu = store.cpu() - redis_cpu
    stored, raw, blob_memory = store.blobs()
    # What a store per conversation would have held: each conversation's results that
    # were offloaded, counted once per conversation (the tenant stores each one once).
    offloaded = [(ref, size) for pair, ref, size in sent if pair in stored]
    used = store.used_memory() - before
    requests = len(proxied)
    m = metrics.get
    return {
        "agents": agents,
        "requests": requests,
        "direct_p50": pct(direct, 0.5),
        "direct_p99": pct(direct, 0.99),
        "proxy_p50": pct(proxied, 0.5),
        "proxy_p99": pct(proxied, 0.99),
        "direct_rps": len(direct) / direct_wall,
        "proxy_rps": requests / proxied_wall,
        "own_ms": 1000
        * m("proxy_overhead_seconds_sum", 0.0)
        / m("proxy_overhead_seconds_count", 1),
        "own_p50": bucket_pct(own, 0.5),
        "own_p99": bucket_pct(own, 0.99),
        "commands_per_request": sum(commands.values()) / requests,
        "replica_cpu_ms": 1000 * replica_cpu / requests,
        "redis_cpu_ms": 1000 * redis_cpu / requests,
        "top_commands": sorted(commands.items(), key=lambda kv: -kv[1])[:8],
        "memory_per_conversation": used / agents,
        "blobs": stored,
        "blob_raw": raw,
        "blob_memory": blob_memory,
        "per_conversation_blobs": len(offloaded),
        "per_conversation_raw": sum(size for _, size in offloaded),
        "used": used,
        "crossings": m("compactions_total", 0.0),
        "read_rounds": m("read_result_rounds_total", 0.0),
        "store_errors": m("store_errors_total", 0.0),
        "unreadable": m("unreadable_refs_total", 0.0),
        # Each replica's resident and peak memory at the end (MiB), and what the reuse
        # cache held (summed over the replicas) and how often a request continued a line.
        "rss_mib": max(now for now, _ in rss),
        "peak_mib": max(peak for _, peak in rss),
        "reuse_bytes": m("reuse_bytes", 0.0),
        "reuse_entries": m("reuse_entries", 0.0),
        "reuse_hits": m("reuse_hits_total", 0.0),
        "reuse_misses": m("reuse_misses_total", 0.0),
    }


def row(r: dict[str, Any]) -> str:
    added50 = r["proxy_p50"] - r["direct_p50"]
    added99 = r["proxy_p99"] - r["direct_p99"]
    unique = r["blob_memory"] / r["blob_raw"] if r["blob_raw"] else 0.0
    old = r["per_conversation_raw"]
    shared = r["blob_memory"] / old if old else 0.0
    everything = r["used"] / old if old else 0.0
    dedup = r["per_conversation_blobs"] / max(1, len(r["blobs"]))
    return (
        f"| {r['agents']} | {r['requests']} | {r['direct_p50']:.0f} / {r['direct_p99']:.0f} "
        f"| {r['proxy_p50']:.0f} / {r['proxy_p99']:.0f} | {added50:+.0f} / {added99:+.0f} "
        f"| {r['own_p50']:g} / {r['own_p99']:g} ({r['own_ms']:.0f}) "
        f"| {r['direct_rps']:.0f} | {r['proxy_rps']:.0f} "
        f"| {r['replica_cpu_ms']:.1f} / {r['redis_cpu_ms']:.2f} | {r['commands_per_request']:.2f} "
        f"| {r['memory_per_conversation'] / 1000:.0f} KB | {unique:.3f} | {dedup:.2f} "
        f"| {shared:.3f} ({everything:.3f}) "
        f"| {r['crossings']:.0f} / {r['read_rounds']:.0f} / {r['store_errors']:.0f} "
        f"| {r['rss_mib']:.0f} / {r['peak_mib']:.0f} "
        f"| {r['reuse_entries']:.0f} / {r['reuse_bytes'] / 2**20:.1f} MiB "
        f"| {r['reuse_hits']:.0f} / {r['reuse_misses']:.0f} |"
    )


HEADER = (
    "| agents | requests | direct p50 / p99 ms | proxy p50 / p99 ms | added p50 / p99 ms "
    "| proxy's own p50 / p99 (mean) ms | direct req/s | proxy req/s "
    "| CPU ms/req: replicas / Redis | Redis commands/req "
    "| Redis memory/conversation | blob memory / raw | results offloaded / blobs stored "
    "| blob memory (all Redis memory) / raw offloaded per conversation "
    "| crossings / read rounds / store errors | replica memory MiB: resident / peak (largest) "
    "| reuse cache: lines / counted bytes (all replicas) | reuse hits / misses |\n"
    "|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|"
)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--agents", default="25,50,100,200")
    parser.add_argument("--turns", type=int, default=24)
    parser.add_argument("--cluster", action="store_true", help="the three-master Cluster")
    parser.add_argument(
        "--reuse", type=int, default=256 * 2**20,
        help="server.reuse_max_bytes of the replicas (0: the reuse cache off)",
    )  # fmt: skip
    args = parser.parse_args()
    # A SIGTERM unwinds like Ctrl-C, so the servers this started are stopped too.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    outputs = Outputs()
    work = Path(tempfile.mkdtemp(prefix="fleet-load-"))
    with contextlib.ExitStack() as stack:
        if args.cluster:
            cluster = LocalRedisCluster(work / "cluster")
            url = cluster.start()
            stack.callback(cluster.stop)
        else:
            server = EmbeddedRedis(work / "redis")
            url = server.start_sync()
            stack.callback(server.stop_sync)
        store = Servers(url, args.cluster)
        stack.callback(store.close)
        port = free_port()
        standin = f"http://127.0.0.1:{port}"
        stack.enter_context(
            started(
                [PYTHON, "-m", "proxy", "--log-level", "WARNING", "stand-in", "--port",
                 str(port), "--window", "100000000"],
                standin, work / "stand-in.log",
            )
        )  # fmt: skip
        mode = "Cluster (3 masters)" if args.cluster else "one Redis"
        print(f"{mode}; {args.turns} turns per agent; {platform.python_version()}, "
              f"{os.cpu_count()} cores")  # fmt: skip
        print(HEADER)
        results = []
        for agents in [int(n) for n in args.agents.split(",")]:
            result = measure(args, store, standin, agents, outputs)
            results.append(result)
            print(row(result), flush=True)
        for r in results:
            top = ", ".join(
                f"{name} {calls / r['requests']:.2f}" for name, calls in r["top_commands"]
            )
            print(f"N={r['agents']}: per request {top}; unreadable refs {r['unreadable']:.0f}")


if __name__ == "__main__":
    main()
