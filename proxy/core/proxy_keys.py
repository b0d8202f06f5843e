"""Proxy-issued keys, pure: their text form, their stored digest, names that are safe,
and what a key may reach.

A key reads `cpk_<id>_<secret>`: the id (12 hex digits) is public (listed, used to
revoke, part of Redis key names); the secret is 32 random bytes, base64url. Only a keyed
hash of the whole key is stored, so Redis never holds a usable key. The upstream
credential a key maps to is *named*, not stored: the record holds the name of an
environment variable every replica resolves itself.

A key is bound to one provider (`anthropic`, `openai` or `gemini`): its credential only ever goes
to that provider's upstream. It reaches the metered routes of its provider (the calls
that cost tokens and are reserved against its budgets) and nothing else without a
*scope* given at creation (`models`, `files`, `batches`, ...), because a
credential shared by several keys would otherwise let one key list and read what
another stored upstream (files, batches, stored responses). `passthrough_rule` says, for
a path the proxy does not handle itself, which scope it needs and how it is metered.
"""

from __future__ import annotations

import hashlib
import hmac
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

PREFIX = "cpk_"
_KEY = re.compile(r"^cpk_([0-9a-f]{12})_([A-Za-z0-9_-]{43})$")
_DIGEST_KEY = b"compaction-proxy/proxy-key/v1"
TEAM = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$")
ENV_NAME = re.compile(r"^[A-Z_][A-Z0-9_]{0,127}$")
SCHEMES = ("x-api-key", "bearer", "x-goog-api-key")
PROVIDERS = ("anthropic", "openai", "gemini")
# The credential's environment variable and scheme a provider's key gets unless given.
PROVIDER_DEFAULTS = {
    "anthropic": ("ANTHROPIC_API_KEY", "x-api-key"),
    "openai": ("OPENAI_API_KEY", "bearer"),
    "gemini": ("GEMINI_API_KEY", "x-goog-api-key"),
}
# Variables a key's upstream credential may never be read from, whatever the settings:
# the proxy's own settings (a Redis URL with its password, ...).
_NEVER_UPSTREAM_PREFIXES = ("COMPACTION_PROXY_",)
_NEVER_UPSTREAM = frozenset({"REDIS_URL"})


def upstream_env_problem(name: str, admin_key_env: str, allowed: str | None) -> str | None:
    """Why a key may not name `name` as its upstream credential's variable, else None:
    never the admin key's (`admin_key_env`) nor one of the proxy's own settings; with
    `allowed` (the admin API's `auth.upstream_envs`, comma-separated), only those and
    the providers' defaults."""
    if (
        name == admin_key_env
        or name in _NEVER_UPSTREAM
        or name.startswith(_NEVER_UPSTREAM_PREFIXES)
    ):
        return f"{name} holds a secret of the proxy's own, never an upstream credential"
    if allowed is None:
        return None
    names = {n.strip() for n in allowed.split(",") if n.strip()}
    names |= {env for env, _ in PROVIDER_DEFAULTS.values()}
    if name not in names:
        shown = ", ".join(sorted(names))
        return f"upstream_env {name} is not one this proxy allows (auth.upstream_envs): {shown}"
    return None


# Families of paths a key reaches only with their scope; `all`: every path.
SCOPES = (
    "models",
    "files",
    "batches",
    "stored",  # answers the upstream stored: /v1/responses/{id}, GET /v1/chat/completions
    "moderations",
    "images",
    "audio",
    "fine_tuning",
    "assistants",
    "threads",
    "vector_stores",
    "uploads",
    "realtime",
    "conversations",
    "evals",
    "containers",
    "videos",
    "skills",
    "all",
)

# How a pass-through call is metered against a caller's budgets.
FREE = "free"  # costs no tokens: reads, deletes, uploads, counts, cancels
ESTIMATE = "estimate"  # one model call: its estimate reserved, settled to reported usage
BATCH = "batch"  # many calls answered later: all of them reserved and charged whole
UNMETERED = "unmetered"  # costs tokens the proxy cannot estimate: refused under budgets

# Model calls every key of the provider may make (POST), beyond the proxy's own routes.
_OPEN_CALLS = {
    "/v1/complete": ESTIMATE,
    "/v1/completions": ESTIMATE,
    "/v1/embeddings": ESTIMATE,
    "/v1/responses": ESTIMATE,
    "/v1/responses/compact": ESTIMATE,
    "/v1/responses/input_tokens": FREE,
    "/v1/messages": ESTIMATE,
    "/v1/messages/count_tokens": FREE,
    "/v1/chat/completions": ESTIMATE,
}
# Writes under a scope that cost no tokens (the rest, but batches, are unmetered).
_FREE_WRITES = ("files", "uploads", "moderations", "conversations", "stored")
_READS = ("GET", "HEAD", "OPTIONS", "DELETE")


@dataclass(frozen=True, slots=True)
class PathRule:
    scope: str | None  # the scope a key needs; None: every key of the provider
    meter: str  # FREE, ESTIMATE, BATCH or UNMETERED


def _family(path: str) -> str:
    if path.startswith(("/v1/messages/batches", "/v1/batches")):
        return "batches"
    if path.startswith(("/v1/chat/completions", "/v1/responses")):
        return "stored"
    version, _, rest = path.removeprefix("/").partition("/")
    head = rest.split("/", 1)[0]
    return head if version in ("v1", "v1beta") and head in SCOPES else "all"


def passthrough_rule(method: str, path: str) -> PathRule:
    """Which scope a path the proxy does not handle itself needs, and how it is metered."""
    write = method.upper() not in _READS
    if write and path in _OPEN_CALLS:
        return PathRule(None, _OPEN_CALLS[path])
    if method.upper() == "GET" and path == "/v1/responses":
        return PathRule(None, FREE)  # a WebSocket attempt (Codex), never a model call
    if write and path.endswith(":countTokens"):
        return PathRule(None, FREE)  # Gemini's count of a request: no model call
    family = _family(path)
    if not write or path.endswith("/cancel") or family in _FREE_WRITES:
        return PathRule(family, FREE)
    if path == "/v1/messages/batches":
        return PathRule(family, BATCH)
    return PathRule(family, UNMETERED)


def may_reach(rule: PathRule, scopes: Iterable[str]) -> bool:
    granted = set(scopes)
    return rule.scope is None or rule.scope in granted or "all" in granted


def provider_of(record: Mapping[str, str]) -> str:
    """A key's provider; records made before keys had one are read by their scheme."""
    provider = record.get("provider", "")
    if provider in PROVIDERS:
        return provider
    return "openai" if record.get("upstream_scheme") == "bearer" else "anthropic"


# Scope names of records made before scopes were path families: `passthrough` reached
# every other path; `messages` and `chat` named metered routes, which every key reaches.
_LEGACY_SCOPES = {"passthrough": "all", "messages": "", "chat": ""}


def scopes_of(record: Mapping[str, str]) -> tuple[str, ...]:
    names = (_LEGACY_SCOPES.get(s, s) for s in record.get("scopes", "").split(","))
    return tuple(s for s in names if s)


def format_key(key_id: str, secret: str) -> str:
    text = f"{PREFIX}{key_id}_{secret}"
    if _KEY.match(text) is None:
        raise ValueError("not a well-formed proxy key")
    return text


def key_id_of(text: str) -> str | None:
    """The id of a well-formed proxy key, else None."""
    found = _KEY.match(text.strip())
    return found.group(1) if found else None


def digest(text: str) -> str:
    return hashlib.blake2b(text.strip().encode(), key=_DIGEST_KEY, digest_size=32).hexdigest()


def matches(text: str, stored_digest: str) -> bool:
    return hmac.compare_digest(digest(text), stored_digest)


def tenant_for(key_id: str, shared: str = "") -> str:
    """A key's tenant: its conversations, blobs and summaries are its own, unless the
    key was given a named tenant, which every key naming it shares."""
    return "n" + shared if shared else "k" + key_id


def check_team(team: str) -> str:
    if TEAM.match(team) is None:
        raise ValueError(
            f"team {team!r}: 1-64 letters, digits, '_', '.', '-', starting with a letter or digit"
        )
    return team


def check_env_name(name: str) -> str:
    if ENV_NAME.match(name) is None:
        raise ValueError(f"{name!r} is not an environment variable name (A-Z, 0-9, _)")
    return name


def check_provider(provider: str) -> str:
    if provider not in PROVIDERS:
        raise ValueError(f"provider {provider!r}: one of {', '.join(PROVIDERS)}")
    return provider


def check_scopes(scopes: Iterable[str]) -> tuple[str, ...]:
    given = list(scopes)
    unknown = [s for s in given if s not in SCOPES]
    if unknown:
        raise ValueError(f"scopes: {', '.join(unknown)} unknown; known: {', '.join(SCOPES)}")
    return tuple(s for s in SCOPES if s in given)


def check_tenant(tenant: str) -> str:
    if tenant and TEAM.match(tenant) is None:
        raise ValueError(
            f"tenant {tenant!r}: 1-64 letters, digits, '_', '.', '-', starting with a letter"
            " or digit (or empty: the key's own)"
        )
    return tenant


def check_scheme(scheme: str) -> str:
    if scheme not in SCHEMES:
        raise ValueError(f"upstream scheme {scheme!r}: one of {', '.join(SCHEMES)}")
    return scheme
