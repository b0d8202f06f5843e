"""`compaction-proxy keys ...` and `compaction-proxy budgets ...`: manage proxy keys,
teams and budgets in the Redis the proxies share.

The Redis is the one `serve` would use (same settings: --config, environment,
--redis-url); with no Redis URL, the embedded Redis of the state directory, which must be
running (a `serve` on this machine). `--json` prints machine-readable output.
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import time
from pathlib import Path
from typing import Any

import orjson

from proxy.config import ConfigError, load_settings
from proxy.core import proxy_keys
from proxy.core.budget import (
    METRICS,
    PERIODS,
    POLICY_FIELDS,
    limit_field,
    limits_of,
    override_problem,
    policy_override,
)
from proxy.core.policy import DEFAULT_POLICIES, parse_policies
from proxy.store import EmbeddedRedis, Store, StoreUnavailable
from proxy.store.accounts import Accounts, Scope


def add_commands(commands: Any) -> None:
    """Add the `keys` and `budgets` commands to the CLI's subparsers."""
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument("--config", type=Path, help="TOML settings file, as for serve")
    common.add_argument("--redis-url", help="Redis URL (store.redis_url)")
    common.add_argument("--json", action="store_true", help="print JSON")

    keys = commands.add_parser("keys", help="create, list or revoke proxy keys")
    key_commands = keys.add_subparsers(dest="action", required=True)
    create = key_commands.add_parser("create", parents=[common], help="issue a new key")
    create.add_argument("--team", required=True, help="the key's team (budgets, policy)")
    create.add_argument(
        "--provider",
        default="anthropic",
        choices=proxy_keys.PROVIDERS,
        help="the one API the key may use; its credential never goes to the other",
    )
    create.add_argument(
        "--scope",
        action="append",
        default=[],
        choices=proxy_keys.SCOPES,
        help="a family of paths beyond the metered routes the key may reach (repeat it)",
    )
    create.add_argument(
        "--upstream-env",
        help="environment variable (on every replica) holding the upstream credential"
        " (default: ANTHROPIC_API_KEY, or OPENAI_API_KEY for --provider openai)",
    )
    create.add_argument(
        "--upstream-scheme",
        choices=proxy_keys.SCHEMES,
        help="how the upstream credential is sent (default: x-api-key, bearer for openai)",
    )
    create.add_argument("--name", default="", help="a label for people")
    key_commands.add_parser("list", parents=[common], help="list keys (never their secret)")
    revoke = key_commands.add_parser("revoke", parents=[common], help="revoke a key")
    revoke.add_argument("key_id")

    budgets = commands.add_parser("budgets", help="set or show budgets of a key or team")
    budget_commands = budgets.add_subparsers(dest="action", required=True)
    for name, text in (("set", "set limits or a policy"), ("show", "limits and usage")):
        sub = budget_commands.add_parser(name, parents=[common], help=text)
        who = sub.add_mutually_exclusive_group(required=True)
        who.add_argument("--key", help="a key id")
        who.add_argument("--team", help="a team name")
        if name == "set":
            sub.add_argument("--period", choices=PERIODS, help="period of the limits given")
            for metric in METRICS:
                sub.add_argument(
                    f"--{metric}", type=int, help=f"{metric} tokens per period (-1: no limit)"
                )
            for field in POLICY_FIELDS:
                sub.add_argument(
                    f"--{field}", type=int, help=f"context policy {field} (0: the model's)"
                )


def _store(args: argparse.Namespace) -> Store:
    settings = load_settings(args.config, overrides={"store.redis_url": args.redis_url})
    url = settings.store.redis_url or EmbeddedRedis(settings.resolved_state_dir() / "redis").url
    return Store.from_url(url, prefix=settings.store.key_prefix, op_timeout=5.0)


def _print(args: argparse.Namespace, value: Any, human: str) -> None:
    if args.json:
        print(orjson.dumps(value, option=orjson.OPT_INDENT_2).decode())
    else:
        print(human)


def _scope(args: argparse.Namespace) -> Scope:
    if args.key:
        return Scope("key", args.key)
    return Scope("team", proxy_keys.check_team(args.team))


def _conf_changes(args: argparse.Namespace) -> dict[str, int | None]:
    changes: dict[str, int | None] = {}
    given = [m for m in METRICS if getattr(args, m) is not None]
    if given and not args.period:
        raise ValueError("--period is needed with --input, --output or --weighted")
    for metric in given:
        value = getattr(args, metric)
        if value < -1:
            raise ValueError(f"--{metric} must be a number of tokens, or -1 for no limit")
        changes[limit_field(args.period, metric)] = None if value == -1 else value
    for field in POLICY_FIELDS:
        value = getattr(args, field)
        if value is not None:
            if value < 0:
                raise ValueError(f"--{field} must not be negative")
            changes[f"policy:{field}"] = value or None
    if not changes:
        raise ValueError("nothing to set: give limits (--period with amounts) or a policy")
    return changes


def _check_policy(conf: dict[str, str]) -> None:
    numbers = {f: int(conf[f"policy:{f}"]) for f in POLICY_FIELDS if f"policy:{f}" in conf}
    window, trigger, target = (numbers.get(f) for f in POLICY_FIELDS)
    if window is not None and trigger is not None and trigger > window:
        raise ValueError(f"trigger ({trigger}) exceeds the window ({window})")
    if trigger is not None and target is not None and target >= trigger:
        raise ValueError(f"target ({target}) must be below trigger ({trigger})")


async def _check_override(
    args: argparse.Namespace, accounts: Accounts, scope: Scope, merged: dict[str, str]
) -> None:
    """Refuse a window/trigger/target that some model's policy could not take: every
    request of that model would then go without compaction. A key's is checked over
    its team's, a team's under each of its keys'."""
    policies = [*parse_policies(load_settings(args.config).policies), *DEFAULT_POLICIES]
    pairs: list[tuple[dict[str, str], dict[str, str]]] = []
    if scope.kind == "key":
        record = await accounts.get_key(scope.name) or {}
        team = record.get("team")
        pairs.append((await accounts.get_conf(Scope("team", team)) if team else {}, merged))
    else:
        members = [r for r in await accounts.list_keys() if r.get("team") == scope.name]
        pairs.append((merged, {}))
        for record in members:
            pairs.append((merged, await accounts.get_conf(Scope("key", record["id"]))))
    for team_conf, key_conf in pairs:
        override = policy_override(team_conf, key_conf)
        if not override:
            continue
        problem = override_problem(override, policies)
        if problem is not None:
            given = ", ".join(f"{k} {v}" for k, v in override.items())
            raise ValueError(
                f"the policy ({given}) does not fit {problem}; give the other fields"
                " too (--window, --trigger, --target) or a [[policy]] for those models"
            )


async def _run(args: argparse.Namespace) -> int:
    store = _store(args)
    accounts = Accounts(store)
    try:
        if args.command == "keys":
            return await _keys(args, accounts)
        return await _budgets(args, accounts)
    finally:
        await store.close()


async def _keys(args: argparse.Namespace, accounts: Accounts) -> int:
    if args.action == "create":
        env, scheme = proxy_keys.PROVIDER_DEFAULTS[args.provider]
        text, record = await accounts.create_key(
            team=args.team,
            upstream_env=args.upstream_env or env,
            upstream_scheme=args.upstream_scheme or scheme,
            name=args.name,
            provider=args.provider,
            scopes=tuple(args.scope),
        )
        shown = {k: v for k, v in record.items() if k != "digest"}
        _print(
            args,
            {"key": text, **shown},
            f"{text}\nid {record['id']}, team {record['team']}, {record['provider']} API,"
            f" upstream ${record['upstream_env']} ({record['upstream_scheme']}), scopes"
            f" {record['scopes'] or 'none (metered routes only)'}.\nKeep the key now: it is"
            " not stored and not shown again.",
        )
        return 0
    if args.action == "list":
        records = [
            {k: v for k, v in r.items() if k != "digest"} for r in await accounts.list_keys()
        ]
        lines = [
            f"{r['id']}  team={r['team']}  upstream=${r['upstream_env']}"
            f"  {'REVOKED' if r['revoked'] == '1' else 'active'}  {r.get('name', '')}"
            for r in records
        ]
        _print(args, records, "\n".join(lines) or "no keys")
        return 0
    if not await accounts.revoke_key(args.key_id):
        print(f"compaction-proxy: no key {args.key_id}", file=sys.stderr)
        return 1
    _print(args, {"revoked": args.key_id}, f"revoked {args.key_id}")
    return 0


async def _budgets(args: argparse.Namespace, accounts: Accounts) -> int:
    scope = _scope(args)
    if args.key and await accounts.get_key(args.key) is None:
        print(f"compaction-proxy: no key {args.key}", file=sys.stderr)
        return 1
    if args.action == "set":
        changes = _conf_changes(args)
        current = await accounts.get_conf(scope)
        merged = {**current, **{k: str(v) for k, v in changes.items() if v is not None}}
        for k, v in changes.items():
            if v is None:
                merged.pop(k, None)
        _check_policy(merged)
        await _check_override(args, accounts, scope, merged)
        await accounts.set_conf(scope, changes)
    conf = await accounts.get_conf(scope)
    usage = await accounts.usage(scope, time.time())
    limits = limits_of(conf)
    report = {
        "scope": scope.label,
        "limits": {p: {m: limits[(p, m)] for m in METRICS if (p, m) in limits} for p in PERIODS},
        "used": usage,
        "policy": {f: int(conf[f"policy:{f}"]) for f in POLICY_FIELDS if f"policy:{f}" in conf},
    }
    lines = [scope.label]
    for period in PERIODS:
        for metric in METRICS:
            if (period, metric) in limits:
                lines.append(
                    f"  {period:<6} {metric:<8} {usage[period][metric]:>12} /"
                    f" {limits[(period, metric)]}"
                )
    policy = report["policy"] or "the model's"
    lines.append(f"  policy {policy}")
    _print(args, report, "\n".join(lines))
    return 0


def run(args: argparse.Namespace) -> int:
    try:
        return asyncio.run(_run(args))
    except ConfigError as e:
        print(f"compaction-proxy: bad setting: {e}", file=sys.stderr)
        return 2
    except ValueError as e:
        print(f"compaction-proxy: {e}", file=sys.stderr)
        return 2
    except StoreUnavailable as e:
        print(f"compaction-proxy: Redis unreachable: {e}", file=sys.stderr)
        return 1
