"""What a rewrite did to a history: its strategy, one of a closed set.

The values are public words: the `x-compaction-strategy` header, the metric label
`strategy`, the request log line and the checkpoint's stored `strategy` field all carry
them as they are, so a member's value never changes (a checkpoint written by an earlier
release must decode: proxy/core/checkpoint.py). Being a `StrEnum`, a member is also the
string it stands for.
"""

from __future__ import annotations

from enum import StrEnum


class Strategy(StrEnum):
    CHECKPOINT = "checkpoint"  # a frozen rewrite reapplied: no crossing
    OFFLOAD = "offload"  # large results became stubs
    PACK = "pack"  # the oldest groups dropped, with a note
    OFFLOAD_PACK = "offload+pack"
    SUMMARY = "summary"  # the oldest groups folded into a summary
    OFFLOAD_SUMMARY = "offload+summary"

    @staticmethod
    def packing(offloaded: bool) -> Strategy:
        return Strategy.OFFLOAD_PACK if offloaded else Strategy.PACK

    @staticmethod
    def summarising(offloaded: bool) -> Strategy:
        return Strategy.OFFLOAD_SUMMARY if offloaded else Strategy.SUMMARY

    @property
    def crossing(self) -> bool:
        """A new rewrite was made (not one reapplied)."""
        return self is not Strategy.CHECKPOINT

    @property
    def summarised(self) -> bool:
        return self in (Strategy.SUMMARY, Strategy.OFFLOAD_SUMMARY)

    @property
    def packed(self) -> bool:
        return self in (Strategy.PACK, Strategy.OFFLOAD_PACK)

    @property
    def folded(self) -> bool:
        """The history was brought down to the target (summarised or packed)."""
        return self.summarised or self.packed


def strategy_word(strategy: Strategy | None, refused: bool) -> str:
    """What compaction did, in the words of the log line, the metrics and the admin stats:
    the rewrite's strategy, "refuse" (nothing fitted the window), or "" (untouched)."""
    if refused:
        return "refuse"
    return strategy.value if strategy is not None else ""
