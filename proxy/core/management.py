"""Managing keys and budgets, pure: what the admin API accepts and what it answers.

The admin API (proxy/server/admin) and the `keys`/`budgets` CLI share these: a key
request and a budget change are checked here field by field (a `ValueError` names the
field), and a budget is reported in one shape everywhere:

    {"scope": "key 0123456789ab", "kind": "key", "id": "0123456789ab",
     "limits": {"minute": {"input": 5000}, "day": {}, "month": {}},
     "used": {"minute": {"input": 812, "output": 40, "weighted": 900}, ...},
     "policy": {"window": 9000}}
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from proxy.core import proxy_keys
from proxy.core.budget import METRICS, PERIODS, POLICY_FIELDS, limit_field, limits_of

SCOPE_KINDS = ("key", "team")
KEY_FIELDS = (
    "team",
    "name",
    "tenant",
    "provider",
    "upstream_env",
    "upstream_scheme",
    "scopes",
    "policy",
)
MAX_NAME_CHARS = 100
KEY_ID_CHARS = 12


@dataclass(frozen=True, slots=True)
class KeyRequest:
    team: str
    upstream_env: str
    upstream_scheme: str
    name: str = ""
    tenant: str = ""
    provider: str = "anthropic"
    scopes: tuple[str, ...] = ()
    policy: tuple[tuple[str, int], ...] = ()  # conf fields (`policy:window`, value)


def _text(body: Mapping[str, Any], name: str, default: str = "") -> str:
    value = body.get(name, default)
    if value is None:
        return default
    if not isinstance(value, str):
        raise ValueError(f"{name} must be a string")
    return value.strip()


def _whole(where: str, value: Any, *, minimum: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise ValueError(f"{where} must be a whole number >= {minimum} (or null to remove it)")
    return value


def _object(body: Mapping[str, Any], name: str) -> Mapping[str, Any]:
    value = body.get(name)
    if value is None:
        return {}
    if not isinstance(value, Mapping):
        raise ValueError(f"{name} must be a JSON object")
    return value


def _unknown(where: str, given: Mapping[str, Any], known: tuple[str, ...]) -> None:
    extra = sorted(set(given) - set(known))
    if extra:
        raise ValueError(f"{where}: unknown field(s) {', '.join(extra)}; known: {', '.join(known)}")


def parse_key_request(body: Any) -> KeyRequest:
    """A `POST /admin/keys` body. Only `team` is required; `provider` ("anthropic" or
    "openai"; anthropic when not given) sets the default upstream credential and scheme
    and binds the key to that provider's API; `scopes` names the path families beyond the
    metered routes it may reach (proxy/core/proxy_keys.py); `policy` overrides the
    model's window, trigger and target for its requests."""
    if not isinstance(body, Mapping):
        raise ValueError("the body must be a JSON object")
    _unknown("key", body, KEY_FIELDS)
    team = proxy_keys.check_team(_text(body, "team"))
    provider = proxy_keys.check_provider(_text(body, "provider") or "anthropic")
    env, scheme = proxy_keys.PROVIDER_DEFAULTS[provider]
    name = _text(body, "name")
    if len(name) > MAX_NAME_CHARS:
        raise ValueError(f"name must be at most {MAX_NAME_CHARS} characters")
    scopes = body.get("scopes") or []
    if not isinstance(scopes, list) or not all(isinstance(s, str) for s in scopes):
        raise ValueError("scopes must be a list of strings")
    changes = policy_changes(_object(body, "policy"))
    return KeyRequest(
        team=team,
        upstream_env=proxy_keys.check_env_name(_text(body, "upstream_env", env)),
        upstream_scheme=proxy_keys.check_scheme(_text(body, "upstream_scheme", scheme)),
        name=name,
        tenant=proxy_keys.check_tenant(_text(body, "tenant")),
        provider=provider,
        scopes=proxy_keys.check_scopes(scopes),
        policy=tuple((k, v) for k, v in changes.items() if v is not None),
    )


def check_scope(kind: str, name: str) -> tuple[str, str]:
    """A budget's scope from a path: a key id (12 hex digits) or a team name."""
    if kind not in SCOPE_KINDS:
        raise ValueError(f"budgets are per key or per team, not {kind!r}")
    if kind == "team":
        return kind, proxy_keys.check_team(name)
    if len(name) != KEY_ID_CHARS or any(c not in "0123456789abcdef" for c in name):
        raise ValueError(f"{name!r} is not a key id (12 hex digits)")
    return kind, name


def policy_changes(policy: Mapping[str, Any]) -> dict[str, int | None]:
    """`{"window": 9000, "trigger": null}` as conf fields; null or 0 restores the
    model's own value."""
    _unknown("policy", policy, POLICY_FIELDS)
    out: dict[str, int | None] = {}
    for name, value in policy.items():
        out[f"policy:{name}"] = (
            None if value is None else _whole(f"policy.{name}", value, minimum=0) or None
        )
    return out


def budget_changes(body: Any) -> dict[str, int | None]:
    """A `PUT /admin/budgets/...` body as conf fields:
    `{"limits": {"minute": {"input": 5000, "output": null}}, "policy": {"window": 9000}}`;
    null removes a limit (or restores the model's policy value)."""
    if not isinstance(body, Mapping):
        raise ValueError("the body must be a JSON object")
    _unknown("budget", body, ("limits", "policy"))
    limits = _object(body, "limits")
    _unknown("limits", limits, PERIODS)
    changes: dict[str, int | None] = {}
    for period, amounts in limits.items():
        if not isinstance(amounts, Mapping):
            raise ValueError(f"limits.{period} must be a JSON object")
        _unknown(f"limits.{period}", amounts, METRICS)
        for metric, value in amounts.items():
            where = f"limits.{period}.{metric}"
            changes[limit_field(period, metric)] = (
                None if value is None else _whole(where, value, minimum=0)
            )
    changes.update(policy_changes(_object(body, "policy")))
    if not changes:
        raise ValueError("nothing to set: give limits or a policy")
    return changes


def merged(conf: Mapping[str, str], changes: Mapping[str, int | None]) -> dict[str, str]:
    """A stored conf with changes applied (None removes a field)."""
    out = dict(conf)
    for name, value in changes.items():
        if value is None:
            out.pop(name, None)
        else:
            out[name] = str(value)
    return out


def check_policy(conf: Mapping[str, str]) -> None:
    numbers = {f: int(conf[f"policy:{f}"]) for f in POLICY_FIELDS if f"policy:{f}" in conf}
    window, trigger, target = (numbers.get(f) for f in POLICY_FIELDS)
    if window is not None and trigger is not None and trigger > window:
        raise ValueError(f"trigger ({trigger}) exceeds the window ({window})")
    if trigger is not None and target is not None and target >= trigger:
        raise ValueError(f"target ({target}) must be below trigger ({trigger})")


def budget_report(
    kind: str, name: str, conf: Mapping[str, str], used: Mapping[str, Mapping[str, int]]
) -> dict[str, Any]:
    limits = limits_of(conf)
    return {
        "scope": f"{kind} {name}",
        "kind": kind,
        "id": name,
        "limits": {p: {m: limits[(p, m)] for m in METRICS if (p, m) in limits} for p in PERIODS},
        "used": {p: {m: int(used.get(p, {}).get(m, 0)) for m in METRICS} for p in PERIODS},
        "policy": {f: int(conf[f"policy:{f}"]) for f in POLICY_FIELDS if f"policy:{f}" in conf},
    }


def shown(record: Mapping[str, str]) -> dict[str, str]:
    """A key record as it may be shown: everything but the digest."""
    return {k: v for k, v in record.items() if k != "digest"}


def changes_body(changes: Mapping[str, int | None]) -> dict[str, Any]:
    """Conf field changes as a `PUT /admin/budgets/...` body (the inverse of
    `budget_changes`)."""
    body: dict[str, dict[str, Any]] = {}
    for name, value in changes.items():
        head, _, tail = name.partition(":")
        if head == "policy":
            body.setdefault("policy", {})[tail] = value
        else:
            body.setdefault("limits", {}).setdefault(head, {})[tail] = value
    return body
