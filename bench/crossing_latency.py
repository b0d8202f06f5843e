"""Does a crossing turn wait for the summariser? Added latency per turn of a growing session.

Issue 12's target: with a summariser that takes 3 s, no agent turn of a gradually growing
session waits for it (added latency on crossing turns under 100 ms): the next fold's
summary is made ahead, in the background, from the prepare point on, and the crossing
folds with it (docs/compaction.md).

Three processes on loopback:

- the stand-ins (a child of this script): one with the policy's window behind the proxy,
  whose summariser answers take `--summary-delay` seconds, and one with an unlimited
  window for the direct floor;
- the proxy: `compaction-proxy serve` with its embedded Redis and a small policy
  (`--window`, trigger 70% and target 30% of it; results kept whole, so the history grows
  by a few thousand tokens a turn and folds every few turns);
- this script: the scripted agent (proxy/testing/agent.py, the real anthropic SDK). Each
  of its requests is sent, byte for byte, straight to the floor stand-in and through the
  proxy, one after the other (which goes first alternates), both timed to the last byte
  of the answer; the agent goes on with the proxy's answer. Between turns the agent's
  tool runs for `--tool-seconds` (a real agent's turn takes seconds of model and tool
  time: the time a summary made ahead has to get ready).

Added latency of a turn = through the proxy - direct. Crossing turns are those the proxy
folded or packed (x-compaction-strategy summary/pack, with x-compaction-summary saying
ahead/made/reused); deferred turns went on unfolded over the trigger because their
summary was still being made (x-compaction-reason summary_pending). A turn waited for the
summariser when its added latency is 1 s or more.

The contrast runs are the same session with less time between turns
(`--contrast-seconds`, 0.5 s and none): such an agent outgrows its summariser, so the
summary made ahead is not ready by the wait point and the crossing there waits for what
is left of that call.

Usage: .venv/bin/python bench/crossing_latency.py [--turns 50] [--summary-delay 3]
       [--tool-seconds 1.5] [--repeat 1] [--no-contrast] [--write]
(--write replaces the "crossing_latency.py" section of bench/RESULTS.md, or appends it;
--keep-log prints the proxy's log, at $CROSSING_LATENCY_LOG_LEVEL, WARNING by default;
CROSSING_LATENCY_ALL_ROWS=1 puts every turn in the tables).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import datetime
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path

import aiohttp
import anthropic
import httpx2
from aiohttp import web

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench.overhead import free_port, process  # noqa: E402
from proxy.core.tokens import default_counter  # noqa: E402
from proxy.testing.agent import Turn, run_agent, tool_output  # noqa: E402
from proxy.testing.standin import RECORDED, StandInOptions, create_app  # noqa: E402

RESULTS = ROOT / "bench" / "RESULTS.md"
SECTION = "## crossing_latency.py"
PYTHON = sys.executable
PURPOSE = "x-compaction-proxy-purpose"
WAITED_MS = 1000.0  # added latency from which a turn is said to have waited
TARGET_MS = 100.0
ALL_ROWS = bool(os.environ.get("CROSSING_LATENCY_ALL_ROWS"))  # every turn in the table


# -- the stand-ins' process -------------------------------------------------------------


def serve_standins(proxied_port: int, direct_port: int, window: int, delay: float) -> None:
    """Both stand-ins in one process (this script's child). GET /_bench/summaries on the
    proxied one says how many summariser calls it answered, and when."""

    async def summaries(request: web.Request) -> web.Response:
        calls = [r for r in request.app[RECORDED] if r.headers.get(PURPOSE) == "summary"]
        done = [r for r in calls if r.outcome == "complete"]
        return web.json_response({"calls": len(calls), "complete": len(done)})

    async def serve() -> None:
        proxied = create_app(
            StandInOptions(windows={"*": window}, max_recorded=None, summary_delay=delay)
        )
        proxied.router.add_get("/_bench/summaries", summaries)
        direct = create_app(StandInOptions(windows={"*": 100_000_000}, max_recorded=64))
        runners = []
        for app, port in ((proxied, proxied_port), (direct, direct_port)):
            runner = web.AppRunner(app, access_log=None)
            await runner.setup()
            await web.TCPSite(runner, "127.0.0.1", port).start()
            runners.append(runner)
        await asyncio.Event().wait()

    asyncio.run(serve())


# -- timing each request direct and through the proxy ------------------------------------


@dataclass
class Timed:
    proxy_ms: float
    direct_ms: float

    @property
    def added_ms(self) -> float:
        return self.proxy_ms - self.direct_ms


@dataclass
class Tee(httpx2.AsyncBaseTransport):
    """Sends each request to the direct stand-in and to the proxy (the SDK's base URL),
    timing both to the answer's last byte; the SDK gets the proxy's answer."""

    direct: str  # the floor's base URL
    inner: httpx2.AsyncHTTPTransport = field(default_factory=httpx2.AsyncHTTPTransport)
    timed: list[Timed] = field(default_factory=list)

    async def handle_async_request(self, request: httpx2.Request) -> httpx2.Response:
        body = await request.aread()
        floor = httpx2.URL(self.direct).copy_with(path=request.url.path)
        headers = [(k, v) for k, v in request.headers.multi_items() if k.lower() != "host"]
        twin = httpx2.Request(request.method, floor, headers=headers, content=body)
        order = ("direct", "proxy") if len(self.timed) % 2 == 0 else ("proxy", "direct")
        ms: dict[str, float] = {}
        answer: httpx2.Response | None = None
        content = b""
        for who in order:
            started = time.perf_counter()
            response = await self.inner.handle_async_request(twin if who == "direct" else request)
            raw = await response.aread()
            ms[who] = (time.perf_counter() - started) * 1000
            await response.aclose()
            if who == "proxy":
                answer, content = response, raw
            elif response.status_code != 200:
                raise RuntimeError(f"the floor answered {response.status_code}: {raw[:300]!r}")
        assert answer is not None
        self.timed.append(Timed(ms["proxy"], ms["direct"]))
        headers = [
            (k, v)
            for k, v in answer.headers.multi_items()
            if k.lower() not in ("content-encoding", "transfer-encoding", "content-length")
        ]
        return httpx2.Response(answer.status_code, headers=headers, content=content)

    async def aclose(self) -> None:
        await self.inner.aclose()


# -- one session ----------------------------------------------------------------------


@dataclass
class Row:
    turn: int
    headers: dict[str, str]
    timed: Timed

    @property
    def strategy(self) -> str:
        return self.headers.get("x-compaction-strategy", "")

    @property
    def crossing(self) -> bool:
        return "summary" in self.strategy or "pack" in self.strategy

    @property
    def deferred(self) -> bool:
        return self.headers.get("x-compaction-reason") == "summary_pending"

    @property
    def waited(self) -> bool:
        return self.timed.added_ms >= WAITED_MS


@dataclass
class Session:
    name: str
    tool_seconds: float
    rows: list[Row]
    summariser_calls: int
    seconds: float


async def session(
    name: str,
    proxy_url: str,
    direct_url: str,
    standin_url: str,
    *,
    turns: int,
    result_chars: int,
    tool_seconds: float,
) -> Session:
    tee = Tee(direct_url)
    client = anthropic.AsyncAnthropic(
        base_url=proxy_url,
        api_key="sk-bench",
        max_retries=0,
        timeout=120,
        http_client=httpx2.AsyncClient(transport=tee),
    )

    async def tool_runs(t: int, turn: Turn) -> None:
        if tool_seconds:
            await asyncio.sleep(tool_seconds)

    before = await summariser_calls(standin_url)
    started = time.perf_counter()
    got = await run_agent(
        client,
        turns=turns,
        result_chars=result_chars,
        conversation=uuid.uuid4().hex,
        on_turn=tool_runs,
    )
    seconds = time.perf_counter() - started
    await client.close()
    await asyncio.sleep(0.2)
    calls = await summariser_calls(standin_url) - before
    pairs = enumerate(zip(got, tee.timed, strict=True))
    rows = [Row(t, turn.headers, timed) for t, (turn, timed) in pairs]
    return Session(name, tool_seconds, rows, calls, seconds)


async def summariser_calls(standin_url: str) -> int:
    async with (
        aiohttp.ClientSession() as http,
        http.get(standin_url + "/_bench/summaries") as r,
    ):
        found: dict[str, int] = await r.json()
    return found["calls"]


# -- processes --------------------------------------------------------------------------


async def wait_ready(url: str, child: subprocess.Popen[bytes], log: Path) -> None:
    async with aiohttp.ClientSession() as http:
        for _ in range(300):
            if child.poll() is not None:
                tail = await asyncio.to_thread(log.read_text)
                raise RuntimeError(f"{url} exited: {tail[-2000:]}")
            with contextlib.suppress(aiohttp.ClientError):
                async with http.get(url) as r:
                    if r.status < 500:
                        return
            await asyncio.sleep(0.1)
    raise RuntimeError(f"{url} did not come up")


def policy_toml(window: int, keep_last: int) -> str:
    """Trigger and target at the default shares of the window (70%, 30%); results are
    kept whole (never offloaded), so the history grows turn by turn and folds; the
    newest `keep_last` groups must leave room under the target for a summary."""
    return (
        f'\n[[policy]]\nmatch = "*"\nwindow = {window}\ntrigger = {window * 7 // 10}\n'
        f"target = {window * 3 // 10}\noffload_threshold = {window}\nkeep_last = {keep_last}\n"
    )


async def run(args: argparse.Namespace) -> list[Session]:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        config = work / "proxy.toml"
        defaults = (ROOT / "config" / "proxy.toml").read_text()
        config.write_text(defaults + policy_toml(args.window, args.keep_last))
        proxied_port, direct_port, proxy_port = free_port(), free_port(), free_port()
        standins = [
            PYTHON,
            __file__,
            "--serve-standins",
            str(proxied_port),
            str(direct_port),
            str(args.window),
            str(args.summary_delay),
        ]
        serve = [
            PYTHON,
            "-m",
            "proxy",
            "--log-level",
            os.environ.get("CROSSING_LATENCY_LOG_LEVEL", "WARNING"),
            "serve",
            "--port",
            str(proxy_port),
            "--upstream",
            f"http://127.0.0.1:{proxied_port}",
            "--config",
            str(config),
        ]
        state = {"COMPACTION_PROXY_STORE_STATE_DIR": str(work / "state")}
        standin_url = f"http://127.0.0.1:{proxied_port}"
        direct_url = f"http://127.0.0.1:{direct_port}"
        proxy_url = f"http://127.0.0.1:{proxy_port}"
        with (
            process(standins, env, work / "standins.log") as s,
            process(serve, {**env, **state}, work / "proxy.log") as p,
        ):
            await wait_ready(standin_url + "/_bench/summaries", s, work / "standins.log")
            await wait_ready(direct_url, s, work / "standins.log")
            await wait_ready(proxy_url + "/readyz", p, work / "proxy.log")
            plan = [
                (f"gradual, run {n + 1}" if args.repeat > 1 else "gradual", args.tool_seconds)
                for n in range(args.repeat)
            ]
            if args.contrast:
                plan += [("faster than the summariser", float(x)) for x in args.contrast_seconds]
            out = []
            for name, seconds in plan:
                out.append(
                    await session(
                        name,
                        proxy_url,
                        direct_url,
                        standin_url,
                        turns=args.turns,
                        result_chars=args.result_chars,
                        tool_seconds=seconds,
                    )
                )
                # The next session's summaries must not find this one's still running.
                await asyncio.sleep(args.summary_delay + 1)
            if args.keep_log:
                print((work / "proxy.log").read_text()[-60000:], file=sys.stderr)
            return out


# -- report -----------------------------------------------------------------------------


def stats(values: list[float]) -> str:
    if not values:
        return "- / -"
    return f"{statistics.median(values):.1f} / {max(values):.1f}"


def session_report(s: Session) -> list[str]:
    crossing = [r for r in s.rows if r.crossing]
    deferred = [r for r in s.rows if r.deferred]
    other = [r for r in s.rows if not r.crossing]
    waited = [r for r in s.rows if r.waited]
    lines = [
        f"**{s.name}** ({len(s.rows)} turns, tool time between turns {s.tool_seconds:g} s,"
        f" {s.seconds:.0f} s in all; summariser calls: {s.summariser_calls}):",
        "",
        "| turn | strategy | summary | tokens before -> after | direct ms | proxy ms | added ms |",
        "|---:|---|---|---:|---:|---:|---:|",
    ]
    for r in s.rows:
        if not (r.crossing or r.deferred or r.waited or ALL_ROWS):
            continue
        h = r.headers
        kind = r.strategy or "untouched"
        if "x-compaction-reason" in h:
            kind += f" ({h['x-compaction-reason']})"
        sizes = "-"
        if "x-compaction-tokens-after" in h:
            before, after = h["x-compaction-tokens-before"], h["x-compaction-tokens-after"]
            sizes = f"{int(before):,} -> {int(after):,}"
        lines.append(
            f"| {r.turn} | {kind} | {h.get('x-compaction-summary', '-')} | {sizes}"
            f" | {r.timed.direct_ms:.1f} | {r.timed.proxy_ms:.1f} | {r.timed.added_ms:.1f} |"
        )
    lines += [
        "",
        "| turns | n | added ms p50 / max |",
        "|---|---:|---:|",
        f"| crossing (folded or packed) | {len(crossing)}"
        f" | {stats([r.timed.added_ms for r in crossing])} |",
        f"| deferred (summary_pending) | {len(deferred)}"
        f" | {stats([r.timed.added_ms for r in deferred])} |",
        f"| all others | {len(other)} | {stats([r.timed.added_ms for r in other])} |",
        "",
        f"Turns that waited for the summariser (added >= {WAITED_MS:.0f} ms): **{len(waited)}**"
        + (f" (turns {', '.join(str(r.turn) for r in waited)})" if waited else "")
        + ".",
        "",
    ]
    return lines


def report(args: argparse.Namespace, sessions: list[Session]) -> str:
    command = (
        f"`.venv/bin/python bench/crossing_latency.py --turns {args.turns}"
        f" --result-chars {args.result_chars} --window {args.window}"
        f" --keep-last {args.keep_last} --summary-delay {args.summary_delay:g}"
        f" --tool-seconds {args.tool_seconds:g}"
    )
    if args.repeat > 1:
        command += f" --repeat {args.repeat}"
    if not args.contrast:
        command += " --no-contrast"
    else:
        command += " --contrast-seconds " + " ".join(f"{x:g}" for x in args.contrast_seconds)
    command += "`"
    grows = default_counter().count_text(tool_output(1, args.result_chars))
    w = args.window
    lines = [
        SECTION,
        "",
        f"{command}, {datetime.date.today().isoformat()}, {platform.machine()},"
        f" {len(os.sched_getaffinity(0))} cores shared with other work, Python"
        f" {platform.python_version()}. Three processes on loopback: stand-ins, `serve` with"
        " its embedded Redis, and the scripted agent (anthropic SDK), whose every request"
        " goes straight to an unlimited stand-in and through the proxy, timed to the"
        " answer's last byte (added = proxy - direct, same request bytes).",
        "",
        f"Policy: window {w:,}, trigger {w * 7 // 10:,}, target {w * 3 // 10:,}, keep_last"
        f" {args.keep_last}, results"
        f" kept whole ({args.result_chars:,} characters, about {grows:,} tokens a turn); the"
        f" summariser takes {args.summary_delay:g} s. Crossings, deferred turns and any"
        " turn that waited:",
        "",
    ]
    for s in sessions:
        lines += session_report(s)
    gradual = [s for s in sessions if s.tool_seconds == args.tool_seconds]
    crossing = [r.timed.added_ms for s in gradual for r in s.rows if r.crossing]
    if crossing:
        worst = max(crossing)
        met = "met" if worst < TARGET_MS else "**not met**"
        lines.append(
            f"Target (added latency on crossing turns under {TARGET_MS:.0f} ms with a"
            f" {args.summary_delay:g} s summariser, gradual sessions): {len(crossing)} crossings,"
            f" max {worst:.1f} ms,"
            f" {met}."
        )
    return "\n".join(lines) + "\n"


def write_section(text: str) -> None:
    current = RESULTS.read_text()
    start = current.find(SECTION + "\n")
    if start < 0:
        RESULTS.write_text(current.rstrip("\n") + "\n\n" + text)
        return
    end = current.find("\n## ", start + 1)
    rest = current[end + 1 :] if end >= 0 else ""
    RESULTS.write_text(current[:start] + text + ("\n" + rest if rest else ""))


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n")[0])
    parser.add_argument("--turns", type=int, default=50)
    parser.add_argument("--result-chars", type=int, default=8_000)
    parser.add_argument("--window", type=int, default=60_000)
    parser.add_argument("--keep-last", type=int, default=3)
    parser.add_argument("--summary-delay", type=float, default=3.0)
    parser.add_argument("--tool-seconds", type=float, default=1.5)
    parser.add_argument("--repeat", type=int, default=1, help="gradual sessions to run")
    parser.add_argument(
        "--contrast-seconds",
        type=float,
        nargs="*",
        default=[0.5, 0.0],
        help="tool time of the contrast sessions (agents faster than their summariser)",
    )
    parser.add_argument("--no-contrast", dest="contrast", action="store_false")
    parser.add_argument("--keep-log", action="store_true", help="print the proxy's log tail")
    parser.add_argument("--write", action="store_true")
    parser.add_argument("--serve-standins", nargs=4, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.serve_standins:
        a, b, window, delay = args.serve_standins
        serve_standins(int(a), int(b), int(window), float(delay))
        return
    text = report(args, asyncio.run(run(args)))
    print(text)
    if args.write:
        write_section(text)


if __name__ == "__main__":
    main()
