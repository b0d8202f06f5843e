"""What a session of a real agent through the proxy must show, checked all at once.

`session_failures(...)` returns every property the session broke, each with the numbers
observed, so one run tells the whole story (the test asserts the list is empty).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import orjson

from proxy.core.eventstream import EventStreamError
from proxy.testing.agent import tool_output
from proxy.testing.api_messages import read
from proxy.testing.prompt import READ_RESULT, stub_refs
from proxy.testing.scenario import (
    COMPACTION,
    READ,
    STEP_ID,
    TOOL,
    Scenario,
    Step,
    cleared_results,
    continues_after_compaction,
)
from proxy.testing.standin import RecordedRequest, StandInOptions
from proxy.testing.tap import Exchange, input_total, stream_events, told_usage

INJECTED_TOOL = b"read_result"


def write_logs(workdir: Path, sizes: list[int]) -> None:
    """logs/step-NN.log for each step: a build log of the given size, full of identifiers."""
    logs = workdir / "logs"
    logs.mkdir(parents=True, exist_ok=True)
    for n, chars in enumerate(sizes):
        (logs / f"step-{n:02d}.log").write_text(tool_output(n, chars))


def log_scenario(
    steps: int, reads: dict[int, int], final: str, per_step: int = 1, read_length: int = 2000
) -> Scenario:
    """Step n shows `per_step` logs with Bash, in parallel calls (after `reads[n]`
    read_result calls of `read_length` characters, when the proxy offers the tool); then
    the final answer."""

    def show(log: int) -> dict[str, Any]:
        command = {"command": f"cat logs/step-{log:02d}.log", "description": f"Show log {log}"}
        return {"name": "Bash", "input": command}

    shown = [
        Step(
            calls=tuple(show(n * per_step + k) for k in range(per_step)),
            text=f"Reading build logs of step {n}.",
            reads=reads.get(n, 0),
            read_length=read_length,
        )
        for n in range(steps)
    ]
    return Scenario((*shown, Step(text=final)))


@dataclass
class Observed:
    """The numbers a session is judged by (printed with any failure)."""

    upstream_requests: int = 0
    kinds: Counter[str] = field(default_factory=Counter)
    largest_upstream: int = 0  # input tokens of the largest request the stand-in got
    largest_told: int = 0  # input tokens the client was told, at most
    told: list[int] = field(default_factory=list)
    steps_done: int = 0
    # per upstream request: its kind, input tokens, refs named, whether read_result was
    # offered ("+") or not ("-")
    requests: list[str] = field(default_factory=list)
    strategies: list[str] = field(default_factory=list)  # x-compaction-strategy per answer

    def __str__(self) -> str:
        return (
            f"upstream requests {self.upstream_requests} by kind {dict(self.kinds)};"
            f" largest upstream request {self.largest_upstream:,} input tokens;"
            f" largest told to the client {self.largest_told:,};"
            f" told per answer {self.told}; tool steps done {self.steps_done};"
            f" upstream requests (kind:tokens:refs offered) {self.requests};"
            f" strategies {self.strategies}"
        )


def is_messages(path_qs: str) -> bool:
    return path_qs.split("?")[0] == "/v1/messages"


def _step(record: RecordedRequest) -> int:
    match = STEP_ID.match(record.content[-1]["id"])
    return int(match.group(1)) if match else -1


def _model(record: RecordedRequest) -> str:
    try:
        return str(orjson.loads(record.body).get("model", ""))
    except orjson.JSONDecodeError:
        return ""


def session_failures(
    *,
    scenario: Scenario,
    options: StandInOptions,
    recorded: list[RecordedRequest],
    exchanges: list[Exchange],
    client_texts: list[tuple[str, str]],
    window: int,
    min_reads: int,
    upstream_call: Callable[[str], bool] = is_messages,
    client_call: Callable[[str], bool] = is_messages,
) -> tuple[list[str], Observed]:
    """Every broken property of the session (empty when it was as it should be).

    `client_texts`: (what, text) pairs of everything the client printed or stored;
    `upstream_call`, `client_call`: which paths (the upstream's, the client's) are model
    calls (Messages by default; Bedrock's and Vertex's carry the model in the path)."""
    failures: list[str] = []
    seen = Observed()
    upstream = [r for r in recorded if r.method == "POST" and upstream_call(r.path_qs)]
    seen.upstream_requests = len(upstream)
    seen.kinds = Counter(r.kind for r in upstream)
    for r in upstream:
        total = input_total(r.usage)
        prompt = read(orjson.loads(r.body))
        offered = "+" if READ_RESULT in prompt.tools else "-"
        seen.requests.append(f"{r.kind}:{total}:{len(stub_refs(prompt))}{offered}")
        seen.largest_upstream = max(seen.largest_upstream, total)
        if r.status != 200:
            failures.append(f"upstream request #{upstream.index(r)} got {r.status}: {r.error}")
        elif total > options.window_for(_model(r)):
            failures.append(f"upstream request #{upstream.index(r)} held {total:,} tokens")
    seen.steps_done = len({_step(r) for r in upstream if r.kind == TOOL})

    if seen.kinds[COMPACTION]:
        failures.append(f"the agent compacted its history by itself {seen.kinds[COMPACTION]} times")
    continued = sum(continues_after_compaction(read(orjson.loads(r.body))) for r in upstream)
    if continued:
        failures.append(f"{continued} upstream requests continue from an agent's own summary")
    cleared = max((cleared_results(read(orjson.loads(r.body))) for r in upstream), default=0)
    if cleared:
        failures.append(f"the agent cleared {cleared} of its own tool results (microcompact)")
    if seen.kinds[READ] < min_reads:
        failures.append(f"only {seen.kinds[READ]} read_result calls were made (want {min_reads})")
    tool_steps = sum(1 for s in scenario.steps if s.calls)
    if seen.steps_done < tool_steps:
        failures.append(f"only {seen.steps_done} of {tool_steps} tool steps were reached")

    messages = [e for e in exchanges if e.method == "POST" and client_call(e.path_qs)]
    for n, exchange in enumerate(messages):
        if exchange.status != 200 or not exchange.complete:
            failures.append(
                f"the client's request #{n} got {exchange.status} (complete: {exchange.complete})"
            )
            continue
        try:
            events = stream_events(exchange) or []
        except EventStreamError as e:
            failures.append(f"the client's stream #{n} is no valid event stream: {e}")
            continue
        if any(name == "error" for name, _ in events):
            failures.append(f"the client's stream #{n} ended in an error event")
        if any(INJECTED_TOOL in orjson.dumps(data) for _, data in events):
            failures.append(f"the client was shown read_result in stream #{n}")
        head = exchange.response_headers
        seen.strategies.append(
            "/".join(
                head.get(f"x-compaction-{k}", "") for k in ("strategy", "offloaded", "summary")
            )
        )
        usage = told_usage(exchange)
        told = input_total(usage or {})
        seen.told.append(told)
        if told > window:
            failures.append(
                f"the client was told {told:,} input tokens (answer #{n}) with a {window:,}"
                f" window; the largest upstream request held {seen.largest_upstream:,}"
            )
        elif told > seen.largest_upstream:
            failures.append(
                f"the client was told {told:,} input tokens (answer #{n}), more than any"
                f" upstream request held ({seen.largest_upstream:,})"
            )
    seen.largest_told = max(seen.told, default=0)
    if not any(e.response_headers.get("x-compaction-strategy") for e in messages):
        failures.append("the proxy never rewrote a request (the session did not test it)")

    for exchange in exchanges:
        raw_headers = orjson.dumps(exchange.response_headers)
        if INJECTED_TOOL in exchange.response_body or INJECTED_TOOL in raw_headers:
            failures.append(f"the client was shown read_result ({exchange.path_qs})")
            break
    for what, text in client_texts:
        if INJECTED_TOOL.decode() in text:
            failures.append(f"read_result appears in the client's {what}")
    return failures, seen
