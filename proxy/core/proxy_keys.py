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


def tenant_for(key_id: str) -> str:
    """A key's tenant: its conversations, blobs and summaries are its own."""
    return "k" + key_id


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


def check_scheme(scheme: str) -> str:
    if scheme not in SCHEMES:
        raise ValueError(f"upstream scheme {scheme!r}: one of {', '.join(SCHEMES)}")
    return scheme
