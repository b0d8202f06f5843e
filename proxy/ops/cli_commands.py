"""The `audit`, `plan` and `replay` subcommands of the `compaction-proxy` command line:
their arguments, and what each prints. (The driver's commands, the effects compaction
asks for, are another thing: proxy/core/commands.py.)"""

from __future__ import annotations

import argparse
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from proxy.config import ConfigError, Settings, load_settings
from proxy.console import fail, warn
from proxy.core.policy import Policy
from proxy.core.tokens import default_counter
from proxy.ops.formats import FORMAT_CHOICES, format_for, format_mismatch
from proxy.ops.requests import (
    RequestFileError,
    load_request,
    load_trace,
    recorded_betas,
    trace_betas,
    trace_length,
)

CONFIG_HELP = (
    "TOML settings file whose [[policy]] tables apply (default: $COMPACTION_PROXY_CONFIG,"
    " else ./config/proxy.toml if present, else built-in defaults)"
)

FORMAT_HELP = (
    "the requests' wire format: anthropic (Messages), chat (OpenAI Chat Completions) or"
    " responses (OpenAI Responses); auto (default) tells them apart by `input`, Chat-only"
    " fields and roles, judging a trace by its first request"
)

BETA_HELP = (
    "the request's anthropic-beta header (default: a recorded request's own); with"
    " context-1m-... a model that reaches 1M only with it gets that window"
)

FORMAT_LABELS = {
    "anthropic": "anthropic (Messages)",
    "chat": "chat (OpenAI Chat Completions)",
    "responses": "responses (OpenAI Responses)",
}


def add_commands(commands: Any) -> None:
    audit = commands.add_parser(
        "audit",
        help="where a saved request's context window goes",
        description="Tokens of a saved request by part (system prompt, tools, each role,"
        " tool calls and results per tool), largest first.",
    )
    audit.add_argument("file", type=Path, help="a JSON Messages body or a recorded request")
    audit.add_argument("--config", type=Path, help=CONFIG_HELP)
    audit.add_argument("--anthropic-beta", dest="betas", default=None, help=BETA_HELP)
    audit.set_defaults(ops_run=run_audit)

    plan = commands.add_parser(
        "plan",
        help="dry run: what the proxy would do with a saved request",
        description="What the proxy would do with the request under the current settings"
        " (strategy, what is offloaded, folded or dropped, tokens before and after),"
        " computed by the planner alone: nothing is called or stored.",
    )
    plan.add_argument(
        "file", type=Path, help="a JSON Messages or Chat body, or a recorded request (.gz too)"
    )
    plan.add_argument("--config", type=Path, help=CONFIG_HELP)
    plan.add_argument("--format", choices=FORMAT_CHOICES, default="auto", help=FORMAT_HELP)
    plan.add_argument("--anthropic-beta", dest="betas", default=None, help=BETA_HELP)
    plan.set_defaults(ops_run=run_plan)

    replay = commands.add_parser(
        "replay",
        help="bill a saved conversation with and without the proxy; write a report",
        description="Replay a conversation (a JSONL file of requests, or a directory of"
        " request files) through the planner and the stand-in's prompt-cache cost model,"
        " and write an HTML report of context size and billed cost per turn.",
    )
    replay.add_argument(
        "trace", type=Path, help="JSONL of requests (.jsonl or .jsonl.gz), or a directory of them"
    )
    replay.add_argument("--config", type=Path, help=CONFIG_HELP)
    replay.add_argument("--format", choices=FORMAT_CHOICES, default="auto", help=FORMAT_HELP)
    replay.add_argument(
        "--out", type=Path, default=Path("replay-report.html"), help="the report (HTML)"
    )
    replay.set_defaults(ops_run=run_replay)

    from proxy.ops.models import add_commands as add_model_commands

    add_model_commands(commands)


def _settings(config: Path | None) -> Settings:
    return load_settings(config, warn=warn)


def _policies(settings: Settings) -> list[Policy]:
    return list(settings.model_policies)


def _betas(args: argparse.Namespace) -> str:
    return str(args.betas) if args.betas is not None else recorded_betas(args.file)


def _guarded(run: Any) -> Any:
    def wrapped(args: argparse.Namespace) -> int:
        try:
            return int(run(args))
        except ConfigError as e:
            return fail(f"bad setting: {e}")
        except RequestFileError as e:
            return fail(str(e))

    return wrapped


def _warn_on_mismatch(name: str, bodies: Iterator[dict[str, Any]]) -> Iterator[dict[str, Any]]:
    """The trace's requests; a forced format that does not fit the first one is warned of
    (the trace is judged by its first request, as `auto` does)."""
    for n, body in enumerate(bodies):
        mismatch = format_mismatch(name, body) if n == 0 else None
        if mismatch:
            warn(f"first request: {mismatch}")
        yield body


@_guarded
def run_audit(args: argparse.Namespace) -> int:
    from proxy.ops.audit import render_audit

    policies = _policies(_settings(args.config))
    body = load_request(args.file)
    print(render_audit(body, default_counter(), policies, _betas(args)))
    return 0


@_guarded
def run_plan(args: argparse.Namespace) -> int:
    from proxy.ops.plan import plan_text

    policies = _policies(_settings(args.config))
    body = load_request(args.file)
    mismatch = format_mismatch(args.format, body)
    if mismatch:
        warn(mismatch)
    fmt = format_for(args.format, body)
    print(f"format: {FORMAT_LABELS[fmt.name]}")
    print(plan_text(body, default_counter(), policies, fmt, _betas(args)))
    return 0


@_guarded
def run_replay(args: argparse.Namespace) -> int:
    from proxy.ops.progress import Progress
    from proxy.ops.replay import replay, summary_lines
    from proxy.ops.report import render_report

    settings = _settings(args.config)
    if not args.trace.exists():
        raise RequestFileError(f"{args.trace}: no such file or directory")
    progress = Progress(trace_length(args.trace), "replay")
    try:
        fmt = None if args.format == "auto" else format_for(args.format, None)
        result = replay(
            _warn_on_mismatch(args.format, load_trace(args.trace)),
            _policies(settings),
            default_counter(),
            progress,
            fmt,
            settings.prices,
            trace_betas(args.trace),
        )
    finally:
        progress.close()
    if not result.turns:
        raise RequestFileError(f"{args.trace}: no requests in the trace")
    args.out.write_text(render_report(result, args.trace.name), encoding="utf-8")
    print("\n".join(summary_lines(result)))
    print(f"report: {args.out}")
    return 0
