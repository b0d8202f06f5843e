"""Redis key names: pure string functions, no I/O.

A conversation's keys are ``{prefix}{tenant:conversation}:{kind}:{name}``. The part in
braces is a Redis Cluster hash tag, so every key of one conversation lands on one slot
and multi-key operations and scripts stay legal on a cluster. Global (not per
conversation) keys are ``{prefix}g:{kind}:{name}``; they start with ``g:`` rather than
``{`` so they can never equal a conversation key.

Offloaded results are stored once per tenant, named by their ref (a hash of their
content), whichever conversations name them: ``{prefix}{tenant/b}:blob:{ref}``, where
``b`` is one of 16 buckets drawn from a hash of the ref. The buckets spread one tenant's
blobs over 16 slots, so a tenant with a big fleet does not pile all of its blobs on one
Cluster shard, while a crossing's writes still reach at most 16 slots. A blob tag holds
``/`` and never ``:``, a conversation tag always ``:``, so the two never meet.

The names are injective: the tenant and the kind contain no ``:``, the conversation
contains no ``}``, so a key splits back into exactly one (tenant, conversation, kind,
name). Collisions between tenants would break isolation (docs/design.md#tenants-are-isolated).
"""

from __future__ import annotations

import hashlib
import re

# Kinds used by the store itself; callers choose their own for other JSON values.
BLOB = "blob"
LOCK = "lock"
CHECKPOINT = "checkpoint"  # (before lines: one checkpoint per root; no longer written)
SUMMARY = "summary"
PREPARED = "prepared"  # (before lines: a root's one note of a summary made ahead)
# A root's lines (proxy/core/lines.py): one hash holding every line's checkpoint and
# clock and every note of a summary made ahead, read in one HGETALL.
LINES = "lines"

_WHITESPACE = re.compile(r"\s")
# What a label may be, per set of characters it must not hold: one compiled match per
# key (no per-character loop for the names every Redis command is addressed by); the
# reason a name is refused is worked out only when it is (`_check`).
_TENANT = re.compile(r"[^\s{}:]+")
_CONVERSATION = re.compile(r"[^\s{}]+")
_BLOB_TENANT = re.compile(r"[^\s{}:/]+")
_KIND = _TENANT


def _check(label: str, value: str, forbidden: str) -> None:
    if not value:
        raise ValueError(f"{label} must not be empty")
    if _WHITESPACE.search(value):
        raise ValueError(f"{label} must not contain whitespace: {value!r}")
    bad = sorted({c for c in value if c in forbidden})
    if bad:
        raise ValueError(f"{label} must not contain {''.join(bad)!r}: {value!r}")


def check_prefix(prefix: str) -> str:
    """A prefix may be empty but must not hold braces (they would move the hash tag)."""
    if "{" in prefix or "}" in prefix or _WHITESPACE.search(prefix):
        raise ValueError(f"key prefix must not contain braces or whitespace: {prefix!r}")
    return prefix


def hash_tag(tenant: str, conversation: str) -> str:
    """The text Redis Cluster hashes for every key of this conversation."""
    if _TENANT.fullmatch(tenant) is None or _CONVERSATION.fullmatch(conversation) is None:
        _check("tenant", tenant, "{}:")
        _check("conversation", conversation, "{}")
    return f"{tenant}:{conversation}"


def conversation_key(prefix: str, tenant: str, conversation: str, kind: str, name: str) -> str:
    if (
        _KIND.fullmatch(kind) is None
        or _TENANT.fullmatch(tenant) is None
        or _CONVERSATION.fullmatch(conversation) is None
    ):
        _check("kind", kind, "{}:")
        _check("tenant", tenant, "{}:")
        _check("conversation", conversation, "{}")
    return f"{prefix}{{{tenant}:{conversation}}}:{kind}:{name}"  # (hash_tag's tag)


BLOB_BUCKETS = 16


def blob_key(prefix: str, tenant: str, ref: str) -> str:
    """Where a tenant's blob lives, shared by all of its conversations."""
    if _BLOB_TENANT.fullmatch(tenant) is None:
        _check("tenant", tenant, "{}:/")
    bucket = hashlib.blake2b(ref.encode(), digest_size=1).digest()[0] % BLOB_BUCKETS
    return f"{prefix}{{{tenant}/{bucket:x}}}:blob:{ref}"


def global_key(prefix: str, kind: str, name: str) -> str:
    if _KIND.fullmatch(kind) is None:
        _check("kind", kind, "{}:")
    return f"{prefix}g:{kind}:{name}"


def scan_pattern(prefix: str) -> str:
    """A SCAN MATCH pattern for every key under ``prefix``, glob characters escaped."""
    return re.sub(r"([*?\[\]\\])", r"\\\1", prefix) + "*"
