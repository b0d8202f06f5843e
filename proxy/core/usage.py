"""What the upstream reported it used: one `Usage` type, and one meter per request.

`Usage` holds an answer's token counts in Anthropic's terms (the wire formats map their
own usage objects onto it: proxy/wire/*). `UsageMeter` collects every upstream answer of
one client request: its own answer (relayed as bytes, or merged over read_result rounds),
each read round, and the summariser calls made for it. Metrics, calibration and budgets
all read the same meter, held by the request's record.

A relayed answer is read from its bytes as they pass, through the request's wire format
(`UsageScan`): only whole lines are looked at, and a line is only parsed when the format
says it may carry usage; a stream's round that never got its final usage was cut (a
disconnect, a broken upstream) and its output is estimated from the text that did arrive.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from enum import Enum
from typing import Any, Protocol

from proxy.core.budget import Amounts
from proxy.core.per_request import per_request

_CHARS_PER_TOKEN = 3  # a cut round's output estimate errs high (text runs ~4)
_CALL_FRAMING = 8  # tokens of a tool call's name, id and markup around its arguments


def call_tokens(arguments_chars: int) -> int:
    """Output tokens a tool call of this many argument characters took to generate (an
    estimate: what the client is not shown when the proxy holds a read_result call)."""
    return _CALL_FRAMING + -(-max(0, arguments_chars) // 4)


_LOOK = 64  # bytes of a line enough to tell whether it matters
# The answer's model, in the head of the line that starts a stream or carries its usage
# (Messages' message_start, Chat's chunks, Responses' response.*): a string value of a
# "model" key (one inside a JSON string has its quotes escaped, so cannot match).
_MODEL = re.compile(rb'"model":\s*"([A-Za-z0-9._:/@+-]{1,128})"')
_MODEL_LOOK = 4096


@per_request
class Usage:
    """Token counts of one upstream answer (or a sum of them)."""

    input_tokens: int = 0  # uncached input
    cache_creation_input_tokens: int = 0  # written to the prompt cache
    cache_read_input_tokens: int = 0  # read from the prompt cache
    output_tokens: int = 0
    cache_creation_1h_tokens: int = 0  # of the written ones, 1-hour entries

    @property
    def total_input(self) -> int:
        return self.input_tokens + self.cache_creation_input_tokens + self.cache_read_input_tokens

    @property
    def empty(self) -> bool:
        return self == _ZERO

    def plus(self, other: Usage) -> Usage:
        return Usage(
            self.input_tokens + other.input_tokens,
            self.cache_creation_input_tokens + other.cache_creation_input_tokens,
            self.cache_read_input_tokens + other.cache_read_input_tokens,
            self.output_tokens + other.output_tokens,
            self.cache_creation_1h_tokens + other.cache_creation_1h_tokens,
        )

    def with_output(self, output: int) -> Usage:
        return Usage(
            self.input_tokens,
            self.cache_creation_input_tokens,
            self.cache_read_input_tokens,
            output,
            self.cache_creation_1h_tokens,
        )

    def as_dict(self) -> dict[str, Any]:
        """Anthropic's usage shape (what budgets and prices read)."""
        out: dict[str, Any] = {
            "input_tokens": self.input_tokens,
            "cache_creation_input_tokens": self.cache_creation_input_tokens,
            "cache_read_input_tokens": self.cache_read_input_tokens,
            "output_tokens": self.output_tokens,
        }
        if self.cache_creation_1h_tokens:
            out["cache_creation"] = {"ephemeral_1h_input_tokens": self.cache_creation_1h_tokens}
        return out

    def cost(self) -> Amounts:
        """What it weighs against a budget (proxy/core/budget.py)."""
        written, hour = self.cache_creation_input_tokens, self.cache_creation_1h_tokens
        hour = min(hour, written)
        weighted = (
            100 * self.input_tokens + 125 * (written - hour) + 200 * hour
            + 10 * self.cache_read_input_tokens
        )  # fmt: skip
        return Amounts(self.total_input, self.output_tokens, -(-weighted // 100))


_ZERO = Usage()


def count(value: object) -> int:
    """A usage figure: a non-negative int, anything else 0."""
    return value if isinstance(value, int) and not isinstance(value, bool) and value > 0 else 0


class LineKind(Enum):
    START = "start"  # a round begins; its input counts (the output comes later)
    END = "end"  # a round's final usage (cumulative: it replaces what START said)


# The lines of an event stream worth a look: each format's usage and text are in its
# `data:` lines, so the rest (`event:` names, comments) are passed over in C. A line is
# found by the newline before it (its one group: the line), which the regex engine
# searches for as a literal: twice as fast as `^` with re.M, tried at every byte.
DATA_LINES = re.compile(rb"\n(data:[^\n]*)")


def lines_starting(*prefixes: bytes) -> re.Pattern[bytes]:
    """A `UsageScan.lines` for a format whose lines that matter start with one of these."""
    return re.compile(rb"\n((?:" + b"|".join(map(re.escape, prefixes)) + rb")[^\n]*)")


class UsageScan(Protocol):
    """How one wire format's answers carry usage, line by line (a wire format is one)."""

    # Finds each line of a stream that may hold usage or carry output text by the newline
    # before it; its one group is the line, whole (from its start to before its newline).
    # A line it passes over has neither.
    lines: re.Pattern[bytes]

    def line_may_matter(self, head: bytes) -> bool:
        """From a line's first bytes: could it hold usage? (Other lines are only looked
        at for their output text, and a long one is skipped, never buffered.)"""
        ...

    def usage_line(self, line: bytes) -> tuple[LineKind, Usage] | None: ...

    def text_chars(self, line: bytes) -> int:
        """Characters of output text the line carries (0 for any other line)."""
        ...

    def body_usage(self, body: Mapping[str, Any]) -> Usage | None:
        """The usage of a whole (non-stream) answer."""
        ...


@dataclass(slots=True)
class _Round:
    usage: Usage = field(default_factory=Usage)
    finished: bool = False  # its final usage arrived
    text_chars: int = 0  # text seen, for a cut round's estimate


class UsageMeter:
    """Every upstream answer of one client request, with what each reported."""

    def __init__(self, scan: UsageScan | None = None) -> None:
        self.scan = scan
        self.rounds: list[_Round] = []
        self.extra: list[Usage] = []  # summariser calls made for this request
        self.seen_answer = False  # some 200 answer's bytes went through
        self.complete = False  # the answer's final usage reached the client (its end)
        self.response_model = ""  # the model the first answer says it came from
        self._carry = b""  # the unfinished last line, from the newline before it
        self._skipping = False  # inside a long line that does not matter

    # -- feeding ---------------------------------------------------------------------

    def round(self, usage: Usage) -> None:
        """A whole answer (or a read round) whose usage is known."""
        self.seen_answer = True
        self.rounds.append(_Round(usage, finished=True))

    def body(self, answer: Mapping[str, Any]) -> None:
        """A whole JSON answer, parsed."""
        self.seen_answer = True
        self.answered_by(answer)
        found = self.scan.body_usage(answer) if self.scan is not None else None
        if found is not None:
            self.rounds.append(_Round(found, finished=True))

    def answered_by(self, answer: Mapping[str, Any] | bytes) -> None:
        """Note the model an answer (a parsed body, or an event's raw bytes) says it came
        from, unless one is known already."""
        if self.response_model:
            return
        if isinstance(answer, bytes):
            found = _MODEL.search(answer, 0, _MODEL_LOOK)
            if found is not None:
                self.response_model = found[1].decode()
            return
        model = answer.get("model")
        if isinstance(model, str):
            self.response_model = model[:128]

    def summariser(self, usage: Usage) -> None:
        self.extra.append(usage)

    def chunk(self, data: bytes) -> None:
        """Bytes of an event-stream answer, cut anywhere."""
        self.seen_answer = True
        scan = self.scan
        if scan is None:
            return
        # Every line the scan finds follows a newline: the first one's is put before it
        # (the unfinished line carried over starts with its own).
        data = (self._carry or b"\n") + data
        self._carry = b""
        start = 0  # the newline before the next line to look at
        if self._skipping:  # the rest of a long line that did not matter
            start = data.find(b"\n", 1)
            if start < 0:
                return
            self._skipping = False
        # Only the lines the format's pattern finds are looked at (the many others, and
        # blank lines, event ends, cost no step of this loop).
        may_matter, text_chars, rounds = scan.line_may_matter, scan.text_chars, self.rounds
        last = data.rfind(b"\n")  # the newline before the unfinished line
        if last > start:
            for line in scan.lines.findall(data, start, last):
                if may_matter(line[:_LOOK]):
                    self._usage(line)
                elif rounds and (chars := text_chars(line)):
                    rounds[-1].text_chars += chars
            start = last
        rest = data[start + 1 :]
        if len(rest) > _LOOK and not may_matter(rest[:_LOOK]):
            self._skipping = True
            self._text(rest)
        elif rest:
            self._carry = data[start:]

    def _text(self, line: bytes) -> None:
        assert self.scan is not None
        chars = self.scan.text_chars(line)
        if chars and self.rounds:
            self.rounds[-1].text_chars += chars

    def _usage(self, line: bytes) -> None:
        """A line that may hold usage."""
        scan = self.scan
        assert scan is not None
        found = scan.usage_line(line)
        if found is None:
            return
        kind, usage = found
        self.answered_by(line)
        self.complete = kind is LineKind.END
        if kind is LineKind.START or not self.rounds or self.rounds[-1].finished:
            self.rounds.append(_Round(usage, finished=kind is LineKind.END))
            return
        current = self.rounds[-1]
        # A final count replaces what the round's start announced, field by field where
        # the end gives one (Anthropic's message_delta may omit input counts).
        current.usage = _overlay(current.usage, usage)
        current.finished = True

    # -- reading ---------------------------------------------------------------------

    @property
    def first_round(self) -> Usage | None:
        return self.rounds[0].usage if self.rounds else None

    def total(self) -> Usage:
        """Every round's usage summed (a cut round as reported so far)."""
        rounds = self.rounds
        if len(rounds) == 1:  # (nearly every answer: its one round's, no sum to make)
            return rounds[0].usage
        out = _ZERO
        for r in rounds:
            out = out.plus(r.usage)
        return out

    def cost(self, reserved: Amounts) -> Amounts:
        """What this request used against a budget. A cut round's output is estimated
        from its text, capped at the reserved output; an answer that went through with
        no usage at all costs its whole reservation (nothing better is known)."""
        total = reserved if self.seen_answer and not self.rounds else Amounts()
        for r in self.rounds:
            amounts = r.usage.cost()
            if not r.finished:
                guess = -(-r.text_chars // _CHARS_PER_TOKEN)
                output = min(max(amounts.output, guess), max(reserved.output, amounts.output))
                amounts = Amounts(amounts.input, output, amounts.weighted)
            total = total.plus(amounts)
        for usage in self.extra:
            total = total.plus(usage.cost())
        return total


def _overlay(start: Usage, end: Usage) -> Usage:
    return Usage(
        end.input_tokens or start.input_tokens,
        end.cache_creation_input_tokens or start.cache_creation_input_tokens,
        end.cache_read_input_tokens or start.cache_read_input_tokens,
        end.output_tokens,
        end.cache_creation_1h_tokens or start.cache_creation_1h_tokens,
    )
