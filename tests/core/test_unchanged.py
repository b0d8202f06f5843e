"""unchanged.common_prefix / common_suffix equal the byte-by-byte answer, across blocks."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from proxy.core import unchanged
from proxy.core.unchanged import common_prefix, common_suffix


def _naive_prefix(a: bytes, b: bytes) -> int:
    n = 0
    while n < min(len(a), len(b)) and a[n] == b[n]:
        n += 1
    return n


def _naive_suffix(a: bytes, b: bytes, limit: int) -> int:
    return min(limit, _naive_prefix(a[::-1], b[::-1]))


@given(st.binary(max_size=300), st.binary(max_size=40), st.binary(max_size=40), st.integers(0, 400))
def test_equal_to_the_byte_by_byte_answer(shared: bytes, a: bytes, b: bytes, limit: int) -> None:
    first, second = shared + a, shared + b
    assert common_prefix(first, second) == _naive_prefix(first, second)
    first, second = a + shared, b + shared
    most = min(len(first), len(second), limit)
    assert common_suffix(first, second, limit) == _naive_suffix(first, second, most)
    assert common_suffix(first, second) == _naive_suffix(first, second, len(first) + len(second))


def test_across_blocks() -> None:
    """A difference blocks away from the start or the end is found to the byte."""
    size = 3 * unchanged.BLOCK + 123
    base = bytes(range(256)) * (size // 256 + 1)
    for at in (0, 1, unchanged.BLOCK - 1, unchanged.BLOCK, 2 * unchanged.BLOCK + 77, size - 1):
        changed = bytearray(base[:size])
        changed[at] ^= 0xFF
        assert common_prefix(base[:size], bytes(changed)) == at
        assert common_suffix(base[:size], bytes(changed)) == size - 1 - at
    assert common_prefix(base[:size], base[:size]) == size
    assert common_prefix(base[:size], base[: size - 5]) == size - 5
