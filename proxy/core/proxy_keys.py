"""Proxy-issued keys, pure: their text form, their stored digest, names that are safe.

A key reads `cpk_<id>_<secret>`: the id (12 hex digits) is public (listed, used to
revoke, part of Redis key names); the secret is 32 random bytes, base64url. Only a keyed
hash of the whole key is stored, so Redis never holds a usable key. The upstream
credential a key maps to is *named*, not stored: the record holds the name of an
environment variable every replica resolves itself.
"""

from __future__ import annotations

import hashlib
import hmac
import re

PREFIX = "cpk_"
_KEY = re.compile(r"^cpk_([0-9a-f]{12})_([A-Za-z0-9_-]{43})$")
_DIGEST_KEY = b"compaction-proxy/proxy-key/v1"
TEAM = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$")
ENV_NAME = re.compile(r"^[A-Z_][A-Z0-9_]{0,127}$")
SCHEMES = ("x-api-key", "bearer")
# A key may be limited to one provider's API and to some route families (its scopes).
PROVIDERS = ("anthropic", "openai")
SCOPES = ("messages", "chat", "passthrough")
# How each provider's credential is named and sent by default.
PROVIDER_DEFAULTS = {
    "anthropic": ("ANTHROPIC_API_KEY", "x-api-key"),
    "openai": ("OPENAI_API_KEY", "bearer"),
}


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


def scope_of(path: str) -> str:
    """The route family a request path belongs to (what a key's scopes name)."""
    if path == "/v1/messages" or path.startswith("/v1/messages/"):
        return "messages"
    if path == "/v1/chat/completions":
        return "chat"
    return "passthrough"


def refusal(record: dict[str, str], path: str, provider: str) -> str | None:
    """Why a valid key may not make this request (its provider or scopes), else None."""
    allowed = record.get("provider", "")
    if allowed and allowed != provider:
        return f"this key is for the {allowed} API only"
    scopes = record.get("scopes", "")
    if scopes and scope_of(path) not in scopes.split(","):
        return f"this key may not call {scope_of(path)} routes (its scopes: {scopes})"
    return None


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
    if provider and provider not in PROVIDERS:
        raise ValueError(f"provider {provider!r}: one of {', '.join(PROVIDERS)} (or empty: any)")
    return provider


def check_scopes(scopes: list[str] | tuple[str, ...]) -> tuple[str, ...]:
    unknown = [s for s in scopes if s not in SCOPES]
    if unknown:
        raise ValueError(f"scopes {unknown!r}: each one of {', '.join(SCOPES)}")
    return tuple(s for s in SCOPES if s in scopes)


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
