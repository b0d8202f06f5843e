"""The real Gemini CLI (pinned in package.json) through the proxy, as a user runs it.

The stand-in plays the model with a scenario (scenario.py): step after step it calls the
CLI's own `run_shell_command` to print a large build log, and, once the proxy has
offloaded results, calls the proxy's `read_result` before some steps. The CLI runs the
commands itself, headless (`-p`, `--yolo`), with a fresh HOME: its router call, its main
model over `:streamGenerateContent?alt=sse`, its loop check. A tap between the CLI and
the proxy records every answer exactly as the CLI received it.

What must hold (issue 33): the CLI finishes with the scenario's final text after 40 tool
steps; every upstream request was valid (the stand-in's rules, thought signatures
included, and its window: it refuses a longer prompt); offload, a fold with a summary
(asked of the Gemini API itself) and read rounds all happened; the CLI never sees
read_result, in an answer or a declaration; the usage it is told is never above the
window; it never compresses its history by itself. It is set to compress from 7% of its
model's 1M limit (about 73k, above the window): told the truth, it never gets there; told
the size of its history before compaction (127k by the end), it would.
"""

from __future__ import annotations

from collections import Counter
from pathlib import Path
from typing import Any

import orjson
import pytest

from proxy.testing.api_gemini import signed_ids
from proxy.testing.gemini_cli import run_gemini_cli
from proxy.testing.prompt import READ_RESULT
from proxy.testing.scenario import COMPACTION, READ, STEP_ID, TOOL, Scenario, Step
from proxy.testing.standin import RecordedRequest, StandInOptions
from proxy.testing.tap import Exchange, sse_events
from tests.agents.checks import write_logs
from tests.agents.conftest import MakeStack

STEPS = 40
LOG_CHARS = 8_000
SMALL_WINDOW = 40_000  # the CLI's system prompt and 15 tools take ~10k of it
FINAL = "All build logs were read: the failure is in src/build/module_7_3.py."
PROMPT = "Read the build logs under logs/ one by one and tell me where the build fails."
SHELL = "run_shell_command"
# The models the CLI names: its router's, its main model's (and its loop check's).
CONFIG = f"""
[[policy]]
match = "gemini-*"
window = {SMALL_WINDOW}
trigger = 7000
target = 5000
summary_max_tokens = 2000
"""
COMPRESS_AT = 0.07  # of the CLI's 1,048,576-token limit: about 73k, over the window


def shell_scenario(steps: int, reads: dict[int, int]) -> Scenario:
    def show(n: int) -> dict[str, Any]:
        command = {"command": f"cat logs/step-{n:02d}.log", "description": f"Show log {n}"}
        return {"name": SHELL, "input": command}

    shown = tuple(Step(calls=(show(n),), reads=reads.get(n, 0)) for n in range(steps))
    return Scenario((*shown, Step(text=FINAL)), tool_name=SHELL)


def _is_model_call(path_qs: str) -> bool:
    path = path_qs.split("?")[0]
    return path.endswith((":generateContent", ":streamGenerateContent"))


def _step(record: RecordedRequest) -> int:
    calls = [p for p in record.content if "functionCall" in p]
    ids = signed_ids(calls[0].get("thoughtSignature")) if calls else None
    match = STEP_ID.match(ids[0]) if ids else None
    return int(match.group(1)) if match else -1


def _told(exchange: Exchange) -> int:
    """The promptTokenCount the CLI was left with by one answer (SSE or JSON)."""
    body = exchange.response_body
    if "text/event-stream" in exchange.response_headers.get("Content-Type", ""):
        chunks = [data for _, data in sse_events(body)]
    else:
        chunks = [orjson.loads(body)] if body else []
    told = [c["usageMetadata"].get("promptTokenCount", 0) for c in chunks if "usageMetadata" in c]
    return told[-1] if told else 0


def session_failures(
    options: StandInOptions, recorded: list[RecordedRequest], exchanges: list[Exchange]
) -> tuple[list[str], dict[str, Any]]:
    failures: list[str] = []
    upstream = [r for r in recorded if _is_model_call(r.path_qs)]
    kinds = Counter(r.kind for r in upstream)
    for n, r in enumerate(upstream):
        if r.status != 200:
            failures.append(f"upstream request #{n} ({r.path_qs}) got {r.status}: {r.error}")
    if kinds[COMPACTION]:
        failures.append(f"the CLI compressed its history by itself {kinds[COMPACTION]} times")
    steps = {_step(r) for r in upstream if r.kind == TOOL}
    if len(steps - {-1}) < STEPS:
        failures.append(f"only {len(steps - {-1})} of {STEPS} tool steps were reached")
    if kinds[READ] < 4:
        failures.append(f"only {kinds[READ]} read_result calls were made (want 4)")
    calls = [e for e in exchanges if _is_model_call(e.path_qs)]
    told = [_told(e) for e in calls]
    for n, e in enumerate(calls):
        if e.status != 200 or not e.complete:
            failures.append(f"the CLI's request #{n} got {e.status} (complete: {e.complete})")
    if max(told, default=0) > SMALL_WINDOW:
        failures.append(f"the CLI was told {max(told):,} prompt tokens (window {SMALL_WINDOW:,})")
    strategies = [e.response_headers.get("x-compaction-strategy", "") for e in calls]
    if not any("offload" in s for s in strategies):
        failures.append("the proxy never offloaded a result (the session did not test it)")
    if not any("summary" in s for s in strategies):
        failures.append("the proxy never folded turns into a summary")
    for e in exchanges:
        if READ_RESULT.encode() in e.response_body:
            failures.append(f"the CLI was shown read_result ({e.path_qs})")
            break
    for e in calls:
        if READ_RESULT.encode() in e.request_body:
            failures.append("the CLI sent read_result back (it saw it somewhere)")
            break
    summaries = sum(1 for r in recorded if r.headers.get("x-compaction-proxy-purpose"))
    if not summaries or kinds["summary"] != summaries:
        failures.append(f"{summaries} summaries asked of the Gemini API ({kinds['summary']} seen)")
    seen = {
        "upstream": len(upstream),
        "kinds": dict(kinds),
        "largest told": max(told, default=0),
        "told": told,
        "summaries": summaries,
        "strategies": strategies,
        "models": Counter(r.path_qs.split("/")[3].split(":")[0] for r in upstream),
    }
    return failures, seen


@pytest.mark.timeout(1500)
async def test_gemini_cli_forty_tool_steps_in_a_small_window(
    agent_stack: MakeStack, gemini_cli: list[str], tmp_path: Path
) -> None:
    """40 shell steps of ~2,700-token logs through a 40k window, folded from 7k of history
    (the CLI's system prompt and tools aside); from the eighth step on, every fourth step
    first reads an offloaded result."""
    options = StandInOptions(
        windows={"*": SMALL_WINDOW},
        scenario=shell_scenario(STEPS, {n: 1 for n in range(8, STEPS, 4)}),
        max_recorded=None,
    )
    stack = await agent_stack(options, CONFIG)
    workdir, home = tmp_path / "work", tmp_path / "home"
    workdir.mkdir()
    home.mkdir()
    write_logs(workdir, [LOG_CHARS] * STEPS)
    run = await run_gemini_cli(
        gemini_cli,
        base_url=stack.url,
        prompt=PROMPT,
        workdir=workdir,
        home=home,
        settings={"model": {"compressionThreshold": COMPRESS_AT}},
        time_limit=1200,
    )
    failures, seen = session_failures(options, stack.standin.recorded, stack.tap.exchanges)
    if run.returncode != 0:
        failures.append(f"the CLI exited with {run.returncode}: {run.stderr[-2000:]}")
    if run.final_text != FINAL:
        failures.append(f"the CLI's final text was {run.final_text[:300]!r}")
    for what, text in (("output", run.stdout), ("stored files", run.stored())):
        if READ_RESULT in text:
            failures.append(f"read_result appears in the CLI's {what}")
    print(f"observed: {seen}")
    assert not failures, "\n".join(failures)
