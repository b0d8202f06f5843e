"""The `compaction-proxy` command: `serve` the proxy, run the `stand-in` upstream, try it
all with `demo`, manage `keys` and `budgets`, and `audit`, `plan` or `replay` requests.

A mistake (a wrong flag, setting, port or store) is one line on stderr naming the setting
and where its value came from, and exit status 2; never a traceback.
"""

from __future__ import annotations

import argparse
import errno
import logging
from pathlib import Path
from typing import Any, NoReturn

from proxy.config import ConfigError, load_settings
from proxy.console import fail, warn
from proxy.ops.cli_commands import add_commands as add_ops_commands

STANDIN_DEFAULT_PORT = 8081
LOG_LEVELS = ("DEBUG", "INFO", "WARNING", "ERROR")
# Flags of `serve` and the setting each sets (the settings' sources name the flag).
SERVE_FLAGS = {
    "server.host": "--host",
    "server.port": "--port",
    "upstream.url": "--upstream",
    "upstream.openai_url": "--openai-upstream",
    "upstream.gemini_url": "--gemini-upstream",
    "store.redis_url": "--redis-url",
}


class Parser(argparse.ArgumentParser):
    """argparse, with each mistake said in one line instead of the usage text."""

    def error(self, message: str) -> NoReturn:
        self.exit(2, f"{self.prog}: {message} (see {self.prog} --help)\n")


def _log_level_everywhere(parser: argparse.ArgumentParser) -> None:
    """Accept --log-level after any command too (`serve --log-level DEBUG`); given there,
    it wins over one given before the command."""
    for action in parser._actions:
        commands = action.choices if isinstance(action.choices, dict) else {}
        for sub in commands.values():
            sub.add_argument(
                "--log-level",
                type=str.upper,
                choices=LOG_LEVELS,
                default=argparse.SUPPRESS,
                help="DEBUG, INFO, WARNING or ERROR (default INFO)",
            )
            _log_level_everywhere(sub)


def _parser() -> argparse.ArgumentParser:
    parser = Parser(
        prog="compaction-proxy",
        description="A reverse proxy that keeps agents' conversations inside the window.",
    )
    parser.add_argument("--log-level", type=str.upper, default="INFO", choices=LOG_LEVELS)
    commands = parser.add_subparsers(dest="command", required=True)

    serve = commands.add_parser(
        "serve",
        help="run the proxy",
        description="Run the proxy. Settings: built-in defaults < the TOML file < "
        "COMPACTION_PROXY_* environment variables < these flags.",
    )
    serve.add_argument(
        "--config",
        type=Path,
        help="TOML settings file (default: $COMPACTION_PROXY_CONFIG, else "
        "./config/proxy.toml if present, else built-in defaults)",
    )
    serve.add_argument("--host", help="address to listen on (server.host)")
    serve.add_argument("--port", type=int, help="port to listen on, 0 = any (server.port)")
    serve.add_argument("--upstream", help="Anthropic-format upstream base URL (upstream.url)")
    serve.add_argument(
        "--openai-upstream",
        help="OpenAI-format upstream base URL, for /v1/chat/completions and the other"
        " OpenAI paths (upstream.openai_url)",
    )
    serve.add_argument(
        "--gemini-upstream",
        help="Gemini API upstream base URL, for /v1beta/... and models/*:generateContent"
        " (upstream.gemini_url)",
    )
    serve.add_argument(
        "--redis-url", help="Redis URL; empty or unset = embedded Redis (store.redis_url)"
    )

    standin = commands.add_parser(
        "stand-in",
        help="run the local stand-in of the Messages, OpenAI and Gemini APIs (no API key needed)",
        description="A strict local imitation of the Anthropic Messages API, OpenAI's"
        " Chat Completions and Responses APIs and Google's Gemini API on one port: point"
        " --upstream, --openai-upstream and --gemini-upstream of `serve` at it. Any key is"
        " accepted.",
    )
    standin.add_argument("--host", default="127.0.0.1")
    standin.add_argument("--port", type=int, default=STANDIN_DEFAULT_PORT, help="0 = any free port")
    standin.add_argument(
        "--window", type=int, help="context window of every model, in tokens (default 200000)"
    )
    from proxy.admin import add_commands
    from proxy.ops.demo import add_command as add_demo_command

    add_demo_command(commands)  # demo
    add_commands(commands)  # keys, budgets
    add_ops_commands(commands)  # audit, plan, replay
    _log_level_everywhere(parser)
    return parser


def _serve(args: argparse.Namespace) -> int:
    from proxy.server.app import StartupError, run
    from proxy.server.logs import configure as configure_logging

    try:
        settings = load_settings(
            args.config,
            overrides={
                "server.host": args.host,
                "server.port": args.port,
                "upstream.url": args.upstream,
                "upstream.openai_url": args.openai_upstream,
                "upstream.gemini_url": args.gemini_upstream,
                "store.redis_url": args.redis_url,
            },
            flags=SERVE_FLAGS,
            warn=warn,
        )
    except ConfigError as e:
        return fail(f"bad setting: {e}")
    configure_logging(settings.server.log_format, args.log_level)
    try:
        run(settings)
    except StartupError as e:
        return fail(str(e))
    except ConfigError as e:  # found at start: e.g. the admin key's variable is unset
        return fail(f"bad setting: {e}")
    return 0


def _stand_in(args: argparse.Namespace) -> int:
    from proxy.testing.standin import StandInOptions, run

    options = StandInOptions()
    if args.window is not None:
        if args.window <= 0:
            return fail(f"stand-in --window must be greater than 0, got {args.window}")
        options.windows = {"*": args.window}
    try:
        run(args.host, args.port, options)
    except OSError as e:
        return fail(f"stand-in {_bind_problem(args, e)}")
    return 0


def _bind_problem(args: argparse.Namespace, error: OSError) -> str:
    source = "" if args.port != STANDIN_DEFAULT_PORT else " (default)"
    where = f"--host {args.host} --port {args.port}{source}"
    if error.errno == errno.EADDRINUSE:
        return f"{where}: {args.host}:{args.port} is already in use; choose another with --port"
    return f"{where}: cannot listen there: {error.strerror or error}"


def main(argv: list[str] | None = None) -> int:
    args: Any = _parser().parse_args(argv)
    logging.basicConfig(
        level=args.log_level, format="%(asctime)s %(levelname)s %(name)s: %(message)s"
    )
    if getattr(args, "ops_run", None) is not None:
        return int(args.ops_run(args))
    if args.command == "serve":
        return _serve(args)
    if args.command in ("keys", "budgets"):
        from proxy.admin import run

        return run(args)
    return _stand_in(args)
