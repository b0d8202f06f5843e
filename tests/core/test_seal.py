"""Sealed references: only the fleet's key makes one, only its tenant opens it."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from proxy.core.seal import PREFIX, is_sealed, open_sealed, seal

KEY = b"k" * 32
PAYLOAD = {"c": "c0123", "k": "ab" * 16, "n": 12}


def test_a_sealed_reference_opens_for_its_tenant() -> None:
    sealed = seal(KEY, "t1", PAYLOAD)
    assert sealed.startswith(PREFIX) and is_sealed(sealed)
    assert open_sealed(KEY, "t1", sealed) == PAYLOAD


def test_another_tenant_another_key_or_a_change_open_nothing() -> None:
    sealed = seal(KEY, "t1", PAYLOAD)
    assert open_sealed(KEY, "t2", sealed) is None
    assert open_sealed(b"x" * 32, "t1", sealed) is None
    data, mac = sealed[len(PREFIX) :].rsplit(".", 1)
    forged = seal(KEY, "t1", {**PAYLOAD, "c": "other"})
    assert open_sealed(KEY, "t1", f"{PREFIX}{forged.split('.')[1]}.{mac}") is None
    assert open_sealed(KEY, "t1", f"{PREFIX}{data}.{'0' * len(mac)}") is None
    assert open_sealed(KEY, "t1", "gAAAAB-openai-content") is None
    assert open_sealed(KEY, "t1", None) is None


@given(st.text(min_size=1, max_size=40), st.binary(min_size=1, max_size=200))
def test_garbage_never_opens_and_never_raises(tenant: str, noise: bytes) -> None:
    assert open_sealed(KEY, tenant, PREFIX + noise.decode("latin-1")) is None
