"""What the compaction executor reads and writes in one Redis round trip each.

``Store.load_conversation`` answers with a ``ConversationState``; ``Store.save_crossing``
with a ``CrossingSaved`` that says which of a crossing's writes landed. On a single Redis
a crossing is one script (``SAVE_CROSSING``, its keys and arguments built here from plain
data by ``CrossingWrite``): one command to send and one reply to parse instead of a
MULTI/EXEC pipeline's every command and its QUEUED reply (most of the client's CPU for a
crossing's write), and just as atomic.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

# A crossing's write may take longer than a single small call: allow the store's own
# timeout twice, plus time for every command and every byte on a loaded machine
# (a single Redis does far better: ~100k commands/s, hundreds of MB/s on loopback).
SECONDS_PER_COMMAND = 0.002
BYTES_PER_SECOND = 5_000_000
MAX_CROSSING_SECONDS = 30.0


def crossing_timeout(op_timeout: float, commands: int, payload: int) -> float:
    """Seconds one crossing's pipelined write may take."""
    sized = 2 * op_timeout + commands * SECONDS_PER_COMMAND + payload / BYTES_PER_SECOND
    return min(MAX_CROSSING_SECONDS, max(op_timeout, sized))


# A crossing's writes on a single Redis, atomically: the blobs, the checkpoint (a line of
# the root's hash and its clock), the summary, then a fresh TTL on the refs kept (their
# replies: 0 for a blob that is gone), the evicted fields taken out, the hash's TTL.
# The writes that may grow memory come first: Redis refuses a script's first such write
# when it is out of memory (and only the first, to keep the script atomic), so either
# everything is written or nothing is (the error is the script's reply: "OOM ...").
# KEYS: the blobs' keys, the kept refs' keys, the root's hash, the summary's key (if any).
# ARGV: ttl, blobs, kept refs, line, clock, checkpoint ("": none), summary ("": none),
# the blobs' values, the fields to take out of the hash.
SAVE_CROSSING = """
local ttl, nb, nk = ARGV[1], tonumber(ARGV[2]), tonumber(ARGV[3])
local lines, rest = KEYS[nb + nk + 1], 8 + nb
local writes = {}
for i = 1, nb do writes[#writes + 1] = {'SET', KEYS[i], ARGV[7 + i], 'EX', ttl} end
if ARGV[6] ~= '' then
  writes[#writes + 1] = {'HSET', lines, 'c:' .. ARGV[4], ARGV[6], 'u:' .. ARGV[4], ARGV[5]}
end
if ARGV[7] ~= '' then writes[#writes + 1] = {'SET', KEYS[nb + nk + 2], ARGV[7], 'EX', ttl} end
for _, command in ipairs(writes) do
  local reply = redis.pcall(unpack(command))
  if type(reply) == 'table' and reply.err then
    -- Redis 6 puts where in the script before the error's code: the reply keeps the code
    return redis.error_reply((string.gsub(reply.err, '^@user_script: %d+: %-', '')))
  end
end
local found = {}
for i = 1, nk do found[i] = redis.call('EXPIRE', KEYS[nb + i], ttl) end
if #ARGV >= rest then redis.call('HDEL', lines, unpack(ARGV, rest)) end
if ARGV[6] ~= '' or #ARGV >= rest then redis.call('EXPIRE', lines, ttl) end
return found
"""


@dataclass(frozen=True, slots=True)
class CrossingWrite:
    """One crossing's writes as plain data: what SAVE_CROSSING is called with."""

    ttl: int
    blobs: Sequence[tuple[str, bytes]]  # (key, packed value)
    kept: Sequence[str]  # keys of the blobs whose TTL is renewed
    lines: str  # the root's hash
    line: str  # the checkpoint's line
    used: int  # ... and its clock
    checkpoint: bytes | None  # encoded
    summary: tuple[str, bytes] | None  # (key, encoded text)
    gone: Sequence[str]  # fields taken out of the hash

    @property
    def payload(self) -> int:
        """Bytes of values written (the write's timeout grows with them)."""
        size = sum(len(value) for _, value in self.blobs) + len(self.checkpoint or b"")
        return size + (len(self.summary[1]) if self.summary is not None else 0)

    def keys(self) -> list[str]:
        found = [key for key, _ in self.blobs]
        found += self.kept
        found.append(self.lines)
        if self.summary is not None:
            found.append(self.summary[0])
        return found

    def args(self) -> list[str | int | bytes]:
        args: list[str | int | bytes] = [self.ttl, len(self.blobs), len(self.kept)]
        args += [self.line, self.used, self.checkpoint or b""]
        args.append(self.summary[1] if self.summary is not None else b"")
        args += [value for _, value in self.blobs]
        args += self.gone
        return args


LINE_MEMO_SIZE = 2048  # decoded lines at most
# ... and their stored bytes at most: a decoded checkpoint takes about 11 times its stored
# (compressed) bytes (46 segments: 665 bytes stored, 7 KB decoded), so about 12 MB.
LINE_MEMO_BYTES = 1024 * 1024


class LineMemo:
    """Lines decoded before, by their stored bytes and the decoder: a conversation's
    next request reads the same lines again (all but the one its last crossing wrote),
    and decoding a checkpoint's segments costs more than the round trip's parsing. What
    the decoder returns is shared by every request: it must be immutable. A plain memo:
    the store decodes what it does not find here and keeps it (`put`)."""

    def __init__(self, size: int = LINE_MEMO_SIZE, stored: int = LINE_MEMO_BYTES) -> None:
        self._size, self._stored = size, stored
        self._bytes = 0
        self._decoded: dict[tuple[Callable[[Any], object], bytes], object] = {}

    def get(self, raw: bytes, decode: Callable[[Any], object]) -> object:
        """What `decode` made of these stored bytes before, or MISSING."""
        return self._decoded.get((decode, raw), MISSING)

    def put(self, raw: bytes, decode: Callable[[Any], object], decoded: object) -> None:
        """Keep what `decode` made of these stored bytes, within the memo's bounds."""
        if len(raw) > self._stored:
            return  # too large to keep
        if len(self._decoded) >= self._size or self._bytes + len(raw) > self._stored:
            # A bound, not a policy: the next requests refill it.
            self._decoded.clear()
            self._bytes = 0
        self._decoded[(decode, raw)] = decoded
        self._bytes += len(raw)


MISSING = object()  # LineMemo.get: not decoded before


@dataclass(frozen=True, slots=True)
class ConversationState:
    """A conversation's stored state for one request, read in one round trip.

    lines: every line of the request's root: (its checkpoint, decoded JSON object or what
      the load's decoder made of it; its logical clock), most recently used first.
    summaries: of the summary keys asked for, those stored (key -> text).
    notes: the root's notes of summaries made ahead (decoded JSON).
    """

    lines: tuple[tuple[Any, int], ...] = ()
    summaries: Mapping[str, str] = field(default_factory=dict)
    notes: tuple[object, ...] = ()

    @property
    def checkpoint(self) -> Any:
        """The most recently used line's checkpoint (None: the root has none)."""
        return self.lines[0][0] if self.lines else None


@dataclass(frozen=True, slots=True)
class CrossingSaved:
    """Which of a crossing's writes are stored.

    blobs: every blob was written (True when there were none).
    checkpoint: the checkpoint is stored, and so (at that moment) is every blob it names
      (True when there was none to store). A checkpoint whose blobs failed is not kept.
    summary: the summary is stored (True when there was none).
    lost: refs to refresh whose blobs no longer exist (evicted or expired): stubs that
      name them read as "no longer available".
    error: what went wrong, for the log's reason ("" when nothing did).
    """

    blobs: bool
    checkpoint: bool
    summary: bool
    lost: tuple[str, ...] = ()
    error: str = ""

    @property
    def complete(self) -> bool:
        return self.blobs and self.checkpoint and self.summary and not self.error


def failed(error: str, *, blobs: bool, checkpoint: bool, summary: bool) -> CrossingSaved:
    """Nothing that was to be written is known to be stored."""
    return CrossingSaved(not blobs, not checkpoint, not summary, error=error)
