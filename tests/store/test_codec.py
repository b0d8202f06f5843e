"""The stored form of values: any bytes come back unchanged, unmarked values read as is."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from proxy.store.codec import MARK, CorruptValue, pack, unpack


@given(st.binary(max_size=4096))
def test_any_bytes_come_back(data: bytes) -> None:
    stored = pack(data)
    assert stored[0] == MARK
    assert unpack(stored) == data
    assert len(stored) <= len(data) + 2  # never more than the mark


@given(st.text(max_size=2000))
def test_text_without_a_mark_is_its_own_value(text: str) -> None:
    # UTF-8 never holds 0xFF: values written before the mark existed read unchanged.
    assert unpack(text.encode()) == text.encode()


def test_repetitive_output_shrinks() -> None:
    log = "".join(f"2026-11-29T10:00:{i % 60:02d}Z INFO step={i} ok\n" for i in range(2000))
    assert len(pack(log.encode())) < 0.1 * len(log)


@pytest.mark.parametrize("value", [b"\xff", b"\xffq", b"\xffznot zstd"])
def test_a_broken_mark_is_an_error(value: bytes) -> None:
    with pytest.raises(CorruptValue):
        unpack(value)
