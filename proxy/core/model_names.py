"""Model names a request may carry: bounded, so no client can grow the proxy's memory or
its store with them.

A model name keys per-model state (calibration factors in memory and in Redis, policy
lookups, log fields). Names are checked when a request is read: at most MAX_CHARS
characters from a small set that covers every provider's naming (`claude-sonnet-4-5`,
`ft:gpt-4o-mini:org:name:id`, `anthropic/claude-3.5-sonnet`, `claude@20240620`,
`name[1m]`); anything else is refused with 400 before it costs anything. Store keys
never hold the name itself, only `model_digest(name)`.
"""

from __future__ import annotations

import hashlib
import re

MAX_CHARS = 256
_NAME = re.compile(r"[A-Za-z0-9._:/@+=\[\]-]+")


def model_problem(value: object) -> str | None:
    """Why `value` is not an acceptable model name, or None."""
    if not isinstance(value, str):
        return f"model: must be a string, got {type(value).__name__}"
    if len(value) > MAX_CHARS:
        return f"model: at most {MAX_CHARS} characters, got {len(value)}"
    if _NAME.fullmatch(value) is None:
        return "model: letters, digits and . _ : / @ + = [ ] - only"
    return None


def model_digest(model: str) -> str:
    """A fixed-size stand-in for a model name in store keys."""
    return hashlib.blake2b(model.encode(), digest_size=12).hexdigest()
