"""The real Claude Code CLI (pinned in package.json) through the proxy, as a user runs it.

The stand-in upstream plays the model with a scenario (scenario.py): turn after turn it
calls Claude Code's own `Bash` tool to print a large build log, and, once the proxy has
offloaded results, calls the proxy's `read_result` before some turns. Claude Code runs
the commands itself, in print mode, with a fresh HOME. A tap between Claude Code and the
proxy records every answer exactly as the client received it.

What must hold (issue 11): Claude Code finishes with the scenario's final text; every
upstream request was valid and within the window; Claude Code never sees read_result;
it is never told more input tokens than the window; it never compacts by itself.
With tool search on (`ENABLE_TOOL_SEARCH=true`, issue 35) read_result joins deferred and
the first stub loads it: the request that adds it reads Claude Code's tools and system
prompt from the cache.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import orjson
import pytest

from proxy.core.tokens import default_counter
from proxy.testing.claude_code import ClaudeCodeRun, run_claude_code
from proxy.testing.scenario import Scenario, Step
from proxy.testing.standin import StandInOptions
from tests.agents.checks import log_scenario, session_failures, write_logs
from tests.agents.conftest import AgentStack, MakeStack

MODEL = "claude-sonnet-4-6"
FINAL = "All build logs were read: the failure is in src/build/module_7_3.py."
PROMPT = "Read the build logs under logs/ one by one and tell me where the build fails."


async def _run(
    stack: AgentStack,
    cli: list[str],
    tmp_path: Path,
    log_sizes: list[int],
    turns: int,
    extra_env: dict[str, str] | None = None,
) -> ClaudeCodeRun:
    workdir = tmp_path / "work"
    home = tmp_path / "home"
    workdir.mkdir()
    home.mkdir()
    write_logs(workdir, log_sizes)
    return await run_claude_code(
        cli,
        base_url=stack.url,
        prompt=PROMPT,
        workdir=workdir,
        home=home,
        model=MODEL,
        max_turns=turns + 10,
        extra_env=extra_env,
        time_limit=1200,
    )


def _verdict(
    run: ClaudeCodeRun, stack: AgentStack, options: StandInOptions, min_reads: int
) -> list[str]:
    assert options.scenario is not None
    failures, seen = session_failures(
        scenario=options.scenario,
        options=options,
        recorded=stack.standin.recorded,
        exchanges=stack.tap.exchanges,
        client_texts=[("output", run.stdout), ("stored files", run.transcripts())],
        window=options.window_for(MODEL),
        min_reads=min_reads,
    )
    if run.returncode != 0:
        failures.append(f"Claude Code exited with {run.returncode}: {run.stderr[-2000:]}")
    if run.final_text != FINAL:
        failures.append(f"Claude Code's final text was {run.final_text[:300]!r}")
    print(f"observed: {seen}")
    return failures


SMALL_WINDOW = 60_000
SMALL_WINDOW_CONFIG = f"""
[[policy]]
match = "{MODEL}"
window = {SMALL_WINDOW}
trigger = 30000
target = 18000
summary_max_tokens = 2000
"""


@pytest.mark.timeout(1500)
async def test_claude_code_small_window_with_read_rounds(
    agent_stack: MakeStack, claude_code_cli: list[str], tmp_path: Path
) -> None:
    """20 Bash turns of ~4,700-token logs through a 60k window (Claude Code's system
    prompt and tools take ~25k of it); before every third turn from the seventh on, the
    model reads two slices of offloaded results. Claude Code is set to compact by itself
    from ~67k (CLAUDE_CODE_AUTO_COMPACT_WINDOW, its own setting, at its smallest value,
    100k, less 20k for output and a 13k margin), as a user sizing it to this window
    would: told the truth, it never gets there."""
    turns = 20
    reads = {n: 2 for n in range(6, turns, 3)}
    options = StandInOptions(
        windows={"*": 200_000, MODEL: SMALL_WINDOW},
        scenario=log_scenario(turns, reads, FINAL),
        max_recorded=None,
    )
    stack = await agent_stack(options, SMALL_WINDOW_CONFIG)
    run = await _run(
        stack,
        claude_code_cli,
        tmp_path,
        [12_000] * turns,
        turns,
        {"CLAUDE_CODE_AUTO_COMPACT_WINDOW": "100000"},
    )
    failures = _verdict(run, stack, options, min_reads=4)
    assert not failures, "\n".join(failures)


@pytest.mark.timeout(1500)
async def test_claude_code_small_window_reads_that_would_overflow_it(
    agent_stack: MakeStack, claude_code_cli: list[str], tmp_path: Path
) -> None:
    """As above, but on turn 10 the model reads four offloaded logs whole (~4,700 tokens
    each) before going on: appended as they come to a request of ~45k, they would pass
    the 60k window, so the proxy must cut them to fit."""
    turns = 12
    options = StandInOptions(
        windows={"*": 200_000, MODEL: SMALL_WINDOW},
        scenario=log_scenario(turns, {10: 4}, FINAL, read_length=12_000),
        max_recorded=None,
    )
    stack = await agent_stack(options, SMALL_WINDOW_CONFIG)
    run = await _run(
        stack,
        claude_code_cli,
        tmp_path,
        [12_000] * turns,
        turns,
        {"CLAUDE_CODE_AUTO_COMPACT_WINDOW": "100000"},
    )
    failures = _verdict(run, stack, options, min_reads=4)
    assert not failures, "\n".join(failures)


@pytest.mark.timeout(1500)
async def test_claude_code_sonnet_four_reads_in_one_turn(
    agent_stack: MakeStack, claude_code_cli: list[str], tmp_path: Path
) -> None:
    """The issue's case: claude-sonnet-4-6 with the default policy (window 200k, trigger
    140k) and Claude Code's own defaults (it compacts at about 167k for this model). The
    history crosses the trigger, then the model makes 4 small reads in one turn."""
    turns, per_step = 8, 3
    # Each turn prints three logs of 30,000 characters (~11,900 tokens each, the most
    # Claude Code keeps inline). The history passes 140k on the request after turn 3,
    # which comes from one of ~134k in all: Claude Code, estimating the three new logs at
    # a quarter of their characters, takes it for ~157k, under its own threshold, so any
    # compaction of its own is the proxy's doing. The reads come a turn later.
    options = StandInOptions(
        windows={"*": 200_000},
        scenario=log_scenario(turns, {5: 4}, FINAL, per_step),
        max_recorded=None,
    )
    stack = await agent_stack(options, "")
    run = await _run(stack, claude_code_cli, tmp_path, [30_000] * turns * per_step, turns)
    failures = _verdict(run, stack, options, min_reads=4)
    assert not failures, "\n".join(failures)


def _tool_references(body: dict[str, Any]) -> list[dict[str, Any]]:
    """The tool_reference blocks of the messages' tool results."""
    return [
        part
        for message in body["messages"]
        if isinstance(message["content"], list)
        for block in message["content"]
        if block.get("type") == "tool_result" and isinstance(block.get("content"), list)
        for part in block["content"]
        if part.get("type") == "tool_reference"
    ]


def _deferral_failures(stack: AgentStack) -> list[str]:
    """What a session with tool search on must show upstream: the tool-search beta on
    every main-loop request; read_result, wherever it joins, deferred and loaded by one
    tool_reference (never listed); the first request it joins reading the client's tools
    and system prompt from the cache (listed, it would read none of them)."""
    failures, joined = [], []
    counter = default_counter()
    for n, r in enumerate(stack.standin.recorded):
        if r.method != "POST" or r.headers.get("x-compaction-proxy-purpose") or not r.kind:
            continue
        if "advanced-tool-use-" not in r.headers.get("anthropic-beta", ""):
            failures.append(f"upstream request #{n} without the tool-search beta")
        body = orjson.loads(r.body)
        ours = [t for t in body.get("tools", []) if t.get("name") == "read_result"]
        if not ours:
            continue
        joined.append((r, body))
        if ours[0].get("defer_loading") is not True:
            failures.append(f"upstream request #{n} lists read_result, not deferred")
        loads = [b for b in _tool_references(body) if b.get("tool_name") == "read_result"]
        if len(loads) != 1:
            failures.append(f"upstream request #{n} loads read_result {len(loads)} times")
    if not joined:
        return [*failures, "read_result never joined a request"]
    first, body = joined[0]
    client_tools = [t for t in body["tools"] if t.get("name") != "read_result"]
    fixed = counter.count_tools(client_tools) + counter.count_system(body["system"])
    read = int(first.usage.get("cache_read_input_tokens") or 0)
    if read < fixed:
        failures.append(
            f"the request read_result joined read {read:,} tokens from the cache, less than"
            f" Claude Code's tools and system prompt ({fixed:,})"
        )
    print(f"read_result joined {len(joined)} requests; the first read {read:,} cached ({fixed:,})")
    return failures


@pytest.mark.timeout(1500)
async def test_claude_code_with_tool_search_gets_read_result_deferred(
    agent_stack: MakeStack, claude_code_cli: list[str], tmp_path: Path
) -> None:
    """Claude Code with ENABLE_TOOL_SEARCH=true (what a user sets behind the proxy for
    its tool search): 12 Bash turns of ~4,700-token logs through the 60k window, two
    reads before every third turn from the seventh on. Its requests defer no tool in
    `tools` (its rarely used ones go unsent) but carry the tool-search beta, so
    read_result joins deferred; the stand-in offers the script read_result only where a
    tool_reference loads it, as the API expands a deferred tool only there. Midway the
    model loads one of Claude Code's own tools with ToolSearch: from then on Claude Code
    defers it in `tools` and its reference loads it, beside read_result's."""
    turns = 12
    reads = {n: 2 for n in range(6, turns, 3)}
    logs = log_scenario(turns, reads, FINAL).steps
    search = {"name": "ToolSearch", "input": {"query": "select:CronList", "max_results": 5}}
    steps = (*logs[:8], Step(calls=(search,), text="Loading a tool."), *logs[8:])
    options = StandInOptions(
        windows={"*": 200_000, MODEL: SMALL_WINDOW},
        scenario=Scenario(steps),
        max_recorded=None,
    )
    stack = await agent_stack(options, SMALL_WINDOW_CONFIG)
    env = {"CLAUDE_CODE_AUTO_COMPACT_WINDOW": "100000", "ENABLE_TOOL_SEARCH": "true"}
    run = await _run(stack, claude_code_cli, tmp_path, [12_000] * turns, turns, env)
    failures = _verdict(run, stack, options, min_reads=4) + _deferral_failures(stack)
    last = orjson.loads(next(r for r in reversed(stack.standin.recorded) if r.kind).body)
    deferred = [t["name"] for t in last["tools"] if t.get("defer_loading")]
    loads = sorted(b["tool_name"] for b in _tool_references(last))
    if deferred != ["CronList", "read_result"] or loads != deferred:
        failures.append(f"the last request defers {deferred} and loads {loads}")
    assert not failures, "\n".join(failures)
