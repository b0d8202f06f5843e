"""The AWS event stream (`application/vnd.amazon.eventstream`), sans I/O: bytes in,
messages out, and back.

A message is a 12-byte prelude (total length, headers length, the prelude's CRC32), its
headers (name, type, value), a payload, and the CRC32 of everything before it. Decoding
is botocore's own parser (what boto3 and the anthropic SDK read Bedrock's streams with),
so a frame this module accepts is one the clients accept. It is handed one message at a
time: its prelude first, checked before any more is awaited (a corrupt length never
makes the decoder wait for bytes that will not come), then exactly the rest of that
message, so botocore never holds, copies or rescans more than one message.

Encoding writes string headers only: every header Bedrock sends is one.
"""

from __future__ import annotations

import struct
import zlib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from botocore.eventstream import EventStreamBuffer, ParserError

PRELUDE = 12  # total length, headers length, prelude CRC: three big-endian uint32
_CRC = 4
_STRING = 7  # a header value's type: a UTF-8 string with a uint16 length
MAX_HEADERS = 128 * 1024  # botocore's limits, so nothing encoded here is refused there
MAX_PAYLOAD = 24 * 1024 * 1024
_HEADER_NAME_MAX = 255
_HEADER_VALUE_MAX = 32_767


class EventStreamError(ValueError):
    """Bytes that are not a valid event stream (a bad CRC, impossible lengths, headers
    that do not parse)."""


@dataclass(frozen=True, slots=True)
class Message:
    headers: Mapping[str, object]  # name -> str (strings), bytes, int, bool
    payload: bytes
    raw: bytes  # the message as it came, to relay unchanged

    def header(self, name: str) -> str:
        """A string header's value ("" when absent or not a string)."""
        value = self.headers.get(name)
        return value if isinstance(value, str) else ""


class EventStreamDecoder:
    def __init__(self) -> None:
        self._buffer = bytearray()  # the message being read (from its first byte) onwards
        self._parser = EventStreamBuffer()
        self._fed = 0  # bytes of the message handed to the parser
        self._total = 0  # the message's length, once its prelude is checked

    def feed(self, chunk: bytes) -> list[Message]:
        """The messages completed by `chunk`; raises EventStreamError on bad bytes."""
        buffer = self._buffer
        buffer += chunk
        messages: list[Message] = []
        start = 0  # where the message being read begins in the buffer
        while True:
            wanted = self._total or PRELUDE
            piece = bytes(buffer[start + self._fed : start + wanted])
            if not piece:
                break
            self._parser.add_data(piece)
            self._fed += len(piece)
            if self._fed < wanted:
                break
            if not self._total:
                self._total = _checked_prelude(bytes(buffer[start : start + PRELUDE]))
                self._next()  # the parser checks the prelude's CRC and waits for the rest
                continue
            parsed = self._next()
            if parsed is None:  # cannot happen: the parser has exactly one whole message
                raise EventStreamError("the event stream parser did not return a message")
            end = start + self._total
            messages.append(Message(parsed[0], parsed[1], bytes(buffer[start:end])))
            start, self._fed, self._total = end, 0, 0
        if start:
            del buffer[:start]
        return messages

    @property
    def pending(self) -> bool:
        """Whether part of a message has arrived without its end (a cut stream)."""
        return bool(self._buffer)

    @property
    def buffered(self) -> int:
        """Bytes held of the message being read."""
        return len(self._buffer)

    def _next(self) -> tuple[Mapping[str, object], bytes] | None:
        try:
            message = next(self._parser)
        except StopIteration:
            return None
        except (ParserError, struct.error, KeyError, IndexError, UnicodeDecodeError) as e:
            raise EventStreamError(f"not a valid event stream message: {e}") from None
        return message.headers, bytes(message.payload)


def _checked_prelude(prelude: bytes) -> int:
    """The message's total length, if its lengths can describe a message (the parser
    checks the CRC and its own maximums)."""
    total, headers = struct.unpack(">II", prelude[:8])
    if total < PRELUDE + _CRC or headers > total - PRELUDE - _CRC:
        raise EventStreamError(
            f"not a valid event stream message: length {total} with {headers} bytes of headers"
        )
    return int(total)


def encode_message(headers: Sequence[tuple[str, str]], payload: bytes) -> bytes:
    """One message with string headers, its prelude and message CRCs computed."""
    encoded = b"".join(_header(name, value) for name, value in headers)
    if len(encoded) > MAX_HEADERS:
        raise ValueError(f"event stream headers over {MAX_HEADERS} bytes")
    if len(payload) > MAX_PAYLOAD:
        raise ValueError(f"event stream payload over {MAX_PAYLOAD} bytes")
    total = PRELUDE + len(encoded) + len(payload) + _CRC
    lengths = struct.pack(">II", total, len(encoded))
    prelude = lengths + struct.pack(">I", zlib.crc32(lengths))
    crc = zlib.crc32(payload, zlib.crc32(encoded, zlib.crc32(prelude)))
    return prelude + encoded + payload + struct.pack(">I", crc)


def _header(name: str, value: str) -> bytes:
    key, text = name.encode(), value.encode()
    if not 0 < len(key) <= _HEADER_NAME_MAX:
        raise ValueError(f"an event stream header name is 1 to {_HEADER_NAME_MAX} bytes")
    if len(text) > _HEADER_VALUE_MAX:
        raise ValueError(f"an event stream header value is at most {_HEADER_VALUE_MAX} bytes")
    return bytes((len(key),)) + key + struct.pack(">BH", _STRING, len(text)) + text
