"""The `compaction-proxy` command: `serve` the proxy, or run the `stand-in` upstream."""

from __future__ import annotations

import argparse
import logging
import sys
from pathlib import Path

from proxy.config import ConfigError, load_settings
from proxy.ops.commands import add_commands as add_ops_commands

STANDIN_DEFAULT_PORT = 8081


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="compaction-proxy",
        description="A reverse proxy that keeps agents' conversations inside the window.",
    )
    parser.add_argument(
        "--log-level", default="INFO", choices=["DEBUG", "INFO", "WARNING", "ERROR"]
    )
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
    serve.add_argument("--upstream", help="upstream API base URL (upstream.url)")
    serve.add_argument(
        "--redis-url", help="Redis URL; empty or unset = embedded Redis (store.redis_url)"
    )

    standin = commands.add_parser(
        "stand-in", help="run the local stand-in of the Messages API (no API key needed)"
    )
    standin.add_argument("--host", default="127.0.0.1")
    standin.add_argument("--port", type=int, default=STANDIN_DEFAULT_PORT)
    standin.add_argument(
        "--window", type=int, help="context window of every model, in tokens (default 200000)"
    )
    from proxy.admin import add_commands

    add_commands(commands)  # keys, budgets
    add_ops_commands(commands)  # audit, plan, replay
    return parser


def _serve(args: argparse.Namespace) -> int:
    from proxy.server.app import run
    from proxy.server.logs import configure as configure_logging

    try:
        settings = load_settings(
            args.config,
            overrides={
                "server.host": args.host,
                "server.port": args.port,
                "upstream.url": args.upstream,
                "store.redis_url": args.redis_url,
            },
        )
    except ConfigError as e:
        print(f"compaction-proxy: bad setting: {e}", file=sys.stderr)
        return 2
    configure_logging(settings.server.log_format, args.log_level)
    try:
        run(settings)
    except ConfigError as e:  # found at start: e.g. the admin key's variable is unset
        print(f"compaction-proxy: bad setting: {e}", file=sys.stderr)
        return 2
    return 0


def _stand_in(args: argparse.Namespace) -> int:
    from proxy.testing.standin import StandInOptions, run

    options = StandInOptions()
    if args.window is not None:
        if args.window <= 0:
            print("compaction-proxy: --window must be greater than 0", file=sys.stderr)
            return 2
        options.windows = {"*": args.window}
    run(args.host, args.port, options)
    return 0


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
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
