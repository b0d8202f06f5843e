"""Correcting local token estimates with the counts the upstream reports.

cl100k is not Claude's tokenizer, so a model's real input runs at some steady ratio of our
estimate. Each response's usage gives one sample of reported / estimated; the factor is
their running mean until WINDOW samples, then an exponentially weighted mean with weight
1 / WINDOW, so it settles fast and then follows drift without one odd request moving it
far. `reported` should be the total input: input_tokens + cache_creation_input_tokens +
cache_read_input_tokens. Where the factor is stored is the caller's business.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

MIN_FACTOR = 0.5
MAX_FACTOR = 3.0
WINDOW = 20  # samples until the mean turns into an exponentially weighted one


def update_factor(factor: float, samples: int, estimated: int, reported: int) -> tuple[float, int]:
    """The factor and sample count after one (estimated, reported) observation.

    Junk (a non-positive count) leaves both unchanged. A sample's ratio is clamped to
    [MIN_FACTOR, MAX_FACTOR] before it is averaged in, so one absurd sample moves the
    factor at most by (MAX_FACTOR - MIN_FACTOR) / (samples + 1). The returned count
    saturates at WINDOW, so it stays small wherever it is stored.
    """
    factor, samples = _sane(factor, samples)
    if estimated <= 0 or reported <= 0:
        return factor, samples
    ratio = _clamp(reported / estimated)
    weight = 1.0 / min(samples + 1, WINDOW)
    return _clamp(factor + (ratio - factor) * weight), min(samples + 1, WINDOW)


def apply_factor(estimate: int, factor: float) -> int:
    """The corrected estimate, rounded up (better a little early than over the window)."""
    if estimate <= 0:
        return 0
    factor, _ = _sane(factor, 1)
    # The small slack keeps float noise (1000 * 1.1 = 1100.0000000000002) from adding 1.
    return math.ceil(estimate * factor - 1e-9)


def _sane(factor: float, samples: int) -> tuple[float, int]:
    if not math.isfinite(factor) or factor <= 0:
        return 1.0, 0
    return _clamp(factor), min(max(0, samples), WINDOW)


def _clamp(factor: float) -> float:
    return min(MAX_FACTOR, max(MIN_FACTOR, factor))


def sample_ratio(estimated: int, reported: int) -> float | None:
    """One observation's ratio, clamped like update_factor's, or None for junk counts.

    For stores that keep the running mean themselves (atomically, fleet-wide).
    """
    if estimated <= 0 or reported <= 0:
        return None
    return _clamp(reported / estimated)


def answer_sample(estimated: int, reported: int, sent: Mapping[str, Any] | None) -> float | None:
    """What one answer gives calibration: the ratio of the input the upstream reported
    for its first round (all of it: fresh, written, read) to the estimate of what was
    `sent`; None when it gives nothing (no estimate or no usage, or a request with media
    blocks, whose estimate is a flat guess)."""
    if estimated <= 0 or reported <= 0 or sent is None or not calibrates(sent):
        return None
    return _clamp(reported / estimated)


# Blocks the counter can only guess at (a flat charge per image, per PDF page, per file):
# a request holding one says nothing about how text tokenizes.
MEDIA_TYPES = frozenset(
    {"image", "document", "image_url", "input_image", "file", "input_file", "input_audio"}
)
MEDIA_SCAN_LIMIT = 100_000  # blocks looked at; a request with more is not sampled


def calibrates(payload: Mapping[str, Any]) -> bool:
    """Whether a request's reported usage may calibrate text counting: not when it holds
    media blocks (nor when it is too large to look through cheaply)."""
    stack: list[Any] = [payload.get("messages"), payload.get("input"), payload.get("system")]
    seen = 0
    while stack:
        node = stack.pop()
        if isinstance(node, list):
            seen += len(node)
            if seen > MEDIA_SCAN_LIMIT:
                return False
            stack.extend(node)
        elif isinstance(node, Mapping):
            if node.get("type") in MEDIA_TYPES:
                return False
            for field in ("content", "output"):
                inner = node.get(field)
                if isinstance(inner, list):
                    stack.append(inner)
    return True
