"""How values are laid out in Redis: a codec mark, then the (maybe compressed) bytes.

A marked value is ``0xFF``, one byte naming the codec, then the payload:

    0xFF 'z' <zstd frame>   compressed with Zstandard (level 3)
    0xFF 'r' <bytes>        stored as is (small, or compression did not pay)

0xFF never occurs in UTF-8 text or in JSON, so a value without the mark is read as it
is: plain text or JSON written before values were compressed stays readable, and a new
codec only needs a new letter. Zstandard level 3 was picked by measurement on agent
output (bench/codec.py, bench/RESULTS.md): the same size as zlib level 6 (0.20x of the
raw text) at six times its compression speed and three times its decompression speed.
"""

from __future__ import annotations

import threading
from collections.abc import Sequence

import zstandard

MARK = 0xFF
ZSTD = ord("z")
RAW = ord("r")
LEVEL = 3
# Below this a zstd frame (about 10 bytes of header) rarely pays for itself.
MIN_COMPRESS = 128

# zstandard's (de)compressor objects must not be shared between threads, and large
# values are packed in worker threads: one pair per thread.
_local = threading.local()


def _codecs() -> tuple[zstandard.ZstdCompressor, zstandard.ZstdDecompressor]:
    pair: tuple[zstandard.ZstdCompressor, zstandard.ZstdDecompressor] | None = getattr(
        _local, "pair", None
    )
    if pair is None:
        pair = _local.pair = (zstandard.ZstdCompressor(level=LEVEL), zstandard.ZstdDecompressor())
    return pair


class CorruptValue(ValueError):
    """A marked value whose codec is unknown or whose payload does not decode."""


def pack(data: bytes) -> bytes:
    """The stored form of ``data``: compressed when that makes it smaller."""
    if len(data) >= MIN_COMPRESS:
        # The frame records the content size, so unpacking allocates once.
        small = _codecs()[0].compress(data)
        if len(small) < len(data):
            return bytes((MARK, ZSTD)) + small
    return bytes((MARK, RAW)) + data


def pack_texts(texts: Sequence[str]) -> list[bytes]:
    """The stored forms of several texts (a crossing's blobs, packed in one call)."""
    return [pack(text.encode()) for text in texts]


def unpack(value: bytes) -> bytes:
    """The original bytes of a stored value (an unmarked value is its own original)."""
    if not value or value[0] != MARK:
        return value
    codec = value[1] if len(value) > 1 else -1
    if codec == RAW:
        return value[2:]
    if codec == ZSTD:
        try:
            return _codecs()[1].decompress(value[2:])
        except zstandard.ZstdError as error:
            raise CorruptValue(f"zstd payload does not decode: {error}") from error
    raise CorruptValue(f"unknown codec mark {codec!r}")
