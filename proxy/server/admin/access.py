"""The admin key: read once from the environment, checked in constant time.

The key is only ever in the environment variable `auth.admin_key_env` names: never in
a file, in Redis, in a log line or a metric. The process keeps only its SHA-256 and
compares digests with `hmac.compare_digest`, so neither the key's bytes nor its length
show in timing. A proxy key (`cpk_...`) is never accepted as the admin key, and an admin
key shaped like one is refused at start.
"""

from __future__ import annotations

import hashlib
import hmac
import os
from collections.abc import Mapping

from proxy.config import ConfigError, Settings
from proxy.core import proxy_keys

MIN_CHARS = 16


def _digest(text: str) -> bytes:
    return hashlib.sha256(text.encode()).digest()


class AdminKey:
    def __init__(self, text: str) -> None:
        self._digest = _digest(text)

    @classmethod
    def from_settings(
        cls, settings: Settings, environ: Mapping[str, str] | None = None
    ) -> AdminKey | None:
        """None when no admin key is configured; ConfigError when it is named but unset,
        too short, or shaped like a proxy key."""
        name = settings.auth.admin_key_env
        if not name:
            return None
        text = (os.environ if environ is None else environ).get(name, "").strip()
        where = f"auth.admin_key_env: the admin key in ${name}"
        if not text:
            raise ConfigError(f"{where} is not set (or empty)")
        if len(text) < MIN_CHARS:
            raise ConfigError(f"{where} must be at least {MIN_CHARS} characters")
        if proxy_keys.key_id_of(text) is not None:
            raise ConfigError(f"{where} must not be a proxy key (cpk_...)")
        return cls(text)

    def problem(self, authorization: str) -> str | None:
        """Why an `Authorization` header does not carry the admin key, else None."""
        scheme, _, token = authorization.partition(" ")
        token = token.strip()
        if scheme.lower() != "bearer" or not token:
            return "the admin API needs the admin key: Authorization: Bearer <admin key>"
        if proxy_keys.key_id_of(token) is not None:
            return "a proxy key is not the admin key"
        if not hmac.compare_digest(_digest(token), self._digest):
            return "invalid admin key"
        return None
