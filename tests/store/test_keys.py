"""Key naming: one cluster slot per conversation, no collisions, bad names rejected."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st
from redis.crc import key_slot

from proxy.store import keys

# Ids as callers supply them: hashes, UUIDs, session ids; anything without braces,
# whitespace (and, for the tenant, colons).
tenants = st.text(
    st.characters(blacklist_categories=("Cs",), blacklist_characters="{}:"), min_size=1
).filter(lambda s: not any(c.isspace() for c in s))
conversations = st.text(
    st.characters(blacklist_categories=("Cs",), blacklist_characters="{}"), min_size=1
).filter(lambda s: not any(c.isspace() for c in s))
kinds = st.sampled_from(["blob", "lock", "checkpoint", "summary"])
names = st.text(max_size=20)


def redis_hash_tag(key: str) -> str | None:
    """What Redis Cluster hashes: the text between the first '{' and the next '}'."""
    start = key.find("{")
    end = key.find("}", start + 1)
    if start == -1 or end == -1 or end == start + 1:
        return None
    return key[start + 1 : end]


@given(tenants, conversations, kinds, names)
def test_conversation_keys_carry_the_conversation_hash_tag(tenant, conversation, kind, name):
    key = keys.conversation_key("cp:", tenant, conversation, kind, name)
    assert redis_hash_tag(key) == f"{tenant}:{conversation}"
    assert key_slot(key.encode()) == key_slot(keys.hash_tag(tenant, conversation).encode())


@given(tenants, conversations, kinds, kinds, names, names)
def test_every_key_of_a_conversation_shares_one_slot(tenant, conversation, k1, k2, n1, n2):
    a = keys.conversation_key("cp:", tenant, conversation, k1, n1)
    b = keys.conversation_key("cp:", tenant, conversation, k2, n2)
    assert key_slot(a.encode()) == key_slot(b.encode())


@given(
    st.tuples(tenants, conversations, kinds, names),
    st.tuples(tenants, conversations, kinds, names),
)
def test_distinct_coordinates_never_share_a_key(a, b):
    key_a = keys.conversation_key("cp:", *a)
    key_b = keys.conversation_key("cp:", *b)
    assert (key_a == key_b) == (a == b)


@given(kinds, names, st.tuples(tenants, conversations, kinds, names))
def test_global_keys_never_equal_conversation_keys(kind, name, coordinates):
    assert keys.global_key("cp:", kind, name) != keys.conversation_key("cp:", *coordinates)


def test_colon_split_ambiguity_is_rejected():
    # "a:b" + "c" and "a" + "b:c" would both be {a:b:c}: a tenant may not hold a colon.
    with pytest.raises(ValueError, match="tenant"):
        keys.conversation_key("cp:", "a:b", "c", "blob", "r")
    assert keys.conversation_key("cp:", "a", "b:c", "blob", "r") == "cp:{a:b:c}:blob:r"


bad_parts = st.tuples(
    st.text(max_size=5),
    st.sampled_from(["{", "}", " ", "\t", "\n", "\u00a0", "\u2028"]),
    st.text(max_size=5),
).map("".join)


@given(bad_parts, conversations)
def test_bad_tenant_is_rejected(tenant, conversation):
    with pytest.raises(ValueError, match="tenant"):
        keys.conversation_key("cp:", tenant, conversation, "blob", "r")


@given(tenants, bad_parts)
def test_bad_conversation_is_rejected(tenant, conversation):
    with pytest.raises(ValueError, match="conversation"):
        keys.conversation_key("cp:", tenant, conversation, "blob", "r")


@pytest.mark.parametrize("kind", ["", "a:b", "a{b", "a b"])
def test_bad_kind_is_rejected(kind):
    with pytest.raises(ValueError, match="kind"):
        keys.conversation_key("cp:", "t", "c", kind, "r")
    with pytest.raises(ValueError, match="kind"):
        keys.global_key("cp:", kind, "r")


@pytest.mark.parametrize(("tenant", "conversation"), [("", "c"), ("t", "")])
def test_empty_ids_are_rejected(tenant, conversation):
    with pytest.raises(ValueError, match="empty"):
        keys.conversation_key("cp:", tenant, conversation, "blob", "r")


@pytest.mark.parametrize("prefix", ["cp{", "}x:", "a b"])
def test_prefix_with_braces_or_spaces_is_rejected(prefix):
    with pytest.raises(ValueError, match="prefix"):
        keys.check_prefix(prefix)


def test_scan_pattern_escapes_glob_characters():
    assert keys.scan_pattern("cp:[x]*?\\:") == "cp:\\[x\\]\\*\\?\\\\:*"
