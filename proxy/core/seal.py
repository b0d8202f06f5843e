"""Sealed references: what the proxy hands a client in place of something it keeps.

When the proxy answers Codex's `compaction_trigger` itself, the `compaction` item's
`encrypted_content` is a reference to the summary the proxy stored, sealed so that only
the proxy fleet can make one and only the tenant it was made for can use it:

    cpx1.<base64url JSON payload>.<MAC>

The MAC is an HMAC-SHA256 (128 bits kept) over the payload and the tenant id, with a key
the fleet shares (proxy/server/seal_key.py keeps it in the store). The payload is not
secret (the client's own conversation id and the hash of its history); the MAC makes it
unforgeable and binds it to the tenant. A reference that does not open (changed, made
with another key, or for another tenant) reads exactly like one whose summary is gone.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import hmac
from typing import Any

import orjson

PREFIX = "cpx1."
_DOMAIN = b"compaction-proxy/sealed-reference/v1\x00"
_MAC_HEX = 32


def is_sealed(content: object) -> bool:
    """Whether a value claims to be one of the proxy's sealed references."""
    return isinstance(content, str) and content.startswith(PREFIX)


def _mac(key: bytes, tenant: str, data: str) -> str:
    message = _DOMAIN + tenant.encode() + b"\x00" + data.encode()
    return hmac.new(key, message, hashlib.sha256).hexdigest()[:_MAC_HEX]


def seal(key: bytes, tenant: str, payload: dict[str, Any]) -> str:
    data = base64.urlsafe_b64encode(orjson.dumps(payload, option=orjson.OPT_SORT_KEYS))
    text = data.decode().rstrip("=")
    return f"{PREFIX}{text}.{_mac(key, tenant, text)}"


def open_sealed(key: bytes, tenant: str, content: object) -> dict[str, Any] | None:
    """The payload of a reference sealed for this tenant with this key, else None."""
    if not is_sealed(content):
        return None
    assert isinstance(content, str)
    data, dot, mac = content[len(PREFIX) :].rpartition(".")
    if not dot or not hmac.compare_digest(mac.encode(), _mac(key, tenant, data).encode()):
        return None
    try:
        payload = orjson.loads(base64.urlsafe_b64decode(data + "=" * (-len(data) % 4)))
    except (binascii.Error, ValueError):
        return None
    return payload if isinstance(payload, dict) else None
