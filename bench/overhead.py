"""What the proxy adds: latency, throughput and memory, against the floor of any relay.

Starts the stand-in upstream, the proxy (with its embedded Redis, as `compaction-proxy
serve` runs by default) and a bare aiohttp byte relay (the floor: it reads the request,
forwards the bytes, streams the answer back, and parses nothing) as separate processes on
loopback; this process is the load generator (an aiohttp client). For a 50 KB agent
request (the recorded Claude Code turn) and a 1 MB one, streamed and not, in one run:

- latency at concurrency 1: p50 / p99 direct, through the floor and through the proxy,
  interleaved in rounds so all see the same machine load; "added" is the difference to
  direct, and the proxy's added latency is reported as a ratio of the floor's;
- throughput at concurrency 16: requests per second of each, the proxy's as a ratio of
  the floor's;
- 1,000 concurrent open streams (the stand-in stalls after message_start): the proxy's
  resident memory before and while they are open.

Usage: .venv/bin/python bench/overhead.py [--seconds 4] [--rounds 10] [--loop asyncio|uvloop]
[--slices 4] [--before DIR] [--write] (--write replaces the "overhead.py" section of
bench/RESULTS.md).
`--before DIR` (a source tree of another version, e.g. `git archive main | tar -x -C DIR`)
runs that version's serve beside this one's against the canned upstream, interleaved in
the same run, and reports the two side by side: under load from other work the ratio
between them is steadier than either's ratio to the floor, the more so with more (shorter)
throughput slices (`--slices`, each target's share of `--seconds` cut in that many).

`--tracing` measures instead what OpenTelemetry traces cost (docs/operating.md, "Traces"): against
the canned upstream, the same proxy with tracing off and with it on (OTEL_TRACES_EXPORTER
=otlp, every request sampled, exporting over OTLP/HTTP to a sink process that reads and
discards), latency and throughput interleaved in one run as above; --write replaces the
"overhead.py --tracing" section.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import datetime
import json
import os
import platform
import re
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import aiohttp
import orjson

ROOT = Path(__file__).resolve().parents[1]
AGENT_REQUEST = ROOT / "tests" / "fixtures" / "agent-requests" / "claude-code-turn1.json"
RESULTS = ROOT / "bench" / "RESULTS.md"
PYTHON = sys.executable


def serve_canned(port: int, answers_file: str) -> None:
    """A minimal upstream: answers every Messages request with bytes the stand-in gave
    for it earlier (by body length), so the proxy's own ceiling can be measured."""
    from aiohttp import web

    answers = {
        int(k): (bytes.fromhex(v["body"]), v["type"])
        for k, v in orjson.loads(Path(answers_file).read_bytes()).items()
    }

    async def handle(request: web.Request) -> web.StreamResponse:
        body = await request.read()
        answer, content_type = answers[len(body)]
        headers = {"Content-Type": content_type, "request-id": "req_canned"}
        if content_type.startswith("text/event-stream"):
            response = web.StreamResponse(headers=headers)
            await response.prepare(request)
            await response.write(answer)
            await response.write_eof()
            return response
        return web.Response(body=answer, headers=headers)

    async def health(request: web.Request) -> web.Response:
        return web.Response(text="ok")

    app = web.Application(client_max_size=64 * 1024 * 1024)
    app.router.add_post("/v1/messages", handle)
    app.router.add_get("/v1/models", health)
    with asyncio.Runner() as runner:  # asyncio's loop: the same upstream whatever is measured
        runner.run(_serve_forever(app, port))


def serve_bare_relay(port: int, upstream: str, loop: str) -> None:
    """The floor: an aiohttp server that relays bytes to `upstream` with an aiohttp
    client, as any Python relay must, and does nothing else (no parsing, no metrics)."""
    from aiohttp import web

    hop = {"connection", "keep-alive", "transfer-encoding", "host", "content-length", "upgrade"}

    async def handle(request: web.Request) -> web.StreamResponse:
        body = await request.read()
        headers = [(k, v) for k, v in request.headers.items() if k.lower() not in hop]
        session = request.app[SESSION]
        async with session.request(
            request.method, upstream + request.raw_path, data=body, headers=headers
        ) as answer:
            out_headers = [(k, v) for k, v in answer.headers.items() if k.lower() not in hop]
            response = web.StreamResponse(status=answer.status, headers=out_headers)
            await response.prepare(request)
            async for chunk in answer.content.iter_any():
                await response.write(chunk)
            await response.write_eof()
            return response

    async def lifetime(app: web.Application) -> Any:
        app[SESSION] = aiohttp.ClientSession(
            auto_decompress=False, timeout=aiohttp.ClientTimeout(total=None, sock_read=600)
        )
        yield
        await app[SESSION].close()

    SESSION = web.AppKey("session", aiohttp.ClientSession)
    app = web.Application(client_max_size=64 * 1024 * 1024)
    app.cleanup_ctx.append(lifetime)
    app.router.add_route("*", "/{tail:.*}", handle)
    loop_factory = None
    if loop == "uvloop":
        import uvloop

        loop_factory = uvloop.new_event_loop
    runner = asyncio.Runner(loop_factory=loop_factory)
    with runner:
        runner.run(_serve_forever(app, port))


def serve_otlp_sink(port: int) -> None:
    """An OTLP/HTTP trace endpoint that reads each export and answers an empty
    ExportTraceServiceResponse (which is zero bytes of protobuf)."""
    from aiohttp import web

    async def traces(request: web.Request) -> web.Response:
        await request.read()
        return web.Response(body=b"", content_type="application/x-protobuf")

    app = web.Application(client_max_size=64 * 1024 * 1024)
    app.router.add_post("/v1/traces", traces)
    app.router.add_get("/", lambda request: web.Response(text="ok"))
    with asyncio.Runner() as runner:
        runner.run(_serve_forever(app, port))


async def _serve_forever(app: Any, port: int) -> None:
    from aiohttp import web

    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    await web.TCPSite(runner, "127.0.0.1", port, backlog=1024).start()
    await asyncio.Event().wait()


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def rss_mib(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    raise RuntimeError("no VmRSS")


@contextlib.contextmanager
def process(
    args: list[str], env: dict[str, str], log: Path | None = None, cwd: Path | None = None
) -> Iterator[subprocess.Popen[bytes]]:
    """A child process for the length of the block; its stderr to `log` when given (else
    kept for wait_ready); run in `cwd` when given (else ROOT with a log, this one's own)."""
    if log is None:
        child = subprocess.Popen(
            args, env=env, cwd=cwd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE
        )
    else:
        with log.open("wb") as err:
            child = subprocess.Popen(
                args, env=env, cwd=cwd or ROOT, stdout=subprocess.DEVNULL, stderr=err
            )
    try:
        yield child
    finally:
        child.terminate()
        try:
            child.wait(timeout=15)
        except subprocess.TimeoutExpired:
            child.kill()
            child.wait()


def tree_process(
    args: list[str], env: dict[str, str], tree: Path
) -> contextlib.AbstractContextManager[subprocess.Popen[bytes]]:
    """A `serve` of the source tree `tree` (its own directory: `-m proxy` imports from
    there), its stderr kept for wait_ready."""
    return process(args, {**env, "PYTHONPATH": str(tree)}, cwd=tree)


async def wait_ready(session: aiohttp.ClientSession, url: str, child: Any) -> None:
    for _ in range(300):
        if child.poll() is not None:
            raise RuntimeError(f"{url} exited: {child.stderr.read().decode()[-2000:]}")
        with contextlib.suppress(aiohttp.ClientError):
            async with session.get(url) as r:
                if r.status < 500:
                    return
        await asyncio.sleep(0.1)
    raise RuntimeError(f"{url} did not come up")


def request_bodies() -> tuple[dict[str, str], dict[str, bytes]]:
    """Headers, and the bodies by name: the 50 KB recorded agent turn, and the same turn
    grown to 1 MB by a long tool-output-like text block; each streamed and not."""
    recorded = orjson.loads(AGENT_REQUEST.read_bytes())
    headers = {k: v for k, v in recorded["headers"].items() if k.lower() != "connection"}
    headers["x-api-key"] = "sk-bench"
    base = recorded["body"]
    big = orjson.loads(orjson.dumps(base))
    words = [
        "alpha",
        "beta",
        "gamma",
        "delta",
        "epsilon",
        "zeta",
        "eta",
        "theta",
        "iota",
        "kappa",
        "lambda",
        "mu",
    ]
    filler = " ".join(words[i % len(words)] + str(i % 97) for i in range(150_000))
    content = big["messages"][-1]["content"]
    content.append({"type": "text", "text": filler[: 1_000_000 - len(orjson.dumps(base))]})
    bodies = {}
    for name, body in (("50 KB", base), ("1 MB", big)):
        for stream in (False, True):
            bodies[f"{name} {'stream' if stream else 'json'}"] = orjson.dumps(
                {**body, "stream": stream}
            )
    return headers, bodies


async def one(
    session: aiohttp.ClientSession, url: str, body: bytes, headers: dict[str, str]
) -> float:
    start = time.perf_counter()
    async with session.post(url, data=body, headers=headers) as r:
        await r.read()
        if r.status != 200:
            raise RuntimeError(f"{url}: {r.status} {(await r.read())[:300]!r}")
    return time.perf_counter() - start


def pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


async def latency(
    session: aiohttp.ClientSession,
    urls: dict[str, str],
    body: bytes,
    headers: dict[str, str],
    rounds: int,
    per_round: int,
) -> dict[str, list[float]]:
    """Concurrency 1; direct and proxy alternate in rounds so drift hits both alike."""
    times: dict[str, list[float]] = {k: [] for k in urls}
    for _ in range(rounds):
        for name, url in urls.items():
            for _ in range(per_round):
                times[name].append(await one(session, url, body, headers))
    return times


def cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


async def throughput(
    session: aiohttp.ClientSession,
    urls: dict[str, str],
    body: bytes,
    headers: dict[str, str],
    seconds: float,
    concurrency: int,
    pids: dict[str, int],
    slices: int = 4,
) -> dict[str, tuple[float, float]]:
    """Requests per second at `concurrency`, direct, floor and proxy alternating in
    `slices` slices (so a burst of load from elsewhere hits all); with the CPU per request
    of the process in `pids` that served them (floor, proxy)."""
    done = {who: 0 for who in urls}
    spent = {who: 0.0 for who in urls}
    cpu_spent = {who: 0.0 for who in urls}
    for _ in range(slices):
        for who, url in urls.items():
            stop = time.perf_counter() + seconds / slices

            async def worker(url: str = url, stop: float = stop, who: str = who) -> None:
                while time.perf_counter() < stop:
                    await one(session, url, body, headers)
                    done[who] += 1

            pid = pids.get(who)
            cpu = cpu_seconds(pid) if pid else 0.0
            start = time.perf_counter()
            await asyncio.gather(*(worker() for _ in range(concurrency)))
            spent[who] += time.perf_counter() - start
            if pid:
                cpu_spent[who] += cpu_seconds(pid) - cpu
    return {who: (done[who] / spent[who], cpu_spent[who] / done[who] * 1e6) for who in urls}


async def open_streams(
    session: aiohttp.ClientSession, url: str, headers: dict[str, str], count: int, proxy_pid: int
) -> tuple[float, float, int]:
    """Open `count` streams that stall after message_start; the proxy's RSS (MiB)
    before and while all are open, and how many were open at the measurement."""
    body = orjson.dumps(
        {
            "model": "claude-haiku-4-5",
            "max_tokens": 64,
            "stream": True,
            "messages": [{"role": "user", "content": "hold this stream open"}],
        }
    )
    stall = {**headers, "x-stand-in": '{"fault": "stall", "stall_seconds": 120}'}
    before = rss_mib(proxy_pid)
    opened = 0
    all_open = asyncio.Event()
    release = asyncio.Event()

    async def hold() -> None:
        nonlocal opened
        async with session.post(url, data=body, headers=stall) as r:
            await r.content.readuntil(b"\n\n")
            opened += 1
            if opened == count:
                all_open.set()
            await release.wait()

    tasks = [asyncio.create_task(hold()) for _ in range(count)]
    try:
        await asyncio.wait_for(all_open.wait(), timeout=120)
        await asyncio.sleep(1.0)
        during = rss_mib(proxy_pid)
    finally:
        release.set()
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
    return before, during, opened


async def measure(
    session: aiohttp.ClientSession,
    urls: dict[str, str],
    bodies: dict[str, bytes],
    headers: dict[str, str],
    args: argparse.Namespace,
    label: str,
    pids: dict[str, int],
) -> dict[str, Any]:
    cases: dict[str, Any] = {}
    for name, body in bodies.items():
        for url in urls.values():  # warm the counter cache, pools, code paths
            for _ in range(20):
                await one(session, url, body, headers)
        per_round = 20 if len(body) < 200_000 else 5
        times = await latency(session, urls, body, headers, args.rounds, per_round)
        case: dict[str, Any] = {"bytes": len(body)}
        for who, values in times.items():
            case[who] = {"p50": pct(values, 0.5) * 1000, "p99": pct(values, 0.99) * 1000}
        rates = await throughput(session, urls, body, headers, args.seconds, 16, pids, args.slices)
        for who, (rps, cpu_us) in rates.items():
            case[who]["rps"] = rps
            case[who]["cpu_us"] = cpu_us
        cases[name] = case
        print(label, name, json.dumps(case), flush=True)
    return cases


async def record_answers(
    session: aiohttp.ClientSession, url: str, bodies: dict[str, bytes], headers: dict[str, str]
) -> dict[str, Any]:
    answers = {}
    for body in bodies.values():
        async with session.post(url, data=body, headers=headers) as r:
            answers[str(len(body))] = {
                "body": (await r.read()).hex(),
                "type": r.headers["Content-Type"],
            }
    return answers


async def run(args: argparse.Namespace) -> dict[str, Any]:
    headers, bodies = request_bodies()
    names = ("standin", "canned", "proxy", "proxy_canned", "floor", "floor_canned", "before")
    ports = {name: free_port() for name in names}
    work = Path(tempfile.mkdtemp(prefix="overhead-"))
    env = {**os.environ, "PYTHONUNBUFFERED": "1", "COMPACTION_PROXY_SERVER_EVENT_LOOP": args.loop}
    env.pop("REDIS_URL", None)

    # The documented settings, plus a policy whose window takes the 1 MB request: this
    # benchmark measures the path of requests that need no rewrite.
    config = work / "proxy.toml"
    config.write_text(
        (ROOT / "config" / "proxy.toml").read_text()
        + '\n[[policy]]\nmatch = "*"\nwindow = 2000000\ntrigger = 1800000\ntarget = 600000\n'
    )

    def proxy_cmd(
        upstream_port: int, port: int, tree: Path = ROOT
    ) -> tuple[list[str], dict[str, str], Path]:
        state = {"COMPACTION_PROXY_STORE_STATE_DIR": str(work / f"state-{port}")}
        # `-m proxy` imports the package from the working directory: the tree's own.
        cmd = [
            PYTHON,
            "-m",
            "proxy",
            "--log-level",
            "WARNING",
            "serve",
            "--port",
            str(port),
            "--upstream",
            f"http://127.0.0.1:{upstream_port}",
            "--config",
            str(config),
        ]
        return cmd, {**env, **state}, tree

    def floor_cmd(upstream_port: int, port: int) -> list[str]:
        upstream = f"http://127.0.0.1:{upstream_port}"
        return [PYTHON, __file__, "--serve-floor", str(port), upstream, args.loop]

    standin_cmd = [
        PYTHON,
        "-m",
        "proxy",
        "--log-level",
        "WARNING",
        "stand-in",
        "--port",
        str(ports["standin"]),
        "--window",
        "100000000",
    ]
    results: dict[str, Any] = {}
    local = "http://127.0.0.1:{}".format
    connector = aiohttp.TCPConnector(limit=0)
    timeout = aiohttp.ClientTimeout(total=None, sock_read=120)
    async with aiohttp.ClientSession(connector=connector, timeout=timeout) as session:
        with (
            process(standin_cmd, env) as standin,
            tree_process(*proxy_cmd(ports["standin"], ports["proxy"])) as proxy,
            process(floor_cmd(ports["standin"], ports["floor"]), env) as floor,
        ):
            await wait_ready(session, local(ports["standin"]) + "/v1/models", standin)
            await wait_ready(session, local(ports["proxy"]) + "/healthz", proxy)
            await wait_ready(session, local(ports["floor"]) + "/v1/models", floor)
            urls = {
                "direct": local(ports["standin"]) + "/v1/messages?beta=true",
                "floor": local(ports["floor"]) + "/v1/messages?beta=true",
                "proxy": local(ports["proxy"]) + "/v1/messages?beta=true",
            }
            answers = await record_answers(session, urls["direct"], bodies, headers)
            (work / "answers.json").write_bytes(orjson.dumps(answers))
            results["standin"] = await measure(
                session, urls, bodies, headers, args, "stand-in",
                {"floor": floor.pid, "proxy": proxy.pid},
            )  # fmt: skip
            before, during, opened = await open_streams(
                session, urls["proxy"], headers, args.streams, proxy.pid
            )
            results["streams"] = {"count": opened, "rss_before": before, "rss_during": during}
            print("streams", json.dumps(results["streams"]), flush=True)

        canned_cmd = [
            PYTHON,
            __file__,
            "--serve-canned",
            str(ports["canned"]),
            str(work / "answers.json"),
        ]
        before_tree = args.before.resolve() if args.before else None
        with (
            process(canned_cmd, env) as canned,
            tree_process(*proxy_cmd(ports["canned"], ports["proxy_canned"])) as proxy,
            process(floor_cmd(ports["canned"], ports["floor_canned"]), env) as floor,
            contextlib.ExitStack() as more,
        ):
            await wait_ready(session, local(ports["canned"]) + "/v1/models", canned)
            await wait_ready(session, local(ports["proxy_canned"]) + "/healthz", proxy)
            await wait_ready(session, local(ports["floor_canned"]) + "/v1/models", floor)
            urls = {
                "direct": local(ports["canned"]) + "/v1/messages?beta=true",
                "floor": local(ports["floor_canned"]) + "/v1/messages?beta=true",
                "proxy": local(ports["proxy_canned"]) + "/v1/messages?beta=true",
            }
            pids = {"floor": floor.pid, "proxy": proxy.pid}
            if before_tree is not None:  # the other version's serve, interleaved with ours
                other = more.enter_context(
                    tree_process(*proxy_cmd(ports["canned"], ports["before"], before_tree))
                )
                await wait_ready(session, local(ports["before"]) + "/healthz", other)
                urls["before"] = local(ports["before"]) + "/v1/messages?beta=true"
                pids["before"] = other.pid
            results["canned"] = await measure(session, urls, bodies, headers, args, "canned", pids)
    return results


async def run_tracing(args: argparse.Namespace) -> dict[str, Any]:
    """The proxy with tracing off and on, against the canned upstream, in one run."""
    headers, bodies = request_bodies()
    names = ("standin", "canned", "sink", "proxy", "traced", "sampled")
    ports = {name: free_port() for name in names}
    work = Path(tempfile.mkdtemp(prefix="overhead-tracing-"))
    env = {**os.environ, "PYTHONUNBUFFERED": "1", "COMPACTION_PROXY_SERVER_EVENT_LOOP": args.loop}
    env.pop("REDIS_URL", None)
    for name in [k for k in env if k.startswith("OTEL_")]:
        env.pop(name)
    config = work / "proxy.toml"
    config.write_text(
        (ROOT / "config" / "proxy.toml").read_text()
        + '\n[[policy]]\nmatch = "*"\nwindow = 2000000\ntrigger = 1800000\ntarget = 600000\n'
    )
    local = "http://127.0.0.1:{}".format
    traced_env = {
        "OTEL_TRACES_EXPORTER": "otlp",
        "OTEL_EXPORTER_OTLP_ENDPOINT": local(ports["sink"]),
        "OTEL_EXPORTER_OTLP_PROTOCOL": "http/protobuf",
        "OTEL_SERVICE_NAME": "compaction-proxy-bench",
    }

    def proxy_cmd(port: int, extra: dict[str, str]) -> tuple[list[str], dict[str, str]]:
        state = {"COMPACTION_PROXY_STORE_STATE_DIR": str(work / f"state-{port}")}
        cmd = [
            PYTHON, "-m", "proxy", "--log-level", "WARNING", "serve", "--port", str(port),
            "--upstream", local(ports["canned"]), "--config", str(config),
        ]  # fmt: skip
        return cmd, {**env, **state, **extra}

    standin_cmd = [
        PYTHON, "-m", "proxy", "--log-level", "WARNING", "stand-in", "--port",
        str(ports["standin"]), "--window", "100000000",
    ]  # fmt: skip
    canned_cmd = [PYTHON, __file__, "--serve-canned", str(ports["canned"]), str(work / "a.json")]
    sink_cmd = [PYTHON, __file__, "--serve-otlp", str(ports["sink"])]
    connector = aiohttp.TCPConnector(limit=0)
    timeout = aiohttp.ClientTimeout(total=None, sock_read=120)
    async with aiohttp.ClientSession(connector=connector, timeout=timeout) as session:
        with process(standin_cmd, env) as standin:
            await wait_ready(session, local(ports["standin"]) + "/v1/models", standin)
            direct = local(ports["standin"]) + "/v1/messages?beta=true"
            answers = await record_answers(session, direct, bodies, headers)
        (work / "a.json").write_bytes(orjson.dumps(answers))
        with (
            process(canned_cmd, env) as canned,
            process(sink_cmd, env) as sink,
            process(*proxy_cmd(ports["proxy"], {})) as proxy,
            process(*proxy_cmd(ports["traced"], traced_env)) as traced,
            process(*proxy_cmd(ports["sampled"], {**traced_env, **SAMPLED})) as sampled,
        ):
            await wait_ready(session, local(ports["canned"]) + "/v1/models", canned)
            await wait_ready(session, local(ports["sink"]) + "/", sink)
            await wait_ready(session, local(ports["proxy"]) + "/healthz", proxy)
            await wait_ready(session, local(ports["traced"]) + "/healthz", traced)
            await wait_ready(session, local(ports["sampled"]) + "/healthz", sampled)
            urls = {
                who: local(ports["canned" if who == "direct" else who]) + "/v1/messages?beta=true"
                for who in ("direct", "proxy", "traced", "sampled")
            }
            cases = await measure(
                session, urls, bodies, headers, args, "tracing",
                {"proxy": proxy.pid, "traced": traced.pid, "sampled": sampled.pid},
            )  # fmt: skip
    return cases


# The third proxy: tracing on, one request in ten sampled (the SDK's own sampler).
SAMPLED = {"OTEL_TRACES_SAMPLER": "parentbased_traceidratio", "OTEL_TRACES_SAMPLER_ARG": "0.1"}


def tracing_report(cases: dict[str, Any], args: argparse.Namespace) -> str:
    today = datetime.date.today().isoformat()
    lines = [
        "## overhead.py --tracing",
        "",
        f"`.venv/bin/python bench/overhead.py --tracing --seconds {args.seconds:g} --rounds "
        f"{args.rounds} --loop {args.loop}`, {today}, {os.cpu_count()} cores (shared with "
        f"other work), Python {platform.python_version()}. The same proxy three times, "
        "against the canned upstream, interleaved in one run: tracing off (no OTEL_* set), "
        "on (OTEL_TRACES_EXPORTER=otlp, every request sampled: its SERVER span, the upstream "
        "call's CLIENT span and its Redis spans, batched and exported over OTLP/HTTP to a "
        "sink process), and on with one request in ten sampled "
        "(OTEL_TRACES_SAMPLER=parentbased_traceidratio, OTEL_TRACES_SAMPLER_ARG=0.1). "
        "Latency at concurrency 1, throughput at 16, CPU per request of each proxy process "
        "(its exporter thread included); ratios against tracing off.",
        "",
        "| request | direct p50 ms | added p50 ms off / on / 10% | added p50 on / off "
        "| req/s off / on / 10% | req/s on / off | req/s 10% / off "
        "| CPU µs/req off / on / 10% |",
        "|---|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for name, case in cases.items():
        d, off, on, some = case["direct"], case["proxy"], case["traced"], case["sampled"]
        added = [who["p50"] - d["p50"] for who in (off, on, some)]
        lines.append(
            f"| {name} | {d['p50']:.2f} | {added[0]:.2f} / {added[1]:.2f} / {added[2]:.2f} "
            f"| {added[1] / max(added[0], 1e-6):.2f}x "
            f"| {off['rps']:.0f} / {on['rps']:.0f} / {some['rps']:.0f} "
            f"| {on['rps'] / off['rps']:.2f}x | {some['rps'] / off['rps']:.2f}x "
            f"| {off['cpu_us']:.0f} / {on['cpu_us']:.0f} / {some['cpu_us']:.0f} |"
        )
    lines += [
        "",
        "Tracing off adds nothing: no SDK is imported and no middleware installed (a test "
        "checks it). With every request sampled, most of the cost is the SDK's own: "
        "creating the spans and their attributes in the request's thread, and encoding "
        "them to protobuf in the exporter's thread (pure Python); a sampler that keeps a "
        "fraction pays it for that fraction, plus a few µs per request for the rest. "
        "Absolute figures move with the load other work puts on the shared cores; the "
        "ratios in one run are the figure to read.",
        "",
    ]
    return "\n".join(lines)


def ratios(case: dict[str, Any], who: str = "proxy") -> tuple[float, float]:
    """(the proxy's added p50 / the floor's, the proxy's req/s / the floor's); the first
    is NaN when the floor's added p50 is not above zero (load drowned it)."""
    d, f, p = case["direct"], case["floor"], case[who]
    floor_added = f["p50"] - d["p50"]
    added = (p["p50"] - d["p50"]) / floor_added if floor_added > 0 else float("nan")
    return added, p["rps"] / f["rps"]


def _times(ratio: float) -> str:
    return "n/a" if ratio != ratio else f"{ratio:.2f}x"


def _table(cases: dict[str, Any]) -> list[str]:
    lines = [
        "| request | direct p50 ms | floor added p50 / p99 ms | proxy added p50 / p99 ms "
        "| added p50 proxy / floor | direct req/s | floor req/s | proxy req/s "
        "| req/s proxy / floor | CPU µs/req floor / proxy |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for name, case in cases.items():
        d, f, p = case["direct"], case["floor"], case["proxy"]
        added, rate = ratios(case)
        lines.append(
            f"| {name} | {d['p50']:.2f} | {f['p50'] - d['p50']:.2f} / {f['p99'] - d['p99']:.2f} "
            f"| {p['p50'] - d['p50']:.2f} / {p['p99'] - d['p99']:.2f} | {_times(added)} "
            f"| {d['rps']:.0f} | {f['rps']:.0f} | {p['rps']:.0f} | {rate:.2f}x "
            f"| {f['cpu_us']:.0f} / {p['cpu_us']:.0f} |"
        )
    return lines


def report(results: dict[str, Any], args: argparse.Namespace) -> str:
    today = datetime.date.today().isoformat()
    s = results["streams"]
    load = results.get("load", (0.0, 0.0))
    per_stream = (s["rss_during"] - s["rss_before"]) * 1024 / max(1, s["count"])
    return "\n".join(
        [
            "## overhead.py",
            "",
            f"`.venv/bin/python bench/overhead.py --seconds {args.seconds:g} --rounds "
            f"{args.rounds} --loop {args.loop}{_options(args)}`, {today}, {os.cpu_count()} "
            f"cores (shared with other work: load average {load[0]:.1f} at the start, "
            f"{load[1]:.1f} at the end), "
            f"Python {platform.python_version()}, aiohttp {aiohttp.__version__}. "
            "Upstream, proxy (`serve` with its embedded Redis), the floor (a bare aiohttp byte "
            "relay that parses nothing) and the load generator (aiohttp client) are separate "
            "processes on loopback, all on the 2 cores. Latency at concurrency 1 (direct, "
            "floor and proxy interleaved in rounds), throughput at 16. The 50 KB request is "
            "the recorded Claude Code turn (no rewrite needed); the 1 MB one is the same turn "
            "with a long text block.",
            "",
            "Against the stand-in upstream (which validates, counts tokens and models the "
            "prompt cache on every request, so it caps the throughput):",
            "",
            *_table(results["standin"]),
            "",
            "Against a canned upstream (replays the stand-in's recorded answer bytes; "
            "measures the proxy's own ceiling):",
            "",
            *_table(results["canned"]),
            "",
            *_before_table(results["canned"], args),
            f"{s['count']} concurrent open streams through the proxy (stand-in stalls after "
            f"message_start): resident memory {s['rss_before']:.0f} MiB before, "
            f"{s['rss_during']:.0f} MiB while open ({per_stream:.0f} KiB per stream).",
            "",
            *_targets(results),
            "",
            "Absolute figures move by up to 2x between runs with the load other work puts on "
            "the shared cores (an earlier run under load gave 1,100-1,400 req/s through the "
            "proxy); the added latency is the steadier figure. Of the proxy's CPU per 50 KB "
            "request, parsing the body and counting it (the system prompt and tools exactly, "
            "against the count cache; the messages bounded by their bytes: the 49 KB turn is "
            "over the byte bound of the default offload_trigger, 12,000) are about a fifth "
            "each; the rest is aiohttp's server and client work, the socket writes, the "
            "headers, the record and the metrics (the profile section below).",
            "",
        ]
    )


def _options(args: argparse.Namespace) -> str:
    slices = f" --slices {args.slices}" if args.slices != 4 else ""
    return slices + (f" --before {args.before}" if args.before else "")


def _before_table(cases: dict[str, Any], args: argparse.Namespace) -> list[str]:
    """With --before: the other version's serve beside this one, in the same run."""
    if not args.before or not all("before" in case for case in cases.values()):
        return []
    lines = [
        f"This tree against `--before {args.before}` (another version's serve, interleaved "
        "with this one's against the same canned upstream, in the same run):",
        "",
        "| request | added p50 ms before / after | added p50 / floor before / after "
        "| req/s / floor before / after | CPU µs/req before / after | CPU after / before |",
        "|---|---:|---:|---:|---:|---:|",
    ]
    for name, case in cases.items():
        d, b, p = case["direct"], case["before"], case["proxy"]
        (added_b, rate_b), (added_p, rate_p) = ratios(case, "before"), ratios(case)
        lines.append(
            f"| {name} | {b['p50'] - d['p50']:.2f} / {p['p50'] - d['p50']:.2f} "
            f"| {_times(added_b)} / {_times(added_p)} | {rate_b:.2f}x / {rate_p:.2f}x "
            f"| {b['cpu_us']:.0f} / {p['cpu_us']:.0f} | {p['cpu_us'] / b['cpu_us']:.2f}x |"
        )
    return [*lines, ""]


def _targets(results: dict[str, Any]) -> list[str]:
    """The issue's targets for a 50 KB request that needs no rewrite, checked."""
    small = [
        case
        for upstream in ("standin", "canned")
        for name, case in results[upstream].items()
        if name.startswith("50 KB")
    ]
    added = [c["proxy"]["p50"] - c["direct"]["p50"] for c in small]
    canned = [c for n, c in results["canned"].items() if n.startswith("50 KB")]
    added_ratio = [r for c in canned if (r := ratios(c)[0]) == r] or [float("inf")]
    rate_ratio = [ratios(c)[1] for c in canned]
    rss = results["streams"]["rss_during"]

    def verdict(ok: bool) -> str:
        return "met" if ok else "NOT met"

    return [
        "Targets for the 50 KB request against the canned upstream (json and stream): the "
        "proxy's added p50 at most 1.3x the floor's: "
        f"{min(added_ratio):.2f}-{max(added_ratio):.2f}x, {verdict(max(added_ratio) <= 1.3)}; "
        f"throughput at concurrency 16 at least 0.85x the floor's: {min(rate_ratio):.2f}-"
        f"{max(rate_ratio):.2f}x, {verdict(min(rate_ratio) >= 0.85)}. Added p50 in absolute "
        f"terms: {min(added):.2f}-{max(added):.2f} ms. 1,000 open streams under 300 MB: "
        f"{rss:.0f} MiB, {verdict(rss * 1.048576 < 300)}.",
    ]


def write_section(text: str, heading: str = "## overhead.py") -> None:
    current = RESULTS.read_text() if RESULTS.exists() else "# Benchmark results\n\n"
    pattern = re.compile(rf"^{re.escape(heading)}\n.*?(?=^## |\Z)", re.S | re.M)
    if pattern.search(current):
        updated = pattern.sub(lambda _: text + "\n", current)
    else:
        updated = current.rstrip("\n") + "\n\n" + text + "\n"
    RESULTS.write_text(updated)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=4.0, help="per throughput run")
    parser.add_argument("--rounds", type=int, default=10, help="latency rounds")
    parser.add_argument("--streams", type=int, default=1000)
    parser.add_argument("--write", action="store_true", help="update bench/RESULTS.md")
    parser.add_argument(
        "--slices", type=int, default=4, help="throughput slices per target, interleaved"
    )
    parser.add_argument(
        "--before",
        type=Path,
        help="a source tree of another version: its serve measured beside this one's"
        " (canned upstream)",
    )
    parser.add_argument(
        "--loop",
        choices=("asyncio", "uvloop"),
        default="asyncio",
        help="event loop of proxy and floor",
    )
    parser.add_argument(
        "--serve-canned", nargs=2, metavar=("PORT", "ANSWERS"), help=argparse.SUPPRESS
    )
    parser.add_argument("--serve-floor", nargs=3, help=argparse.SUPPRESS)
    parser.add_argument("--serve-otlp", type=int, metavar="PORT", help=argparse.SUPPRESS)
    parser.add_argument(
        "--tracing", action="store_true", help="tracing off against on (docs/operating.md, Traces)"
    )
    args = parser.parse_args()
    if args.serve_otlp:
        serve_otlp_sink(args.serve_otlp)
        return
    if args.tracing:
        text = tracing_report(asyncio.run(run_tracing(args)), args)
        print(text)
        if args.write:
            write_section(text, "## overhead.py --tracing")
        return
    if args.serve_floor:
        serve_bare_relay(int(args.serve_floor[0]), args.serve_floor[1], args.serve_floor[2])
        return
    if args.serve_canned:
        serve_canned(int(args.serve_canned[0]), args.serve_canned[1])
        return
    load_before = os.getloadavg()[0]
    results = asyncio.run(run(args))
    results["load"] = (load_before, os.getloadavg()[0])
    text = report(results, args)
    print(text)
    if args.write:
        write_section(text)


if __name__ == "__main__":
    main()
