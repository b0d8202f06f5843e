"""A cheap estimate of a message's tokens, for the counts that decide nothing.

Counting a new 20 KB tool result with tiktoken costs about 2 ms, twice what a byte relay
spends on the whole request, and tiktoken is itself an estimate of the upstream's
tokenizer that calibration corrects. So a new message of at least ESTIMATE_MIN_BYTES is
first estimated from its JSON's mix of bytes (lower and upper case letters, digits,
spaces, backslashes, other ASCII, non-ASCII: one `bytes.translate` and seven counts, about
4 µs a KB), a linear model fitted to tiktoken's counts of such messages (bench/estimate.py
--fit, on bench/codec.py's corpus of logs, code, JSON and prose). Held out, on the
recorded Claude Code session, it errs by 9% at the median and 31% at worst (bias +6%);
on the corpus's other half by 4-7% and 18% (bench/RESULTS.md, "estimate.py").

Exact counts (tiktoken, counted once and cached) decide where a mistake would cost: the
planner asks for them when the window or a fold's threshold lies within ESTIMATE_ERROR of
the estimated messages, and before any fold (proxy/core/planner.py, `Recount`). Short of
where folds are planned, the offload step is the estimate's to decide: a working set that
offloads hovers at its trigger, and a wrong call stubs a result a turn early or late
(bench/offload_estimate.py: about one request in eight on the recorded session). Text
whose mix of bytes lies outside the mix the model was fitted on (base64, minified JSON,
CJK, runs of spaces...) is not estimated: it is counted exactly.
"""

from __future__ import annotations

import math

# Bytes of a message's JSON from which it is estimated rather than counted (under it the
# model's constant term is a large share of the count, and counting it costs little).
ESTIMATE_MIN_BYTES = 4096
# The relative error the planner allows the estimate (the worst seen held out: 0.31).
ESTIMATE_ERROR = 0.35

# Byte classes: 1 lower case, 2 upper case, 3 digit, 4 space, 5 backslash (JSON escapes),
# 6 non-ASCII, 7 other ASCII (punctuation, controls).
CLASSES = 7
NON_ASCII = 6
_TABLE = bytes(
    NON_ASCII if b >= 128
    else 1 if chr(b).islower()
    else 2 if chr(b).isupper()
    else 3 if chr(b).isdigit()
    else 4 if b == 0x20
    else 5 if b == 0x5C
    else 7
    for b in range(256)
)  # fmt: skip

# Tokens = INTERCEPT + sum of COEFFICIENTS[class] * bytes of that class (bench/estimate.py
# --fit; relative least squares).
INTERCEPT = -65.8544
COEFFICIENTS = (0.2623, 0.2779, 0.7012, 0.0103, 0.4025, 1.0524, 0.3930)
# Each class's share of the bytes in the fitted messages (min, max): outside, no estimate.
MIX = (
    (0.322, 0.802),
    (0.000, 0.403),
    (0.000, 0.338),
    (0.031, 0.507),
    (0.000, 0.138),
    (0.000, 0.010),
    (0.003, 0.236),
)


def byte_classes(data: bytes) -> list[int]:
    """How many bytes of each class (CLASSES of them, in order) `data` holds: every byte is
    of one, so the last class is what the others leave (one pass over the bytes fewer),
    and ASCII bytes (`bytes.isascii`, 15x faster than a count) hold no non-ASCII one."""
    classed = data.translate(_TABLE)
    ascii_only = data.isascii()
    counts = [0 if c == NON_ASCII and ascii_only else classed.count(c) for c in range(1, CLASSES)]
    counts.append(len(data) - sum(counts))
    return counts


def estimate_tokens(data: bytes) -> int | None:
    """The estimated tokens of a message whose JSON is `data`; None when its mix of bytes
    is not one the model was fitted on (count it exactly)."""
    size = len(data)
    if size < ESTIMATE_MIN_BYTES:
        return None
    counts = byte_classes(data)
    for count, (low, high) in zip(counts, MIX, strict=True):
        if not low <= count / size <= high:
            return None
    tokens = INTERCEPT + sum(c * k for c, k in zip(COEFFICIENTS, counts, strict=True))
    return max(1, math.ceil(tokens))


def margin(uncertain: int) -> int:
    """How far estimated tokens may be from their exact count."""
    return math.ceil(uncertain * ESTIMATE_ERROR)
