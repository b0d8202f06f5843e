"""Request bodies sent with `Content-Encoding`, decoded for inspection only, bomb-safe.

The proxy forwards a body as it was sent; it decodes one only to read what budgets need
(the model, the output cap, the input to estimate). Decoding stops once the output would
pass the body limit, however small the input, so a few kilobytes that inflate to
gigabytes cost at most the limit. An encoding the proxy cannot decode (br, zstd, an
unknown one) or a corrupt body gives None: the caller forwards it uninspected, or
refuses it when a budget must see it.
"""

from __future__ import annotations

import zlib
from collections.abc import Iterable

_CHUNK = 64 * 1024
# zlib wbits: gzip framing, zlib framing, raw deflate (some clients send raw "deflate").
_GZIP, _ZLIB, _RAW = 16 + zlib.MAX_WBITS, zlib.MAX_WBITS, -zlib.MAX_WBITS
DECODERS = {"gzip": (_GZIP,), "x-gzip": (_GZIP,), "deflate": (_ZLIB, _RAW)}


class TooLarge(Exception):
    """The decoded body would pass the limit."""


def encodings(values: Iterable[str]) -> list[str]:
    """The codings applied to the body, in the order they were applied, from the values
    of its Content-Encoding headers. An empty header, or one naming only `identity`,
    means none: such a body is read like any other."""
    raw = ",".join(values)
    return [c for c in (p.strip().lower() for p in raw.split(",")) if c and c != "identity"]


def _inflate(data: bytes, wbits: int, limit: int) -> bytes:
    out: list[bytes] = []
    size = 0
    while True:  # a gzip body may hold several members, one after another
        inflater = zlib.decompressobj(wbits)
        pending = data
        while True:
            piece = inflater.decompress(pending, _CHUNK)
            size += len(piece)
            if size > limit:
                raise TooLarge
            out.append(piece)
            pending = inflater.unconsumed_tail
            if not pending and len(piece) < _CHUNK:
                break
        tail = inflater.flush()  # at most what a last match still holds
        size += len(tail)
        if size > limit:
            raise TooLarge
        out.append(tail)
        if not inflater.eof:
            raise zlib.error("the compressed body is cut short")
        data = inflater.unused_data
        if not data:
            return b"".join(out)
        if wbits != _GZIP:
            raise zlib.error("data after the end of the compressed body")


def decode(body: bytes, codings: list[str], limit: int) -> bytes | None:
    """The body with `codings` undone (the last applied first), at most `limit` bytes
    (TooLarge past it); None when a coding is unknown or the data is corrupt."""
    for coding in reversed(codings):
        choices = DECODERS.get(coding)
        if choices is None:
            return None
        for wbits in choices:
            try:
                body = _inflate(body, wbits, limit)
                break
            except zlib.error:
                continue
        else:
            return None
    return body
