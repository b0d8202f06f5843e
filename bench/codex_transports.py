"""Codex over both Responses transports, direct and through the proxy (issue 26).

The pinned Codex CLI (`codex exec`, built-in provider) runs the ShellChunks scenario (print
big.log in N chunks with the shell, then report) against the stand-in, four ways in one
run, interleaved in rounds so all see the same machine load:

- ws direct:   the stand-in serves the WebSocket; Codex prewarms, then sends each turn as
               a response.create with previous_response_id and only its new items;
- http direct: the stand-in answers the upgrade 426; Codex falls back to HTTP (its whole
               input every turn);
- ws proxy / http proxy: the same through the proxy (its embedded Redis, a 40k-window
               policy: it offloads and folds on the way), relaying the WebSocket or
               answering 426 when the upstream does;
- ws relay / http relay: through the proxy with thresholds the session never reaches
               (it compacts nothing): the transport's own cost.

Measured from the stand-in's records (arrival times, request bytes as they reached it):
- time to Codex's first model request: from spawning Codex to the first request of the
  model that reaches the stand-in (the prewarm frame, or the first POST);
- time per turn: the median gap between consecutive model requests (Codex's own work, its
  tool call, and everything between it and the upstream both ways); the proxy's added
  latency per turn is proxy - direct of the same transport, and the ratio proxy / direct;
- bytes sent upstream per turn (median and total): frames as they reached the upstream
  (WebSocket) or POST bodies (HTTP).

The stand-in and the proxy share this process's event loop (Codex is its own process):
the proxy's figures include the stand-in's work, as the direct ones do.

Usage: .venv/bin/python bench/codex_transports.py [--rounds 3] [--calls 16] [--write]
(--write replaces the "codex_transports.py" section of bench/RESULTS.md).
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import datetime
import itertools
import platform
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from aiohttp import web  # noqa: E402

from proxy.config import load_settings  # noqa: E402
from proxy.server.app import start  # noqa: E402
from proxy.testing.api_responses import RESPONSES, ResponsesOptions  # noqa: E402
from proxy.testing.codex_cli import CodexConfig, run_codex  # noqa: E402
from proxy.testing.codex_scenario import ShellChunks, big_log  # noqa: E402
from proxy.testing.standin import RECORDED, RecordedRequest, StandInOptions, create_app  # noqa: E402

RESULTS = ROOT / "bench" / "RESULTS.md"
WINDOW = 200_000  # the stand-in's: nothing Codex sends direct is refused
POLICY = {
    "match": "*",
    "window": 40_000,
    "trigger": 24_000,
    "target": 16_000,
    "keep_last": 2,
    "keep_results": 1,
    "summary_max_tokens": 1_500,
}
# The proxy with thresholds the session never reaches: a relay that compacts nothing.
RELAY_POLICY = {**POLICY, "window": WINDOW, "trigger": 190_000, "target": 100_000,
                "offload_trigger": 190_000}  # fmt: skip
TASK = "SCRIPTED-TASK: print big.log in chunks of lines with the shell, then report."
WAYS = ("ws direct", "http direct", "ws relay", "http relay", "ws proxy", "http proxy")


@dataclasses.dataclass
class Run:
    way: str
    first_ms: float  # spawn -> first model request at the stand-in
    gaps_ms: list[float]  # between consecutive model requests
    bytes_per_request: list[int]
    requests: int
    finished: bool
    incremental: int  # WebSocket frames that named previous_response_id (only new items)


def model_requests(recorded: list[RecordedRequest]) -> list[RecordedRequest]:
    """Codex's requests of the model as they reached the stand-in (not the upgrade GET,
    not the proxy's summariser calls)."""
    out = []
    for r in recorded:
        if r.headers.get("x-compaction-proxy-purpose"):
            continue
        if r.transport == "websocket" or (r.method == "POST" and r.path_qs == "/v1/responses"):
            out.append(r)
    return out


async def one_run(way: str, calls: int, base: Path, redis_dir: Path) -> Run:
    transport, where = way.split()
    scenario = ShellChunks(calls=calls)
    app = create_app(StandInOptions(windows={"*": WINDOW}, max_recorded=None))
    app[RESPONSES] = ResponsesOptions(
        plays_openai=True, scenario=scenario, websocket_status=101 if transport == "ws" else 426
    )
    runner = web.AppRunner(app, handler_cancellation=True, shutdown_timeout=1.0)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    host, port = runner.addresses[0][:2]
    standin_url = f"http://{host}:{port}"
    proxy = None
    url = standin_url
    if where in ("proxy", "relay"):
        settings = load_settings(
            None,
            environ={},
            overrides={
                "server.port": 0,
                "upstream.url": "http://127.0.0.1:9",
                "upstream.openai_url": standin_url,
                "store.redis_url": "",
                "store.state_dir": str(redis_dir),
            },
        )
        policy = POLICY if where == "proxy" else RELAY_POLICY
        proxy = await start(dataclasses.replace(settings, policies=(policy,)))
        url = proxy.url
    tmp = Path(tempfile.mkdtemp(dir=base))
    work = tmp / "work"
    work.mkdir()
    (work / scenario.file).write_text(big_log(scenario.calls * scenario.lines))
    try:
        spawned = time.monotonic()
        run = await run_codex(
            TASK,
            CodexConfig(url + "/v1", provider="openai"),
            work_dir=work,
            home_dir=tmp / "home",
            time_limit=300,
        )
    finally:
        if proxy is not None:
            await proxy.stop()
        await runner.cleanup()
    requests = model_requests(app[RECORDED])
    arrivals = [r.started_at for r in requests]
    return Run(
        way,
        (arrivals[0] - spawned) * 1000 if arrivals else float("nan"),
        [(b - a) * 1000 for a, b in itertools.pairwise(arrivals)],
        [len(r.body) for r in requests],
        len(requests),
        run.finished,
        sum(r.transport == "websocket" and b'"previous_response_id"' in r.body for r in requests),
    )


def median(values: list[float]) -> float:
    return statistics.median(values) if values else float("nan")


async def measure(rounds: int, calls: int) -> dict[str, list[Run]]:
    runs: dict[str, list[Run]] = {way: [] for way in WAYS}
    with tempfile.TemporaryDirectory() as base:
        for r in range(rounds):
            order = WAYS if r % 2 == 0 else tuple(reversed(WAYS))
            for way in order:
                runs[way].append(await one_run(way, calls, Path(base), Path(base) / "redis"))
                last = runs[way][-1]
                print(
                    f"round {r + 1} {way}: {last.requests} requests, first {last.first_ms:.0f} ms,"
                    f" turn {median(last.gaps_ms):.0f} ms, finished={last.finished}",
                    file=sys.stderr,
                )
    return runs


def report(runs: dict[str, list[Run]], command: str) -> str:
    def first(way: str) -> float:
        return median([r.first_ms for r in runs[way]])

    def turn(way: str) -> float:
        return median([g for r in runs[way] for g in r.gaps_ms])

    def per_request(way: str) -> float:
        return median([float(b) for r in runs[way] for b in r.bytes_per_request])

    def total(way: str) -> float:
        return median([float(sum(r.bytes_per_request)) for r in runs[way]])

    lines = [
        "## codex_transports.py",
        "",
        f"`{command}`, {datetime.date.today()}, {platform.machine()}, 2 cores shared with"
        f" other work, Python {platform.python_version()}. The pinned Codex CLI, built-in"
        " provider, the ShellChunks scenario, against the stand-in (window 200k) direct and"
        " through the proxy (policy window 40k, trigger 24k, target 16k: it offloads and"
        " folds on the way), each way once a round, rounds interleaved. Medians over the"
        " rounds (time per turn and bytes: over every request of every round).",
        "",
        "| way | finished | requests (incremental) | first model request ms (min-max) |"
        " time per turn ms |"
        " upstream bytes per request (median) | upstream bytes per session |",
        "|---|---|---:|---:|---:|---:|---:|",
    ]
    for way in WAYS:
        done = sum(r.finished for r in runs[way])
        count = median([float(r.requests) for r in runs[way]])
        incremental = median([float(r.incremental) for r in runs[way]])
        lines.append(
            f"| {way} | {done}/{len(runs[way])} | {count:.0f} ({incremental:.0f}) |"
            f" {first(way):.0f} ({min(r.first_ms for r in runs[way]):.0f}-"
            f"{max(r.first_ms for r in runs[way]):.0f}) |"
            f" {turn(way):.1f} | {per_request(way):,.0f} | {total(way):,.0f} |"
        )
    lines += ["", "| way | added ms per turn (proxy - direct) | proxy / direct per turn |"
              " first request: proxy / direct |", "|---|---:|---:|---:|"]  # fmt: skip
    for transport in ("ws", "http"):
        for where in ("relay", "proxy"):
            direct, proxied = f"{transport} direct", f"{transport} {where}"
            lines.append(
                f"| {transport} {where} | {turn(proxied) - turn(direct):.1f} |"
                f" {turn(proxied) / turn(direct):.2f} | {first(proxied) / first(direct):.2f} |"
            )
    lines += [
        "",
        f"Upstream bytes per session, WebSocket / HTTP: direct"
        f" {total('ws direct') / total('http direct'):.3f}, relayed"
        f" {total('ws relay') / total('http relay'):.3f}, compacted by the proxy"
        f" {total('ws proxy') / total('http proxy'):.3f}. Time per turn, WebSocket / HTTP:"
        f" direct {turn('ws direct') / turn('http direct'):.2f}, relayed"
        f" {turn('ws relay') / turn('http relay'):.2f}, compacted"
        f" {turn('ws proxy') / turn('http proxy'):.2f}.",
        "",
        "Reading: the time to the first model request is Codex's own start (hundreds of ms,"
        " widely spread on a machine shared with other work): what the proxy adds to it (the"
        " upstream socket opened before the 101, or the upgrade refused upstream) is within"
        " that spread. Relayed untouched, the WebSocket keeps what it is for (the same frames and"
        " bytes as direct: only new items after previous_response_id). Compacted, the proxy"
        " sends the whole rewritten input at every crossing: an offload step (on the"
        " Responses API aged results are stubbed in batches, the format's offload_batch,"
        " so the history as sent stays the same between them) or a fold:"
        f" {median([float(r.incremental) for r in runs['ws proxy']]):.0f}"
        f" of {median([float(r.requests) for r in runs['ws proxy']]):.0f} frames went"
        " incremental; its upstream bytes are between the WebSocket's direct and HTTP"
        " through the proxy (which are still well under Codex's own HTTP bytes, the"
        " history being compacted).",
        "",
    ]
    return "\n".join(lines)


def write_section(text: str) -> None:
    current = RESULTS.read_text()
    start = current.find("## codex_transports.py")
    if start < 0:
        RESULTS.write_text(current.rstrip("\n") + "\n\n" + text)
        return
    end = current.find("\n## ", start + 1)
    tail = current[end + 1 :] if end >= 0 else ""
    RESULTS.write_text(current[:start] + text + ("\n" + tail if tail else ""))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--calls", type=int, default=16)
    parser.add_argument("--write", action="store_true")
    parser.add_argument(
        "--offload-batch",
        type=int,
        help="the compacting policy's (default: the format's, 4 on Responses)",
    )
    args = parser.parse_args()
    if args.offload_batch is not None:
        POLICY["offload_batch"] = args.offload_batch
    runs = asyncio.run(measure(args.rounds, args.calls))
    command = (
        f".venv/bin/python bench/codex_transports.py --rounds {args.rounds} --calls {args.calls}"
    )
    text = report(runs, command)
    print(text)
    if args.write:
        write_section(text)


if __name__ == "__main__":
    main()
