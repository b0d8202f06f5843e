"""Who is asking and in which conversation, as ids safe to put in store keys.

The tenant is a keyed hash of the credential (never the credential itself:
docs/design.md#no-secrets-in-logs). The conversation id comes from what the client says,
in this order: the `x-conversation-id` header, Claude Code's `x-claude-code-session-id`,
Codex's `session-id`, a conversation id the body names (the `hint` of the format's
`IdentityView`: the Responses API's `prompt_cache_key`), the session id Claude Code puts
inside `metadata.user_id` (a JSON string), and otherwise a hash of the tenant, the
system prompt and the first message, which stay fixed as a conversation grows. Every id
is hashed again, so keys never hold client text. Ids are store keys on every replica and
across releases: their bytes never change (tests/core/test_identity_vectors.py).
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping
from typing import Any

import orjson

from proxy.core.wire_format import IdentityView, Request

_TENANT_KEY = b"compaction-proxy/tenant/v1"
_CONVERSATION_KEY = b"compaction-proxy/conversation/v1"


def credential(headers: Mapping[str, str]) -> str:
    """The credential the client sent: x-api-key (Gemini's x-goog-api-key), else the
    bearer token, else (an AWS SigV4 signature, new on every request) the access key id
    it names, else ""."""
    key = headers.get("x-api-key") or headers.get("x-goog-api-key")
    if key:
        return key.strip()
    auth = headers.get("authorization", "")
    scheme, _, token = auth.partition(" ")
    if scheme == "AWS4-HMAC-SHA256":
        signed = token.strip().removeprefix("Credential=")
        return "aws:" + signed.partition("/")[0] if signed != token.strip() else auth.strip()
    return token.strip() if scheme.lower() == "bearer" else auth.strip()


# Tenants by credential, made once: a request asks for its tenant in several steps, and
# an agent sends the same credential with every request (bounded: emptied when full).
_TENANTS: dict[str, str] = {}
TENANTS_KEPT = 4096


def tenant_of(headers: Mapping[str, str]) -> str:
    secret = credential(headers)
    tenant = _TENANTS.get(secret)
    if tenant is None:
        digest = hashlib.blake2b(secret.encode(), key=_TENANT_KEY, digest_size=10)
        tenant = "t" + digest.hexdigest()
        if len(_TENANTS) >= TENANTS_KEPT:
            _TENANTS.clear()
        _TENANTS[secret] = tenant
    return tenant


def conversation_of(headers: Mapping[str, str], view: IdentityView, tenant: str) -> str:
    source = _client_id(headers, view)
    if source is None:
        source = "h:" + orjson.dumps([tenant, view.lead, view.first]).decode()
    digest = hashlib.blake2b(source.encode(), key=_CONVERSATION_KEY, digest_size=12)
    return "c" + digest.hexdigest()


def identities(
    wire: Request, body: Mapping[str, Any], headers: Mapping[str, str], tenant: str
) -> tuple[str, str]:
    """A request's tenant (a proxy key's, else `tenant_of` its credential) and its
    conversation, from the format's view of the body: asked for only when a request is
    to be compacted (a load or a summary needs them)."""
    return tenant, conversation_of(headers, wire.identity_view(body), tenant)


def header_id(headers: Mapping[str, str]) -> str | None:
    """The conversation id a client sends in a header, if any."""
    for name in ("x-conversation-id", "x-claude-code-session-id", "session-id"):
        value = headers.get(name)
        if value:
            return f"{name}:{value}"
    return None


def _client_id(headers: Mapping[str, str], view: IdentityView) -> str | None:
    found = header_id(headers)
    if found is not None:
        return found
    if view.hint:
        return f"hint:{view.hint}"
    metadata = view.metadata
    user_id = metadata.get("user_id") if isinstance(metadata, dict) else None
    if isinstance(user_id, str) and user_id.startswith("{"):
        try:
            session = orjson.loads(user_id).get("session_id")
        except (orjson.JSONDecodeError, AttributeError):
            return None
        if isinstance(session, str) and session:
            return f"session:{session}"
    return None
