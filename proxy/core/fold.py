"""Plan a compaction: which turns to fold into a summary and how large it may be (seed 000).

The newest `keep_last` turns stay verbatim; everything older is folded, an earlier
summary always first (dropping it would forget every turn it stands for). The summary's
token cap (summary_tokens) is the budget minus the kept turns. The planner refuses (None)
rather than cut a kept turn or ask for a summary of zero tokens, which is a deletion.
"""

from __future__ import annotations

from collections.abc import Sequence

SUMMARY_LABEL = "summary"

Plan = tuple[list[str], list[str], int]  # (fold, keep, summary_tokens)


def plan_compaction(turns: Sequence[tuple[str, int]], budget: int, keep_last: int) -> Plan | None:
    """turns: [(label, tokens)], oldest first; a first "summary" label is an earlier summary.

    Returns (fold, keep, summary_tokens), or ([], every label, 0) when the history already fits, or
    None when nothing can be folded or the kept turns leave no room for a summary.
    """
    labels = [label for label, _ in turns]
    if sum(tokens for _, tokens in turns) <= budget:
        return ([], labels, 0)  # fits: no summariser call, no cache write
    first = 1 if labels and labels[0] == SUMMARY_LABEL else 0
    cut = len(turns) - min(max(keep_last, 0), len(turns) - first)  # an old summary is never kept
    summary_tokens = budget - sum(tokens for _, tokens in turns[cut:])
    if cut == 0 or summary_tokens <= 0:
        return None
    return (labels[:cut], labels[cut:], summary_tokens)
