"""Width and height of an image from the first bytes of its file (PNG, GIF, WebP, JPEG).

Requests carry images as base64 without their size, but the size is in the file header,
and Anthropic prices an image by its pixels. Only a bounded prefix is decoded, so a huge
image costs no more than a small one; anything unrecognised gives None.
"""

from __future__ import annotations

import base64
import binascii

# JPEG headers can be preceded by EXIF/ICC segments with thumbnails; 64 KiB covers the
# usual ones. Beyond that we fall back to a size-based estimate rather than decode more.
HEAD_BYTES = 64 * 1024

_JPEG_SOF = frozenset(range(0xC0, 0xD0)) - {0xC4, 0xC8, 0xCC}  # start-of-frame markers
_JPEG_NO_LENGTH = frozenset(range(0xD0, 0xDA)) | {0x01}  # markers without a length field


def dimensions_from_base64(data: str) -> tuple[int, int] | None:
    """(width, height) of a base64-encoded image, or None if its header is not understood."""
    prefix = data[: HEAD_BYTES * 4 // 3 // 4 * 4]
    try:
        head = base64.b64decode(prefix, validate=False)
    except (binascii.Error, ValueError):
        return None
    return dimensions(head)


def dimensions(head: bytes) -> tuple[int, int] | None:
    """(width, height) from the start of an image file, or None."""
    if head.startswith(b"\x89PNG\r\n\x1a\n") and len(head) >= 24:
        return _positive(_be(head, 16, 4), _be(head, 20, 4))
    if head[:6] in (b"GIF87a", b"GIF89a") and len(head) >= 10:
        return _positive(_le(head, 6, 2), _le(head, 8, 2))
    if head[:4] == b"RIFF" and head[8:12] == b"WEBP":
        return _webp(head)
    if head[:2] == b"\xff\xd8":
        return _jpeg(head)
    return None


def _webp(head: bytes) -> tuple[int, int] | None:
    chunk = head[12:16]
    if chunk == b"VP8 " and len(head) >= 30:
        return _positive(_le(head, 26, 2) & 0x3FFF, _le(head, 28, 2) & 0x3FFF)
    if chunk == b"VP8L" and len(head) >= 25:
        b0, b1, b2, b3 = head[21:25]
        width = 1 + (((b1 & 0x3F) << 8) | b0)
        height = 1 + (((b3 & 0x0F) << 10) | (b2 << 2) | ((b1 & 0xC0) >> 6))
        return width, height
    if chunk == b"VP8X" and len(head) >= 30:
        return 1 + _le(head, 24, 3), 1 + _le(head, 27, 3)
    return None


def _jpeg(head: bytes) -> tuple[int, int] | None:
    i = 2
    while i + 9 <= len(head):
        if head[i] != 0xFF:
            return None
        marker = head[i + 1]
        if marker == 0xFF:  # fill byte
            i += 1
        elif marker in _JPEG_NO_LENGTH:
            i += 2
        elif marker in _JPEG_SOF:
            return _positive(_be(head, i + 7, 2), _be(head, i + 5, 2))
        else:
            i += 2 + _be(head, i + 2, 2)
    return None


def _be(data: bytes, at: int, size: int) -> int:
    return int.from_bytes(data[at : at + size], "big")


def _le(data: bytes, at: int, size: int) -> int:
    return int.from_bytes(data[at : at + size], "little")


def _positive(width: int, height: int) -> tuple[int, int] | None:
    return (width, height) if width > 0 and height > 0 else None
