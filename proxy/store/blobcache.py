"""A small per-replica cache of blob texts, most recently used kept.

A model reads an offloaded result slice after slice (one read_result round each), often
right after the crossing that stored it; keeping the texts a replica just wrote or read
saves a Redis round trip and a decompression per slice. Blobs are named by their content,
so a cached text is never stale: one that Redis has since evicted may still be served by
the replica that holds it, which is no worse than reading it a moment earlier.
"""

from __future__ import annotations

from collections import OrderedDict

DEFAULT_CHARS = 16 * 1024 * 1024


class BlobCache:
    def __init__(self, max_chars: int = DEFAULT_CHARS) -> None:
        self.max_chars = max_chars
        self._texts: OrderedDict[tuple[str, str], str] = OrderedDict()
        self._chars = 0

    def get(self, tenant: str, ref: str) -> str | None:
        text = self._texts.get((tenant, ref))
        if text is not None:
            self._texts.move_to_end((tenant, ref))
        return text

    def clear(self) -> None:
        self._texts.clear()
        self._chars = 0

    def put(self, tenant: str, ref: str, text: str) -> None:
        if len(text) > self.max_chars // 4:  # one huge result would flush all the others
            return
        old = self._texts.pop((tenant, ref), None)
        if old is not None:
            self._chars -= len(old)
        self._texts[(tenant, ref)] = text
        self._chars += len(text)
        while self._chars > self.max_chars:
            _, dropped = self._texts.popitem(last=False)
            self._chars -= len(dropped)
