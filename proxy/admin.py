"""`compaction-proxy keys ...` and `compaction-proxy budgets ...`: manage proxy keys,
teams and budgets in the Redis the proxies share, or through a proxy's admin API.

The Redis is the one `serve` would use (same settings: --config, environment,
--redis-url); with no Redis URL, the embedded Redis of the state directory: the one a
`serve` on this machine runs, else started for the command and stopped after it (a
`serve` starting meanwhile waits for it). With `--url URL` the commands go to that proxy's
admin API instead (the admin key from $COMPACTION_PROXY_ADMIN_KEY), for replicas whose
Redis is private. `--json` prints machine-readable output.
"""

from __future__ import annotations

import argparse
import asyncio
import time
from pathlib import Path
from typing import Any

import orjson

from proxy.admin_client import AdminAPIError
from proxy.config import ConfigError, Settings, load_settings
from proxy.console import fail, warn
from proxy.core import proxy_keys
from proxy.core.budget import METRICS, PERIODS, POLICY_FIELDS, limit_field
from proxy.core.management import KeyRequest
from proxy.core.policy import Policy
from proxy.server.logs import redacted_url as redacted
from proxy.store import EmbeddedRedis, EmbeddedRedisError, Store, StoreUnavailable
from proxy.store import management as manage
from proxy.store.accounts import Accounts
from proxy.store.probe import addressing_problem


def add_commands(commands: Any) -> None:
    """Add the `keys` and `budgets` commands to the CLI's subparsers."""
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument("--config", type=Path, help="TOML settings file, as for serve")
    common.add_argument("--redis-url", help="Redis URL (store.redis_url)")
    common.add_argument("--json", action="store_true", help="print JSON")
    common.add_argument(
        "--url",
        help="a proxy's base URL: use its admin API (the admin key from"
        " $COMPACTION_PROXY_ADMIN_KEY) instead of Redis",
    )

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


class StoreSetupError(Exception):
    """The store cannot be used as set up; the message names the setting."""


def _settings(args: argparse.Namespace) -> Settings:
    return load_settings(
        args.config,
        overrides={"store.redis_url": args.redis_url},
        flags={"store.redis_url": "--redis-url"},
        warn=warn,
    )


def _embedded(settings: Settings, command: str) -> tuple[str, EmbeddedRedis | None]:
    """With no Redis URL: the embedded Redis of the state dir, a serve's if one runs it,
    else started for this command (returned, to be stopped when the command ends)."""
    embedded = EmbeddedRedis(settings.resolved_state_dir() / "redis", role=command)
    try:
        started = embedded.start_or_attach_sync()
    except EmbeddedRedisError as e:
        source = settings.source_of("store.state_dir")
        raise StoreSetupError(
            f"store.state_dir {settings.resolved_state_dir()} ({source}): the embedded Redis"
            f" did not start: {e}"
        ) from None
    return embedded.url, embedded if started else None


async def _redis_backend(settings: Settings, url: str) -> RedisBackend:
    """The Redis at `url`, once it is known to accept how it is addressed."""
    store = Store.from_url(url, prefix=settings.store.key_prefix, op_timeout=5.0)
    problem = await addressing_problem(store, url)
    if problem:
        await store.close()
        source = settings.source_of("store.redis_url")
        raise StoreSetupError(f"store.redis_url {redacted(url)} ({source}): {problem}")
    return RedisBackend(store, list(settings.model_policies))


class RedisBackend:
    """The keys and budgets in the Redis the proxies share (the other backend is the
    admin API: proxy/admin_client.py). `policies`: the models' (configured, then built
    in), which a key's or team's policy override must fit."""

    def __init__(self, store: Store, policies: list[Policy]) -> None:
        self.store = store
        self.accounts = Accounts(store)
        self.policies = policies

    async def create_key(self, request: KeyRequest) -> dict[str, Any]:
        return await manage.create_key(self.accounts, request)

    async def list_keys(self) -> list[dict[str, str]]:
        return await manage.list_keys(self.accounts)

    async def revoke_key(self, key_id: str) -> bool:
        return await self.accounts.revoke_key(key_id)

    async def budget(self, kind: str, name: str) -> dict[str, Any]:
        return await manage.budget(self.accounts, kind, name, time.time())

    async def set_budget(
        self, kind: str, name: str, changes: dict[str, int | None]
    ) -> dict[str, Any]:
        return await manage.set_budget(
            self.accounts, kind, name, changes, time.time(), self.policies
        )

    async def close(self) -> None:
        await self.store.close()


def _print(args: argparse.Namespace, value: Any, human: str) -> None:
    if args.json:
        print(orjson.dumps(value, option=orjson.OPT_INDENT_2).decode())
    else:
        print(human)


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


async def _run(args: argparse.Namespace, settings: Settings | None, url: str) -> int:
    if settings is None:
        from proxy.admin_client import AdminClient

        backend: Any = AdminClient.from_environment(args.url)
    else:
        backend = await _redis_backend(settings, url)
    try:
        if args.command == "keys":
            return await _keys(args, backend)
        return await _budgets(args, backend)
    finally:
        await backend.close()


async def _keys(args: argparse.Namespace, backend: Any) -> int:
    if args.action == "create":
        env, scheme = proxy_keys.PROVIDER_DEFAULTS[args.provider]
        created = await backend.create_key(
            KeyRequest(
                team=proxy_keys.check_team(args.team),
                upstream_env=proxy_keys.check_env_name(args.upstream_env or env),
                upstream_scheme=args.upstream_scheme or scheme,
                name=args.name,
                provider=args.provider,
                scopes=proxy_keys.check_scopes(args.scope),
            )
        )
        _print(
            args,
            created,
            f"{created['key']}\nid {created['id']}, team {created['team']},"
            f" {created['provider']} API, upstream ${created['upstream_env']}"
            f" ({created['upstream_scheme']}), scopes"
            f" {created.get('scopes') or 'none (metered routes only)'}.\nKeep the key now:"
            " it is not stored and not shown again.",
        )
        return 0
    if args.action == "list":
        records = await backend.list_keys()
        lines = [
            f"{r['id']}  team={r['team']}  upstream=${r['upstream_env']}"
            f"  {'REVOKED' if r['revoked'] == '1' else 'active'}  {r.get('name', '')}"
            for r in records
        ]
        _print(args, records, "\n".join(lines) or "no keys")
        return 0
    if not await backend.revoke_key(args.key_id):
        return fail(f"no key {args.key_id}", status=1)
    _print(args, {"revoked": args.key_id}, f"revoked {args.key_id}")
    return 0


async def _budgets(args: argparse.Namespace, backend: Any) -> int:
    kind, name = ("key", args.key) if args.key else ("team", args.team)
    try:
        if args.action == "set":
            report = await backend.set_budget(kind, name, _conf_changes(args))
        else:
            report = await backend.budget(kind, name)
    except LookupError as e:
        return fail(str(e.args[0]), status=1)
    lines = [report["scope"]]
    for period in PERIODS:
        for metric, limit in report["limits"][period].items():
            used = report["used"][period][metric]
            lines.append(f"  {period:<6} {metric:<8} {used:>12} / {limit}")
    policy = report["policy"] or "the model's"
    lines.append(f"  policy {policy}")
    _print(args, report, "\n".join(lines))
    return 0


def run(args: argparse.Namespace) -> int:
    embedded = None
    try:
        settings, url = None, ""
        if not args.url:  # through the shared Redis, not a proxy's admin API
            settings = _settings(args)
            url = settings.store.redis_url
            if not url:
                url, embedded = _embedded(settings, args.command)
        return asyncio.run(_run(args, settings, url))
    except ConfigError as e:
        return fail(f"bad setting: {e}")
    except (StoreSetupError, ValueError) as e:
        return fail(str(e))
    except StoreUnavailable as e:
        return fail(f"Redis unreachable: {e}", status=1)
    except AdminAPIError as e:
        return fail(str(e), status=1)
    finally:
        if embedded is not None:
            embedded.stop_sync()
