"""How many bytes two requests share at their start or at their end, at memcmp's speed.

An agent's next request repeats its previous one up to its newest turns, so the shared
start is most of a 1 MB body: compared a block at a time (one memcmp each), then the
differing block halved down to the byte; about 0.2 ms for 1 MB.
"""

from __future__ import annotations

BLOCK = 64 * 1024


def common_prefix(a: bytes, b: bytes) -> int:
    """The length of the longest start a and b share."""
    limit = min(len(a), len(b))
    at = 0
    view_a, view_b = memoryview(a), memoryview(b)
    while at < limit:
        end = min(at + BLOCK, limit)
        if view_a[at:end] != view_b[at:end]:
            return _first_difference(view_a, view_b, at, end)
        at = end
    return limit


def common_suffix(a: bytes, b: bytes, limit: int | None = None) -> int:
    """The length of the longest end a and b share, at most `limit` bytes."""
    most = min(len(a), len(b)) if limit is None else min(len(a), len(b), limit)
    view_a, view_b = memoryview(a), memoryview(b)
    done = 0
    while done < most:
        size = min(BLOCK, most - done)
        end_a, end_b = len(a) - done, len(b) - done
        if view_a[end_a - size : end_a] != view_b[end_b - size : end_b]:
            low, high = 0, size  # the shared part of this block is view[-low:] ... find it
            while low < high:
                mid = (low + high + 1) // 2
                if view_a[end_a - mid : end_a] == view_b[end_b - mid : end_b]:
                    low = mid
                else:
                    high = mid - 1
            return done + low
        done += size
    return most


def _first_difference(a: memoryview, b: memoryview, start: int, end: int) -> int:
    """Where a[start:end] and b[start:end], which differ, first differ."""
    low, high = start, end  # a[start:low] == b[start:low]; they differ before high
    while high - low > 1:
        mid = (low + high) // 2
        if a[low:mid] == b[low:mid]:
            low = mid
        else:
            high = mid
    return low
