"""Image dimensions from file headers, as built by hand from each format's layout."""

from __future__ import annotations

import base64
import struct

import pytest

from proxy.core.image_size import dimensions, dimensions_from_base64
from tests.core.test_tokens import png

JPEG = (
    b"\xff\xd8"  # start of image
    + b"\xff\xe0"
    + struct.pack(">H", 16)
    + b"JFIF\x00\x01\x01\x00\x00\x01\x00\x01\x00\x00"
    + b"\xff\xe1"
    + struct.pack(">H", 2 + 4000)
    + b"Exif"
    + b"\x00" * 3996  # a big APP1
    + b"\xff\xdb"
    + struct.pack(">H", 67)
    + b"\x00" * 65  # a quantisation table
    + b"\xff\xc2"
    + struct.pack(">HBHHB", 17, 8, 480, 640, 3)
    + b"\x00" * 9  # progressive SOF
)
WEBP_LOSSY = (
    b"RIFF\x00\x00\x00\x00WEBPVP8 \x00\x00\x00\x00"
    + b"\x9d\x01\x2a"
    + b"\x00" * 3
    + struct.pack("<HH", 320, 200)
)
WEBP_LOSSLESS = b"RIFF\x00\x00\x00\x00WEBPVP8L\x00\x00\x00\x00\x2f" + (
    (320 - 1) | ((200 - 1) << 14)
).to_bytes(4, "little")
WEBP_EXTENDED = (
    b"RIFF\x00\x00\x00\x00WEBPVP8X\x0a\x00\x00\x00"
    + b"\x00" * 4
    + (4000 - 1).to_bytes(3, "little")
    + (3000 - 1).to_bytes(3, "little")
)


@pytest.mark.parametrize(
    ("head", "size"),
    [
        (base64.b64decode(png(1234, 567)), (1234, 567)),
        (b"GIF89a" + struct.pack("<HH", 800, 600) + b"\x00" * 10, (800, 600)),
        (b"GIF87a" + struct.pack("<HH", 1, 1), (1, 1)),
        (JPEG, (640, 480)),
        (WEBP_LOSSY, (320, 200)),
        (WEBP_LOSSLESS, (320, 200)),
        (WEBP_EXTENDED, (4000, 3000)),
    ],
    ids=["png", "gif89a", "gif87a", "jpeg", "webp-lossy", "webp-lossless", "webp-extended"],
)
def test_known_formats(head: bytes, size: tuple[int, int]) -> None:
    assert dimensions(head) == size
    assert dimensions_from_base64(base64.b64encode(head).decode()) == size


@pytest.mark.parametrize(
    "head",
    [
        b"",
        b"not an image at all",
        b"\x89PNG\r\n\x1a\n\x00",  # truncated
        b"GIF89a" + b"\x00" * 10,  # zero size
        b"\xff\xd8\xff\xe0\x00\x10",  # JPEG cut before its frame header
        b"\xff\xd8\x00\x00\x00\x00\x00\x00\x00\x00\x00",  # not a marker where one must be
        b"RIFF\x00\x00\x00\x00WEBPXXXX" + b"\x00" * 20,
    ],
)
def test_unknown_or_broken_headers_give_none(head: bytes) -> None:
    assert dimensions(head) is None


def test_invalid_base64_gives_none() -> None:
    assert dimensions_from_base64("%%%%") is None
    assert dimensions_from_base64("abc") is None


def test_a_frame_header_beyond_the_bounded_prefix_is_not_searched_for() -> None:
    far = b"\xff\xd8" + (b"\xff\xe1" + struct.pack(">H", 65535) + b"\x00" * 65533) * 2 + JPEG[2:]
    assert dimensions_from_base64(base64.b64encode(far).decode()) is None
