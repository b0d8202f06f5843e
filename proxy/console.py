"""What the commands say to a person on stderr: one line per mistake or warning."""

from __future__ import annotations

import sys

NAME = "compaction-proxy"
USAGE_ERROR = 2  # the exit status of every mistake in how the command was called or set up


def warn(message: str) -> None:
    print(f"{NAME}: warning: {message}", file=sys.stderr)


def fail(message: str, status: int = USAGE_ERROR) -> int:
    """Say what is wrong in one line; returns the exit status to end with."""
    print(f"{NAME}: {message}", file=sys.stderr)
    return status
