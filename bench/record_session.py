"""Record a real Claude Code session against the stand-in, for the benchmarks to replay.

The pinned Claude Code (tests/agents) runs in print mode in a fresh work directory of
real files (third-party Python sources and this project's docs copied in, and logs: this
repository's `git log --stat`, the machine's dpkg and apt logs), against the stand-in
upstream (straight, no proxy: what the agent itself sends). The stand-in plays the model
with a scenario (proxy/testing/scenario.py): 42 turns that each call one of Claude Code's
own tools, Read, Grep or Bash in turn (a few turns read two files at once), on those
files, each result 15-30 KB, then a final answer. The model is claude-opus-5-5 with its
1M window (`claude-opus-5-5[1m]`: Claude Code sends the context-1m beta). Every request
Claude Code sent is written to bench/sessions/ (bench/session_file.py's format).
`--tool-search`: with `ENABLE_TOOL_SEARCH=true`, which Claude Code needs to search its
tools behind a base URL not Anthropic's: its rarely used tools then go unsent until a
ToolSearch call loads one, under the beta `advanced-tool-use-2025-11-20`.

    .venv/bin/python bench/record_session.py [--out bench/sessions/claude-code-opus-5-5.zst]
        [--seed N] [--tool-search]
"""

from __future__ import annotations

import argparse
import asyncio
import glob
import platform
import re
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import orjson

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

from session_file import Recorded, write_session  # noqa: E402

from proxy.testing.agent import tool_output  # noqa: E402
from proxy.testing.claude_code import claude_command, run_claude_code  # noqa: E402
from proxy.testing.scenario import Scenario, Step  # noqa: E402
from proxy.testing.standin import RECORDED, StandInOptions, start  # noqa: E402

MODEL = "claude-opus-5-5[1m]"
TURNS = 42
SMALLEST, LARGEST = 15_500, 27_500  # a result's characters (Claude Code adds a few)
GREP_LIMIT = 250  # Claude Code's Grep shows this many lines of content at most
# ... and saves a longer output to a file, showing only its first 2 KB: kept under this.
GREP_INLINE = 19_000
PROMPT = (
    "I am new to this project. Survey it: read the vendored HTTP and Redis client code, "
    "search it for how connections, errors and retries are handled, and look through the "
    "logs for what was installed and changed recently. Then summarise what you found."
)
FINAL = (
    "Summary: the vendored aiohttp code builds responses in web_response.py and streams "
    "them through http_writer.py; connections are pooled by the client's connector and "
    "closed on errors. The Redis client retries on ConnectionError with a backoff "
    "(retry.py, backoff.py) and keeps a pool per client. The logs show the Python and "
    "Node toolchains installed by dpkg and apt, and the repository history is a series "
    "of benchmark-driven changes to the proxy's hot path."
)
# What Claude Code's transport adds per connection, and the caller's credential.
DROPPED_HEADERS = {"host", "content-length", "connection"}
CREDENTIAL = "sk-ant-recorded-session"


def make_workdir(root: Path) -> Path:
    """Real files for the agent's tools: sources to read and search, logs to page."""
    work = root / "project"
    site = Path(next(iter(glob.glob(str(ROOT / ".venv/lib/python*/site-packages")))))
    skip = shutil.ignore_patterns("__pycache__", "*.so", "*.c", "*.h", "*.pyx", "*.pxd")
    for package in ("aiohttp", "redis"):
        shutil.copytree(site / package, work / "vendor" / package, ignore=skip)
    shutil.copytree(ROOT / "docs", work / "docs")
    logs = work / "logs"
    logs.mkdir()
    history = subprocess.run(
        ["git", "-C", str(ROOT), "log", "--stat", "-n", "600"], capture_output=True, text=True
    ).stdout
    (logs / "git-history.log").write_text(history or tool_output(1, 300_000))
    for name, source in (
        ("dpkg.log", "/var/log/dpkg.log"),
        ("apt-term.log", "/var/log/apt/term.log"),
    ):
        try:
            text = Path(source).read_text(errors="replace")
        except OSError:
            text = tool_output(len(name), 300_000)  # a machine without them: a build log
        (logs / name).write_text(text)
    return work


def _numbered_size(path: Path) -> int:
    """About what Claude Code's Read shows of a file: each line with its number and a tab."""
    lines = path.read_text(errors="replace").splitlines()
    return sum(len(line) + len(str(n + 1)) + 2 for n, line in enumerate(lines))


def read_steps(work: Path) -> tuple[list[Path], list[Path]]:
    """Files whose Read is 15-28 KB, and small ones (8-13 KB) to read two at a time."""
    files = sorted(p for pattern in ("vendor/**/*.py", "docs/*.md") for p in work.glob(pattern))
    whole = [p for p in files if SMALLEST <= _numbered_size(p) <= LARGEST]
    halves = [p for p in files if 8_000 <= _numbered_size(p) <= 13_000]
    return whole, halves


GREP_PATTERNS = (
    r"def \w+\(self",
    r"raise \w+Error",
    r"except \w+",
    r"await self\.",
    r"return self\.",
    r"import ",
    r"timeout",
    r"connection",
    r"retry|backoff",
    r"if not ",
    r"async def ",
    r"headers\[",
    r"class \w+\(",
    r"self\._\w+ = ",
    r"Optional\[",
    r"isinstance\(",
    r"self\.\w+\(",
    r"return ",
    r"raise ",
    r"def ",
    r"bytes",
    r"str\b",
    r"None",
    r"async with",
    r"lock",
    r"pool",
)


def grep_steps(work: Path) -> list[dict[str, Any]]:
    """Grep calls (content mode, line numbers) showing 15-19 KB: each pattern over each
    source folder with enough matches, `head_limit` set to the lines that make the size
    (measured here on the matches in path order; ripgrep's order differs a little)."""
    found = []
    folders = ("vendor/redis", "vendor/aiohttp", "vendor/redis/commands", "vendor/redis/asyncio")
    for folder in (*folders, "vendor/redis/_parsers", "vendor/aiohttp/_websocket", "docs"):
        files = sorted(p for p in (work / folder).rglob("*") if p.is_file())
        for pattern in GREP_PATTERNS:
            regex = re.compile(pattern)
            want = SMALLEST + (len(found) * 3_571) % (GREP_INLINE - 500 - SMALLEST)
            size, lines = 0, 0
            for path in files:
                name = str(path.relative_to(work))
                for n, line in enumerate(path.read_text(errors="replace").splitlines()):
                    if size < want and regex.search(line):
                        lines += 1
                        size += len(name) + len(str(n + 1)) + len(line) + 3
            if size >= want and lines <= GREP_LIMIT:
                call = {"pattern": pattern, "path": str(work / folder), "output_mode": "content"}
                found.append({**call, "-n": True, "head_limit": lines})
    return found


def log_steps(work: Path, seed: int = 0) -> list[dict[str, str]]:
    """Bash commands paging through the logs, each showing 15-28 KB (`seed`: other pages)."""
    commands = []
    for n in range(TURNS):
        name = ("git-history.log", "dpkg.log", "apt-term.log")[(n // 3 + seed) % 3]
        text = (work / "logs" / name).read_text(errors="replace").splitlines(keepends=True)
        want = SMALLEST + ((n + seed * 13) * 7_919) % (LARGEST - SMALLEST)
        first = 1 + ((n + seed * 31) * 977) % max(1, len(text) // 2)
        size, last = 0, first
        while last <= len(text) and size + len(text[last - 1]) <= want:
            size += len(text[last - 1])
            last += 1
        commands.append(
            {"command": f"sed -n '{first},{last - 1}p' logs/{name}", "description": f"Show {name}"}
        )
    return commands


def scenario(work: Path, seed: int = 0) -> Scenario:
    """The turns: Read, Grep and Bash in turn (seed 0, the recorded session); another seed
    (a held-out session) pages the logs twice as often, from other places, reads other
    files, and searches with other patterns first."""
    whole, halves = read_steps(work)
    greps = grep_steps(work)
    logs = log_steps(work, seed)
    if seed:
        whole.reverse()
        greps = greps[seed % len(greps) :] + greps[: seed % len(greps)]
    steps: list[Step] = []
    for n in range(TURNS):
        kind = n % 3 if not seed else (2, 0, 2, 1)[n % 4]
        if kind == 0 and n % 12 == 9 and len(halves) >= 2:  # now and then, two at once
            a, b = halves.pop(0), halves.pop(len(halves) // 2)
            calls: tuple[dict[str, Any], ...] = (
                {"name": "Read", "input": {"file_path": str(a)}},
                {"name": "Read", "input": {"file_path": str(b)}},
            )
            text = f"Reading {a.relative_to(work)} and {b.relative_to(work)} together."
        elif kind == 0:
            path = whole.pop((n * 5) % len(whole))
            calls = ({"name": "Read", "input": {"file_path": str(path)}},)
            text = f"Let me read {path.relative_to(work)} to see how it is put together."
        elif kind == 1:
            call = greps[(n * 7) % len(greps)]
            greps.remove(call)
            calls = ({"name": "Grep", "input": call},)
            text = f"Searching for `{call['pattern']}` in {Path(call['path']).name}."
        else:
            command = logs[n]
            calls = ({"name": "Bash", "input": command},)
            text = f"Paging through the logs: {command['command']}."
        steps.append(Step(calls=calls, text=text))
    steps.append(Step(text=FINAL))
    return Scenario(tuple(steps))


def _recorded(requests: list[Any]) -> list[Recorded]:
    out = []
    for r in requests:
        headers = {k: v for k, v in r.headers.items() if k.lower() not in DROPPED_HEADERS}
        for name in headers:
            if name.lower() in ("x-api-key", "authorization"):
                headers[name] = CREDENTIAL
        out.append(Recorded(r.method, r.path_qs, headers, r.kind, r.body))
    return out


async def record(out: Path, time_limit: float, seed: int = 0, tool_search: bool = False) -> None:
    root = Path(tempfile.mkdtemp(prefix="session-"))
    try:
        work = make_workdir(root)
        home = root / "home"
        home.mkdir()
        script = scenario(work, seed)
        options = StandInOptions(windows={"*": 1_000_000}, max_recorded=None, scenario=script)
        runner, url = await start("127.0.0.1", 0, options)
        try:
            cli = claude_command(ROOT / "tests" / "agents")
            run = await run_claude_code(
                cli,
                base_url=url,
                prompt=PROMPT,
                workdir=work,
                home=home,
                model=MODEL,
                allowed_tools="Bash,Read,Grep",
                max_turns=TURNS + 10,
                time_limit=time_limit,
                extra_env={"ENABLE_TOOL_SEARCH": "true"} if tool_search else None,
            )
            requests = _recorded(runner.app[RECORDED])
        finally:
            await runner.cleanup()
        if run.returncode != 0 or run.final_text != FINAL:
            raise SystemExit(f"Claude Code did not finish ({run.returncode}): {run.stderr[-2000:]}")
        agent = next((r.headers.get("User-Agent", "") for r in requests if r.kind), "")
        meta = {
            "agent": agent,
            "model": MODEL,
            "recorded": time.strftime("%Y-%m-%d", time.gmtime()),
            "python": platform.python_version(),
            "turns": TURNS,
            "seed": seed,
            "tool_search": tool_search,
        }
        write_session(out, meta, requests)
        describe(requests, out)
    finally:
        shutil.rmtree(root, ignore_errors=True)


def describe(requests: list[Recorded], out: Path) -> None:
    main = [r for r in requests if r.kind in ("tool", "text")]
    size = out.stat().st_size
    print(f"{out}: {len(requests)} requests ({len(main)} of the main loop), {size:,} bytes")
    for n, r in enumerate(requests):
        sizes = ""
        if r.kind in ("tool", "text"):  # the results the newest user turn gave
            messages = orjson.loads(r.body)["messages"]
            last = max((i for i, m in enumerate(messages) if m["role"] == "assistant"), default=-1)
            newest = [b for m in messages[last + 1 :] if isinstance(m["content"], list)
                      for b in m["content"]]  # fmt: skip
            results = [b for b in newest if b.get("type") == "tool_result"]
            sizes = " ".join(str(len(orjson.dumps(b.get("content")))) for b in results)
        print(f"{n:3d} {r.kind or '-':5s} {r.path:40s} {len(r.body):9,d} {sizes}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--out", type=Path, default=ROOT / "bench" / "sessions" / "claude-code-opus-5-5.zst"
    )
    parser.add_argument("--time-limit", type=float, default=1800)
    parser.add_argument(
        "--seed", type=int, default=0, help="another session's turns (0: the recorded one's)"
    )
    parser.add_argument(
        "--tool-search", action="store_true", help="with ENABLE_TOOL_SEARCH=true (tool search on)"
    )
    args = parser.parse_args()
    args.out.parent.mkdir(parents=True, exist_ok=True)
    asyncio.run(record(args.out, args.time_limit, args.seed, args.tool_search))


if __name__ == "__main__":
    main()
