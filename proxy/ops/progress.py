"""A small progress bar on stderr: redrawn in place on a terminal, a few lines otherwise."""

from __future__ import annotations

import sys
import time
from typing import TextIO


class Progress:
    def __init__(self, total: int, label: str = "", stream: TextIO | None = None) -> None:
        self.total = max(total, 0)
        self.label = label
        self.stream = stream or sys.stderr
        self.done = 0
        self.started = time.monotonic()
        self._tty = self.stream.isatty()
        self._last_line = -1  # the last tenth written when not on a terminal

    def _line(self, note: str) -> str:
        width = 30
        share = self.done / self.total if self.total else 1.0
        filled = int(width * share)
        bar = "#" * filled + "-" * (width - filled)
        elapsed = time.monotonic() - self.started
        line = f"{self.label} [{bar}] {self.done}/{self.total} {elapsed:5.1f}s"
        return f"{line} {note}" if note else line

    def advance(self, note: str = "") -> None:
        self.done += 1
        if self._tty:
            self.stream.write("\r\x1b[K" + self._line(note))
            self.stream.flush()
            return
        tenth = int(10 * self.done / self.total) if self.total else 10
        if tenth != self._last_line or self.done == self.total:
            self._last_line = tenth
            self.stream.write(self._line(note) + "\n")
            self.stream.flush()

    def print_above(self, line: str, stream: TextIO) -> None:
        """Print a line to `stream` (say stdout) without garbling the bar: on a terminal
        the bar's line is cleared first, and the next advance() draws it again below."""
        if self._tty:
            self.stream.write("\r\x1b[K")
            self.stream.flush()
        print(line, file=stream, flush=True)

    def close(self) -> None:
        if self._tty:
            self.stream.write("\n")
            self.stream.flush()
